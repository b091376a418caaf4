package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// massOptions are the flags of `scale massrelease`.
type massOptions struct {
	owners     int
	allocators int
	before     time.Duration
	after      time.Duration
	prefix     string
}

// massReleaseMain is `scale massrelease`: a namespace deleted. It fills allocd (its
// embedded etcd, fsync on) with -owners owners of one ClusterIP each, then releases
// them all at once from -clients goroutines while -allocators goroutines keep
// allocating (one ClusterIP for a new owner per call, released at once), and prints,
// per 1-s window, the Allocates that succeeded, the owners released so far, the
// records left of the owners filled (tombstones once released), the tombstones' index
// keys (the cycles' too), and etcd's database (the file, and the part in use); until
// the released owners' tombstones are collected and the file has shrunk to half its
// peak (allocd's compaction and defragmentation), or -after past the collection.
func massReleaseMain(args []string) int {
	fs := flag.NewFlagSet("scale massrelease", flag.ExitOnError)
	var o options
	var m massOptions
	fs.IntVar(&m.owners, "owners", 100_000, "owners filled, then released at once")
	fs.IntVar(&o.clients, "clients", 64, "goroutines that fill, and that release")
	fs.IntVar(&m.allocators, "allocators", 16, "goroutines that keep allocating meanwhile")
	fs.DurationVar(&m.before, "before", 5*time.Second, "how long they allocate before the release")
	fs.DurationVar(&m.after, "after", 3*time.Minute,
		"how long to wait, once the tombstones are collected, for the database to shrink back")
	fs.StringVar(&o.cidr, "cidr", "10.0.0.0/12", "--service-cluster-ip-range")
	fs.StringVar(&o.logLevel, "log-level", "warn", "allocd's --log-level")
	fs.StringVar(&m.prefix, "etcd-prefix", "/allocd", "allocd's --etcd-prefix (its default)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := massRelease(context.Background(), o, m, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "scale massrelease:", err)
		return 1
	}
	return 0
}

// massSample is one 1-s window of a mass release.
type massSample struct {
	at                 time.Duration // since the release began (negative: before it)
	allocs, released   int64
	tombstones         int64 // index keys: the mass release's and the cycles'
	records            int64 // owner records of the owners filled (tombstones once released)
	dbSize, dbSizeUsed int64
}

func massRelease(ctx context.Context, o options, m massOptions, w io.Writer) error {
	dir, err := os.MkdirTemp("", "allocd-massrelease-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	s, err := newStack(dir, o)
	if err != nil {
		return err
	}
	defer s.stop()
	if _, err := s.startAllocd(ctx, ""); err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + s.etcdClient},
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	f := newFiller(o.clients)
	defer f.close()
	fmt.Fprintf(w, "allocd mass release: %d owners, %d releasing and %d allocating clients; "+
		"load average %s\n", m.owners, o.clients, m.allocators, loadAvg())
	start := time.Now()
	if err := f.fill(ctx, s.grpcAddr, m.owners); err != nil {
		return err
	}
	fmt.Fprintf(w, "filled %d owners in %v; load average %s\n", m.owners,
		time.Since(start).Round(time.Millisecond), loadAvg())
	uids := make([]string, 0, len(f.svcs))
	for _, svc := range f.svcs {
		uids = append(uids, svc.Uid)
	}
	return massWatch(ctx, w, m, f, cli, s.etcdClient, uids)
}

// massWatch releases the owners uids at once, after m.before, while m.allocators
// goroutines keep allocating, and samples every second until the tombstones are
// collected and the database has shrunk (or m.after has passed since).
func massWatch(ctx context.Context, w io.Writer, m massOptions, f *filler, cli *clientv3.Client,
	endpoint string, uids []string) error {
	var allocs, released atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range m.allocators {
		wg.Go(func() { keepAllocating(ctx, f, g, stop, &allocs) })
	}
	defer func() { close(stop); wg.Wait() }()
	begin := time.Now().Add(m.before) // the release's start
	var relDone chan error
	var samples []massSample
	var relTook, collectedAt time.Duration
	lastAllocs := allocs.Load()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	peakDB := int64(0)
	for {
		select {
		case err := <-relDone:
			if err != nil {
				return err
			}
			relTook, relDone = time.Since(begin), nil
			continue
		case <-tick.C:
		}
		if relDone == nil && relTook == 0 && !time.Now().Before(begin) {
			begin, relDone = time.Now(), make(chan error, 1)
			go func() { relDone <- releaseCounting(ctx, f, uids, &released) }()
		}
		sm, err := sampleMass(ctx, cli, m.prefix, endpoint)
		if err != nil {
			return err
		}
		a := allocs.Load()
		sm.at, sm.allocs, sm.released = time.Since(begin), a-lastAllocs, released.Load()
		lastAllocs = a
		samples = append(samples, sm)
		peakDB = max(peakDB, sm.dbSize)
		fmt.Fprintf(w, "t=%6.1fs allocates %5d/s released %6d records %6d tombstones %6d db %s (in use %s)\n",
			sm.at.Seconds(), sm.allocs, sm.released, sm.records, sm.tombstones, mib(sm.dbSize),
			mib(sm.dbSizeUsed))
		if collectedAt == 0 && relTook != 0 && sm.records == 0 {
			collectedAt = sm.at
		}
		if collectedAt != 0 && (sm.at-collectedAt > m.after || sm.dbSize < peakDB/2) {
			break
		}
	}
	printMassSummary(w, samples, relTook, collectedAt, peakDB)
	return nil
}

