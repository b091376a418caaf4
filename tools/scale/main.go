package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

type options struct {
	points        []int
	cidr          string
	clients       int
	rateDuration  time.Duration
	profileAt     int
	profileDir    string
	dir           string
	keep          bool
	repair        bool
	logLevel      string
	abFull        string
	abVs, abEnv   string
	abArgs        string
	abShare       bool
	abProfile     bool
	abRounds      int
	settle        time.Duration
	restarts      int
	restartTrace  bool
	restartChurn  time.Duration
	shareDuration time.Duration
}

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "serve":
			os.Exit(serveMain(os.Args[2:]))
		case "etcd":
			os.Exit(etcdMain(os.Args[2:]))
		case "massrelease":
			os.Exit(massReleaseMain(os.Args[2:]))
		case "held":
			os.Exit(heldMain(os.Args[2:]))
		}
	}
	var o options
	var points string
	flag.StringVar(&points, "points", "10000,100000,300000,1000000",
		"allocation counts to measure at (the empty store is measured first)")
	flag.StringVar(&o.cidr, "cidr", "10.0.0.0/11",
		"--service-cluster-ip-range (a /11: room for 1M allocations and the rate runs)")
	flag.IntVar(&o.clients, "clients", 64, "concurrent client goroutines (fill and rate runs)")
	flag.DurationVar(&o.rateDuration, "rate-duration", 5*time.Minute,
		"length of each rate run (Allocate+Release cycles: every compaction in the window counts)")
	flag.DurationVar(&o.shareDuration, "share-duration", 20*time.Second, "length of each point's run of "+
		"Allocates measured against its controls, a held call and etcd's floor (0: none)")
	flag.IntVar(&o.profileAt, "profile-at", 1_000_000,
		"take CPU and heap profiles of allocd during the rate run at this point (0: none)")
	flag.StringVar(&o.profileDir, "profile-dir", ".", "where the profiles go")
	flag.StringVar(&o.dir, "dir", "", "work directory (default: a new temporary one, removed at the end)")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory")
	flag.BoolVar(&o.repair, "repair", true, "measure a repair pass at each point")
	flag.StringVar(&o.logLevel, "log-level", "warn", "allocd's --log-level")
	flag.StringVar(&o.abFull, "ab-full", "", "instead of the points: Allocate on an empty store and on "+
		"the store in this work directory (an earlier -dir, kept), alternating")
	flag.StringVar(&o.abVs, "ab-vs", "", "instead of the points: the store in -dir served by this program "+
		"and by this other build of scale, alternating")
	flag.StringVar(&o.abEnv, "ab-env", "", "instead of the points: the store in -dir served with these "+
		"variables in allocd's environment (GOGC=200,GOMEMLIMIT=3GiB) and without, alternating")
	flag.StringVar(&o.abArgs, "ab-args", "", "with -ab-vs or -ab-env, or alone with -dir: these arguments "+
		"added to this side's allocd command line (\"--log-level info\"), the other side without")
	flag.BoolVar(&o.abShare, "ab-share", false, "A/B rounds measure Allocate's CPU against its controls "+
		"(-share-duration, as at each point) instead of rate runs")
	flag.IntVar(&o.abRounds, "ab-rounds", 3, "rounds of -ab-full, -ab-vs or -ab-env")
	flag.BoolVar(&o.abProfile, "ab-profile", false, "CPU and heap profiles of every A/B rate run, in "+
		"-profile-dir (cpu-ab<round>-<side>.pprof)")
	flag.DurationVar(&o.settle, "settle", 0, "wait this long after each fill before the rate run: the "+
		"compactions the fill's writes started end first (0: the rate run follows the fill at once)")
	flag.IntVar(&o.restarts, "restarts", 0, "instead of the points: this many rounds of restarts of the "+
		"store in -dir (an earlier run's, kept), each start profiled (see restart.go)")
	flag.BoolVar(&o.restartTrace, "restart-trace", false, "with -restarts: an execution trace of each start")
	flag.DurationVar(&o.restartChurn, "restart-churn", 0, "with -restarts: this long of Allocate+Release "+
		"cycles before each kill -9 (the checkpoint of the index is then behind, as under load)")
	flag.Parse()
	if o.restarts > 0 {
		if o.dir == "" {
			fail(fmt.Errorf("-restarts needs -dir, the work directory of a run kept with -keep"))
		}
		if err := restartRun(context.Background(), o); err != nil {
			fail(err)
		}
		return
	}
	if o.abFull != "" || o.abVs != "" || o.abEnv != "" || o.abArgs != "" {
		if err := abRun(context.Background(), o); err != nil {
			fail(err)
		}
		return
	}
	for _, s := range strings.Split(points, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			fail(fmt.Errorf("-points: %q is not a positive count", s))
		}
		o.points = append(o.points, n)
	}
	slices.Sort(o.points)
	if err := run(context.Background(), o); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "scale:", err)
	os.Exit(1)
}

func run(ctx context.Context, o options) error {
	dir := o.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "allocd-scale-")
		if err != nil {
			return err
		}
		dir = d
		if !o.keep {
			defer os.RemoveAll(d)
		}
	}
	s, err := newStack(dir, o)
	if err != nil {
		return err
	}
	defer s.stop()
	fmt.Printf("allocd scale: %s, %d clients, rate runs of %v, data in %s\n", o.cidr, o.clients,
		o.rateDuration, dir)
	if _, err := s.startAllocd(ctx, ""); err != nil {
		return err
	}
	var rows []row
	f := newFiller(o.clients)
	defer f.close()
	for _, n := range append([]int{0}, o.points...) {
		start := time.Now()
		if err := f.fill(ctx, s.grpcAddr, n); err != nil {
			return err
		}
		if n > 0 {
			fmt.Printf("filled to %d in %v\n", n, time.Since(start).Round(time.Millisecond))
		}
		r, err := s.measure(ctx, f, n)
		if err != nil {
			return err
		}
		r.print(os.Stdout, len(rows) == 0)
		rows = append(rows, r)
	}
	fmt.Println()
	printTable(os.Stdout, rows)
	return nil
}

// workDirs are the paths of one run.
func workDirs(dir string) (data, logs string) {
	return filepath.Join(dir, "data"), filepath.Join(dir, "logs")
}
