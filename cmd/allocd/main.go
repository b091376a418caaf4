// Command allocd serves the allocd.v1 API: ClusterIP and NodePort allocation, master
// leases and the kubernetes Service's endpoints, and the repair loop, all kept in etcd.
// With no --etcd-servers it runs an embedded etcd in --data-dir.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	etcdversion "go.etcd.io/etcd/api/v3/version"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/allocd/allocd/internal/daemon"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "health" {
		return health(args[1:], stdout, stderr)
	}
	cfg := daemon.DefaultConfig()
	fs := flag.NewFlagSet("allocd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.RegisterFlags(fs)
	showVersion := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {} // a bad flag gets one line, below; --help gets the groups
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			daemon.Usage(stdout, fs)
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
		fmt.Fprintf(stdout, "allocd %s\ngo %s\netcd client %s\n", buildVersion(), runtime.Version(), etcdversion.Version)
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
	if err := fs.Parse(args); err != nil {
		return 2
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
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
func oneLine(err error) string {
	s := err.Error()
	out := make([]rune, 0, len(s))
	for _, r := range s {
		if r == '\n' {
			out = append(out, ';', ' ')
			continue
		}
		out = append(out, r)
	}
	return string(out)
}
