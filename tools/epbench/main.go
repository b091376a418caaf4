package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

type options struct {
	w                  workload
	churnRate          int
	churnFor           time.Duration
	runs               int
	allocd, baseline   string
	profileDir         string
	syncProfileSeconds int
	keep               bool
}

func (o options) profilePath(dir, kind string) string {
	if o.profileDir == "" {
		return ""
	}
	return filepath.Join(o.profileDir, filepath.Base(dir)+"-"+kind+".pprof")
}

func main() {
	var o options
	flag.IntVar(&o.w.services, "services", 10000, "Services (100 a namespace)")
	flag.IntVar(&o.w.podsPerSvc, "pods-per-service", 10, "Pods of each Service")
	flag.IntVar(&o.w.nodes, "nodes", 500, "Nodes the Pods are spread over")
	flag.IntVar(&o.w.zones, "zones", 3, "zones the Nodes are spread over")
	flag.IntVar(&o.churnRate, "churn-rate", 1000, "readiness flips a second")
	flag.DurationVar(&o.churnFor, "churn", 60*time.Second, "how long the flips go on")
	flag.IntVar(&o.runs, "runs", 1, "runs of each binary (medians reported)")
	flag.StringVar(&o.allocd, "allocd", "",
		"the allocd binary to measure (default: built from this module's ./cmd/allocd)")
	flag.StringVar(&o.baseline, "baseline", "",
		"a second allocd binary, run alternately with the first: medians of both and ratios")
	flag.StringVar(&o.profileDir, "profile-dir", "",
		"save allocd's CPU profiles (sync, churn) and heap profiles (after the sync, at the end) of "+
			"each run here (allocd needs --pprof-address)")
	flag.IntVar(&o.syncProfileSeconds, "sync-profile-seconds", 10,
		"length of the CPU profile taken from the start of the pushes")
	flag.BoolVar(&o.keep, "keep", false, "keep each run's directory (etcd data, allocd.log)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "epbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	tmp, err := os.MkdirTemp("", "epbench-")
	if err != nil {
		return err
	}
	defer func() {
		if !o.keep {
			os.RemoveAll(tmp)
		}
	}()
	if o.allocd == "" {
		if o.allocd, err = buildAllocd(ctx, tmp); err != nil {
			return err
		}
	}
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return err
		}
	}
	bins := []string{o.allocd}
	if o.baseline != "" {
		bins = append(bins, o.baseline)
	}
	host, _ := os.Hostname()
	fmt.Printf("epbench %s on %s: %d cores (GOMAXPROCS %d), %s/%s, %s\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"),
		host, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, runtime.Version())
	fmt.Printf("%d Services, %d Pods (%d each) on %d Nodes in %d zones; "+
		"churn %d flips/s for %v; %d run(s) of %v\n",
		o.w.services, o.w.services*o.w.podsPerSvc, o.w.podsPerSvc, o.w.nodes, o.w.zones, o.churnRate,
		o.churnFor,
		o.runs, bins)
	res := make([][]result, len(bins))
	for i := range o.runs {
		for b, bin := range bins {
			dir := filepath.Join(tmp, fmt.Sprintf("run%d-%c", i+1, 'A'+b))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			load0 := loadAvg()
			r, err := runOnce(ctx, o, bin, dir)
			if err != nil {
				return fmt.Errorf("run %d of %s: %w (its directory: %s)", i+1, bin, err, keepOnError(tmp, &o))
			}
			fmt.Printf("run %d %c: sync %.2fs/%.2fs, p99 %.1f/%.1f ms, heap %.0f B/pod; "+
				"load average %s before, %s after\n",
				i+1, 'A'+b, r.syncEps.Seconds(), r.syncSlices.Seconds(), ms(r.epP99), ms(r.slP99),
				r.heapPerPod(),
				load0, loadAvg())
			res[b] = append(res[b], r)
		}
	}
	printTable(os.Stdout, res)
	return nil
}

// loadAvg is the machine's 1-minute load average (other work shares its cores).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// keepOnError keeps the runs' directories of a failed run for a look at allocd.log.
func keepOnError(tmp string, o *options) string {
	o.keep = true
	return tmp
}