// keepAllocating allocates one ClusterIP for a new owner and releases it, one owner
// after another, until stop closes, counting the Allocates that succeed in ok: the
// store's live data stays as it is, its history grows, and every cycle leaves a
// tombstone.
func keepAllocating(ctx context.Context, f *filler, g int, stop <-chan struct{}, ok *atomic.Int64) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		owner := &allocdv1.Owner{Namespace: "keep", Name: fmt.Sprintf("keep-%d-%d", g, i)}
		owner.Uid = owner.Name
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := f.alloc(g).Allocate(cctx, &allocdv1.AllocateRequest{Owner: owner})
		if err == nil {
			ok.Add(1)
			_, _ = f.alloc(g).Release(cctx, &allocdv1.ReleaseRequest{Owner: owner})
		}
		cancel()
	}
}

// releaseCounting is filler.release, counting the owners released in n.
func releaseCounting(ctx context.Context, f *filler, uids []string, n *atomic.Int64) error {
	const chunk = 1000
	for i := 0; i < len(uids); i += chunk {
		part := uids[i:min(i+chunk, len(uids))]
		if err := f.release(ctx, part); err != nil {
			return err
		}
		n.Add(int64(len(part)))
	}
	return nil
}

// fillPrefix begins the UIDs of the owners filler.fill makes.
const fillPrefix = "s-"

// sampleMass reads the tombstones waiting, the records left of the owners filled, and
// etcd's database sizes.
func sampleMass(ctx context.Context, cli *clientv3.Client, prefix, endpoint string) (massSample, error) {
	var sm massSample
	p := strings.TrimSuffix(prefix, "/")
	resp, err := cli.Get(ctx, p+"/tombstones/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return sm, err
	}
	sm.tombstones = resp.Count
	if resp, err = cli.Get(ctx, p+"/owners/"+fillPrefix, clientv3.WithPrefix(),
		clientv3.WithCountOnly()); err != nil {
		return sm, err
	}
	sm.records = resp.Count
	st, err := cli.Status(ctx, "http://"+endpoint)
	if err != nil {
		return sm, err
	}
	sm.dbSize, sm.dbSizeUsed = st.DbSize, st.DbSizeInUse
	return sm, nil
}

func printMassSummary(w io.Writer, samples []massSample, relTook, collectedAt time.Duration, peakDB int64) {
	var rates []int64
	var before, n int64
	for _, sm := range samples {
		switch {
		case sm.at <= 0:
			before, n = before+sm.allocs, n+1
		case collectedAt == 0 || sm.at <= collectedAt:
			rates = append(rates, sm.allocs)
		}
	}
	sort.Slice(rates, func(i, j int) bool { return rates[i] < rates[j] })
	q := func(p float64) int64 {
		if len(rates) == 0 {
			return 0
		}
		return rates[int(p*float64(len(rates)-1))]
	}
	maxT := int64(0)
	for _, sm := range samples {
		maxT = max(maxT, sm.tombstones)
	}
	last := samples[len(samples)-1]
	fmt.Fprintf(w, "\nAllocate before the release %d/s; released in %s; tombstones collected at %s (peak %d "+
		"waiting); Allocate per 1-s window until then: min %d, median %d, max %d; db peak %s, at the end %s "+
		"(in use %s) at %s; load average %s\n",
		before/max(n, 1), secs(relTook), secs(collectedAt), maxT, q(0), q(0.5), q(1), mib(peakDB),
		mib(last.dbSize), mib(last.dbSizeUsed), secs(last.at), loadAvg())
}

// loadAvg is the machine's load average (1, 5, 15 minutes).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
