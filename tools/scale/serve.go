package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"github.com/allocd/allocd/cmd/allocd/daemon"
	"github.com/allocd/allocd/internal/etcd/embedded"
)

// serveMain is `scale serve`: allocd as cmd/allocd runs it (daemon.Start, fsync on),
// with its flags (--pprof-address among them: the profiles), until SIGTERM or SIGKILL.
func serveMain(args []string) int {
	fs := flag.NewFlagSet("scale serve", flag.ExitOnError)
	cfg := daemon.DefaultConfig()
	cfg.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	d, err := daemon.Start(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale serve:", err)
		return 1
	}
	select {
	case <-ctx.Done():
	case <-waitChan(d):
	}
	d.Close()
	return 0
}

func waitChan(d *daemon.Daemon) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- d.Wait() }()
	return ch
}

// etcdMain is `scale etcd`: the embedded etcd alone (fsync on), on a data directory
// allocd wrote, until SIGTERM.
func etcdMain(args []string) int {
	fs := flag.NewFlagSet("scale etcd", flag.ExitOnError)
	var c embedded.Config
	fs.StringVar(&c.Name, "name", "allocd", "member name (allocd's embedded member is allocd)")
	fs.StringVar(&c.Dir, "data-dir", "", "data directory")
	fs.StringVar(&c.ClientURL, "client-url", "", "client URL")
	fs.StringVar(&c.PeerURL, "peer-url", "", "peer URL")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the start (until ready) to this file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "scale etcd:", err)
			return 1
		}
		pprof.StartCPUProfile(f)
		defer f.Close()
	}
	e, err := embedded.Start(ctx, c)
	if *cpuprofile != "" {
		pprof.StopCPUProfile()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale etcd:", err)
		return 1
	}
	fmt.Println("ready")
	select {
	case <-ctx.Done():
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "scale etcd:", err)
	}
	e.Close()
	return 0
}
