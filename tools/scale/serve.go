package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strings"
	"syscall"
	"time"

	"github.com/allocd/allocd/cmd/allocd/daemon"
	"github.com/allocd/allocd/internal/etcd/embedded"
)

// serveMain is `scale serve`: allocd as cmd/allocd runs it (daemon.Start, fsync on),
// with its flags (--pprof-address among them: the profiles), until SIGTERM or SIGKILL.
// With --scale-start-dir it writes there the start's CPU profile (start-cpu.pprof), its
// block profile (start-block.pprof), with --scale-start-trace its execution trace
// (start-trace.out), and the steps of daemon.Start (phases.txt: a name and seconds per
// line).
func serveMain(args []string) int {
	fs := flag.NewFlagSet("scale serve", flag.ExitOnError)
	cfg := daemon.DefaultConfig()
	cfg.RegisterFlags(fs)
	startDir := fs.String("scale-start-dir", "", "write the start's profiles and steps here")
	startTrace := fs.Bool("scale-start-trace", false, "with --scale-start-dir: an execution trace too")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var prof *startProfile
	if *startDir != "" {
		var err error
		if prof, err = beginStartProfile(*startDir, *startTrace); err != nil {
			fmt.Fprintln(os.Stderr, "scale serve:", err)
			return 1
		}
	}
	d, err := daemon.Start(ctx, cfg)
	if prof != nil {
		if perr := prof.end(d); perr != nil {
			fmt.Fprintln(os.Stderr, "scale serve:", perr)
		}
	}
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

// startProfile profiles daemon.Start.
type startProfile struct {
	dir        string
	cpu, trace *os.File
}

func beginStartProfile(dir string, withTrace bool) (*startProfile, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	p := &startProfile{dir: dir}
	var err error
	if p.cpu, err = os.Create(filepath.Join(dir, "start-cpu.pprof")); err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(p.cpu); err != nil {
		return nil, err
	}
	if withTrace {
		if p.trace, err = os.Create(filepath.Join(dir, "start-trace.out")); err != nil {
			return nil, err
		}
		if err := trace.Start(p.trace); err != nil {
			return nil, err
		}
	}
	runtime.SetBlockProfileRate(int(10 * time.Microsecond))
	return p, nil
}

// end stops the profiles and writes the block profile and d's steps (d nil: Start
// failed).
func (p *startProfile) end(d *daemon.Daemon) error {
	pprof.StopCPUProfile()
	p.cpu.Close()
	if p.trace != nil {
		trace.Stop()
		p.trace.Close()
	}
	f, err := os.Create(filepath.Join(p.dir, "start-block.pprof"))
	if err != nil {
		return err
	}
	defer f.Close()
	if err := pprof.Lookup("block").WriteTo(f, 0); err != nil {
		return err
	}
	runtime.SetBlockProfileRate(0)
	if d == nil {
		return nil
	}
	var b strings.Builder
	for _, ph := range d.StartPhases() {
		fmt.Fprintf(&b, "%s %.3f\n", ph.Name, ph.Took.Seconds())
	}
	return os.WriteFile(filepath.Join(p.dir, "phases.txt"), []byte(b.String()), 0o644)
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
	fs.StringVar(&c.LogLevel, "log-level", "", "etcd's log level (etcd's logs go to stderr; none when empty)")
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
