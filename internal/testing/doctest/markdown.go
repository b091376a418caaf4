package doctest

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// Files returns README.md and every markdown file under docs/ of the repository at
// root, as slash-separated paths relative to root, sorted.
func Files(root string) ([]string, error) {
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".md") {
			return err
		}
		rel, err := filepath.Rel(root, p)
		files = append(files, filepath.ToSlash(rel))
		return err
	})
	sort.Strings(files)
	return files, err
}

// Block is a marked block of a markdown file: the text between <!-- Name:begin --> and
// <!-- Name:end -->.
type Block struct {
	Name string
	File string
	Line int // of the begin marker, from 1
	Body string
}

// marker matches a block's begin or end comment, with any spacing inside the comment,
// so that a marker mistyped that way is still found (and must be claimed).
var marker = regexp.MustCompile(`<!--\s*([A-Za-z0-9_.-]+):(begin|end)\s*-->`)

// Blocks returns the marked blocks of text, the content of file, and what is wrong
// with its markers: an end without a begin, a begin without an end, a block inside
// another, a name twice. A marker in a code span or a code block is text, not a marker.
func Blocks(file, text string) ([]Block, []error) {
	var blocks []Block
	var errs []error
	var open *Block
	start := 0
	seen := map[string]bool{}
	for _, m := range marker.FindAllStringSubmatchIndex(maskCode(text), -1) {
		name, kind := text[m[2]:m[3]], text[m[4]:m[5]]
		line := strings.Count(text[:m[0]], "\n") + 1
		switch {
		case kind == "begin" && open != nil:
			errs = append(errs,
				fmt.Errorf("%s:%d: %s begins inside %s (line %d)", file, line, name, open.Name, open.Line))
		case kind == "begin":
			open, start = &Block{Name: name, File: file, Line: line}, m[1]
		case open == nil || open.Name != name:
			errs = append(errs, fmt.Errorf("%s:%d: %s ends where it did not begin", file, line, name))
		default:
			open.Body = text[start:m[0]]
			if seen[name] {
				errs = append(errs, fmt.Errorf("%s:%d: a second block %s", file, line, name))
			}
			seen[name] = true
			blocks = append(blocks, *open)
			open = nil
		}
	}
	if open != nil {
		errs = append(errs, fmt.Errorf("%s:%d: %s has no end marker", file, open.Line, open.Name))
	}
	return blocks, errs
}

// maskCode returns text with its code blocks and code spans blanked out, every byte
// but the line ends a space, so that offsets into it are offsets into text.
func maskCode(text string) string {
	lines := strings.Split(text, "\n")
	blank := func(s string) string { return strings.Repeat(" ", len(s)) }
	fence := ""
	for i, line := range lines {
		t := strings.TrimLeft(line, " ")
		switch {
		case fence == "" && (strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~")):
			fence, lines[i] = t[:3], blank(line)
		case fence != "":
			if strings.HasPrefix(t, fence) {
				fence = ""
			}
			lines[i] = blank(line)
		default:
			lines[i] = codeSpan.ReplaceAllStringFunc(line, blank)
		}
	}
	return strings.Join(lines, "\n")
}

// Replace returns text with the body of its block name replaced by body.
func Replace(text, name, body string) (string, error) {
	begin, end := "<!-- "+name+":begin -->", "<!-- "+name+":end -->"
	i := strings.Index(text, begin)
	j := strings.Index(text, end)
	if i < 0 || j < i {
		return "", fmt.Errorf("no block %s", name)
	}
	return text[:i+len(begin)] + body + text[j:], nil
}

// Step is one command of a block and the output the doc shows for it.
type Step struct {
	Cmd  string
	Want string
	// Varies is set by a command that ends in "  # addresses vary": the addresses and
	// ports allocd picks are masked when its output is compared.
	Varies bool
}

// consoleLines calls f for each line of the ```console blocks of body with what the
// line is: a command's first line, a continuation of it, an output line, or the fence
// that closes the block (every other line is "text").
func consoleLines(body string, f func(line, kind string)) {
	in, cont := false, false
	for _, line := range strings.Split(body, "\n") {
		kind := "text"
		switch {
		case !in && strings.HasPrefix(line, "```console"):
			in = true
		case in && strings.HasPrefix(line, "```"):
			in, kind = false, "close"
		case in && cont:
			kind = "cont"
		case in && strings.HasPrefix(line, "$ "):
			kind = "cmd"
		case in:
			kind = "output"
		}
		cont = (kind == "cmd" || kind == "cont") && strings.HasSuffix(line, "\\")
		f(line, kind)
	}
}

// Steps reads the commands of body's ```console blocks.
func Steps(body string) []Step {
	var steps []Step
	consoleLines(body, func(line, kind string) {
		n := len(steps) - 1
		switch kind {
		case "cmd":
			steps = append(steps, Step{Cmd: strings.TrimPrefix(line, "$ ")})
		case "cont":
			steps[n].Cmd += "\n" + line
		case "output":
			if n >= 0 {
				steps[n].Want += line + "\n"
			}
		}
	})
	for i := range steps {
		if c, _, ok := strings.Cut(steps[i].Cmd, "  # addresses vary"); ok {
			steps[i].Cmd, steps[i].Varies = c, true
		}
	}
	return steps
}

// Rewrite returns body with the output of its i-th command replaced by outputs[i].
func Rewrite(body string, outputs []string) string {
	var b strings.Builder
	n, pending := -1, false
	emit := func() {
		if pending && n < len(outputs) && outputs[n] != "" {
			b.WriteString(outputs[n])
			if !strings.HasSuffix(outputs[n], "\n") {
				b.WriteString("\n")
			}
		}
		pending = false
	}
	consoleLines(body, func(line, kind string) {
		switch kind {
		case "output":
			return
		case "cmd":
			emit()
			n, pending = n+1, true
		case "close":
			emit()
		}
		b.WriteString(line + "\n")
	})
	return strings.TrimSuffix(b.String(), "\n")
}
