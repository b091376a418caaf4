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
	"time"

	"github.com/spf13/cobra"
	etcdversion "go.etcd.io/etcd/api/v3/version"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/allocd/allocd/cmd/allocd/cli"
	"github.com/allocd/allocd/cmd/allocd/daemon"
	"github.com/allocd/allocd/tlsfiles"
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
	root.AddCommand(&cobra.Command{
		Use: "health [--grpc-address ADDR] [--timeout D] [--tls-ca-file FILE]",
		Short: "Exit 0 when an allocd answers grpc.health.v1 SERVING " +
			"(the container health check)",
		DisableFlagParsing: true, // its Go flags, as before
		RunE: func(_ *cobra.Command, args []string) error {
			return exit(health(args, stdout, stderr))
		},
	})
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

// health asks an allocd for grpc.health.v1 and exits 0 when it is SERVING: the
// container health check.
func health(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("allocd health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("grpc-address", daemon.DefaultConfig().GRPCAddress, "host:port of the allocd to check")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for an answer")
	useTLS := fs.Bool("tls", false, "use TLS (implied by --tls-ca-file), verifying allocd's certificate "+
		"against the system roots unless --tls-ca-file")
	files := tlsfiles.Files{}
	fs.StringVar(&files.CAFile, "tls-ca-file", "", "PEM CA bundle that allocd's certificate is verified "+
		"against (it must name the host of --grpc-address)")
	fs.StringVar(&files.CertFile, "tls-cert-file", "", "client certificate to present (health needs none)")
	fs.StringVar(&files.KeyFile, "tls-private-key-file", "", "private key of --tls-cert-file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	creds := insecure.NewCredentials()
	if *useTLS || files != (tlsfiles.Files{}) {
		c, err := tlsfiles.NewClient(files)
		if err != nil {
			fmt.Fprintf(stderr, "allocd health: %v\n", err)
			return 2
		}
		defer c.Close()
		creds = c.Credentials()
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		fmt.Fprintf(stderr, "allocd health: %v\n", err)
		return 1
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		fmt.Fprintf(stderr, "allocd health: %s: %v\n", *addr, err)
		return 1
	}
	fmt.Fprintln(stdout, resp.GetStatus())
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
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
