package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/allocd/allocd/cmd/allocd/app"
)

func main() {
	out := flag.String("out", "docs/operators/cli", "directory of the pages; its *.md files are replaced")
	flag.Parse()
	if err := generate(*out); err != nil {
		fmt.Fprintf(os.Stderr, "gendocs: %v\n", err)
		os.Exit(1)
	}
}

// generate writes a page per command of allocd into dir, after removing the pages
// there, so that a command that is gone leaves no page behind.
func generate(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		return err
	}
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			return err
		}
	}
	root := app.NewCommand(io.Discard, io.Discard)
	root.InitDefaultCompletionCmd() // as cli.Execute does when it runs
	if err := describe(root); err != nil {
		return err
	}
	return doc.GenMarkdownTree(root, dir)
}

// describe prepares every command of the tree for the generator: no date line, and a
// command whose flags cobra does not parse gets its --help output as its synopsis.
func describe(cmd *cobra.Command) error {
	cmd.DisableAutoGenTag = true
	if cmd.DisableFlagParsing {
		help, err := helpOf(cmd)
		if err != nil {
			return err
		}
		long := ""
		if cmd.Long != "" {
			long = cmd.Long + "\n\n"
		}
		cmd.Long = fmt.Sprintf("%s`%s --help` prints:\n\n```text\n%s```", long, cmd.CommandPath(), help)
	}
	for _, c := range cmd.Commands() {
		if err := describe(c); err != nil {
			return err
		}
	}
	return nil
}

// helpOf runs allocd with the command's path and --help, and returns what it printed.
func helpOf(cmd *cobra.Command) (string, error) {
	path := strings.Fields(cmd.CommandPath())[1:] // without "allocd"
	var out bytes.Buffer
	app.Run(append(path, "--help"), &out, &out) // a Go flag set's --help exits 2
	if out.Len() == 0 {
		return "", fmt.Errorf("%s --help printed nothing", cmd.CommandPath())
	}
	s := out.String()
	if !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	return s, nil
}
