package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	etcdversion "go.etcd.io/etcd/api/v3/version"

	"github.com/allocd/allocd/cmd/allocd/cli"
	"github.com/allocd/allocd/cmd/allocd/daemon"
)

// version is set at build time with
// -ldflags "-X github.com/allocd/allocd/cmd/allocd/app.version=...".
var version = ""

// Run is allocd: serving with the flags of args when they name no subcommand, else the
// subcommand. It returns the exit code.
func Run(args []string, stdout, stderr io.Writer) int {
	return cli.Execute(context.Background(), NewCommand(stdout, stderr), args, stdout, stderr)
}

// NewCommand returns allocd's root command, whose commands write to stdout and stderr.
// Run executes it with cli.Execute, which adds cobra's completion command.
func NewCommand(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "allocd",
		Short: "etcd-native ClusterIP/NodePort allocator and master-lease service over gRPC",
		// The serving flags are Go flags with their grouped help (daemon.Usage): cobra
		// leaves them to serve, and routes only subcommands.
		DisableFlagParsing:         true,
		Args:                       cobra.ArbitraryArgs,
		SuggestionsMinimumDistance: 2,
	}
	root.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			if s := root.SuggestionsFor(args[0]); len(s) > 0 {
				fmt.Fprintf(stderr, "allocd: unknown command %q; did you mean %q? see allocd --help\n",
					args[0], s[0])
				return exit(2)
			}
		}
		return exit(serve(args, stdout, stderr, func(w io.Writer) { cli.PrintCommands(w, root) }))
	}
	root.AddCommand(cli.Commands()...)
	help := root.HelpFunc()
	root.SetHelpFunc(func(cmd *cobra.Command, args []string) {
		if cmd != root {
			help(cmd, args)
			return
		}
		serve([]string{"--help"}, cmd.OutOrStdout(), cmd.ErrOrStderr(),
			func(w io.Writer) { cli.PrintCommands(w, root) })
	})
	return root
}

// exit turns an exit code into the error that makes cli.Execute return it.
func exit(code int) error {
	if code == 0 {
		return nil
	}
	return cli.ExitCode(code)
}

// serve runs allocd with the serving flags of args until SIGTERM or SIGINT, and returns
// the exit code. --help prints the flag groups and then what commands writes.
func serve(args []string, stdout, stderr io.Writer, commands func(io.Writer)) int {
	cfg := daemon.DefaultConfig()
	fs := flag.NewFlagSet("allocd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.RegisterFlags(fs)
	showVersion := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {} // a bad flag gets one line, below; --help gets the groups
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			daemon.Usage(stdout, fs)
			commands(stdout)
			return 0
		}
		fmt.Fprintf(stderr, "allocd: %v; see allocd --help\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "allocd: unexpected argument %q; see allocd --help\n", fs.Arg(0))
		return 2
	}
	if *showVersion {
		fmt.Fprintf(stdout, "allocd %s\ngo %s\netcd client %s\n", buildVersion(), runtime.Version(),
			etcdversion.Version)
		return 0
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "allocd: %v\n", oneLine(err))
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	d, err := daemon.Start(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return 0 // SIGTERM or SIGINT while starting (waiting for etcd, say)
		}
		fmt.Fprintf(stderr, "allocd: %v\n", oneLine(err))
		return 1
	}
	failed := make(chan error, 1)
	go func() { failed <- d.Wait() }()
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-failed:
	}
	stop()
	if err := d.Close(); err != nil && runErr == nil {
		runErr = err
	}
	if runErr != nil {
		fmt.Fprintf(stderr, "allocd: %v\n", oneLine(runErr))
		return 1
	}
	return 0
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// oneLine joins a multi-line error (errors.Join) into one line.
func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }
