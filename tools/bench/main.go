package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/allocd/allocd/allocator"
	"github.com/allocd/allocd/internal/etcd/embedded"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
	"github.com/allocd/allocd/server"
)

type options struct {
	duration, warmup, baseline time.Duration
	clients, conns, repeat     int
	cidr                       netip.Prefix
	portRange                  allocator.PortRange
	portRunMax, baselineBits   int
	concurrency                int
	cpuprofile, memprofile     string
	dir                        string
	inProcess                  bool
	logLevel                   slog.Level
	cidrRuns                   bool
}

func main() {
	var o options
	var cidr, ports string
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "length of each measured Allocate run")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "warm-up before each kind of call")
	flag.DurationVar(&o.baseline, "baseline-duration", 5*time.Second,
		"length of the Kubernetes-style baseline run")
	flag.IntVar(&o.clients, "clients", 64, "concurrent client goroutines")
	flag.BoolVar(&o.cidrRuns, "cidr-runs", true,
		"measure Allocate with 1,000 ServiceCIDRs (999 full) against one, and the heap of 1,000 /16s")
	flag.IntVar(&o.conns, "conns", 4, "gRPC client connections the goroutines share")
	flag.IntVar(&o.repeat, "repeat", 3, "runs of each measurement (medians reported)")
	flag.StringVar(&cidr, "cidr", "10.0.0.0/8",
		"service cluster IP range of the Allocate runs (2^24 addresses: room for every run)")
	flag.IntVar(&o.baselineBits, "baseline-bits", 20,
		"the Kubernetes-style bitmap has 2^bits bits (20: a /12, 128 KiB, Kubernetes' largest IPv4 range)")
	flag.StringVar(&ports, "node-port-range", "1024-65535", "service node port range of the NodePort run")
	flag.IntVar(&o.portRunMax, "port-run-max", 40000,
		"stop the NodePort run after this many allocations (0 = skip the run)")
	flag.IntVar(&o.concurrency, "commit-concurrency", 0,
		"group-commit transactions in flight (0 = the allocator's default)")
	flag.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the Allocate runs to this file")
	flag.BoolVar(&o.inProcess, "in-process-etcd-client", true, "talk to the embedded etcd through direct "+
		"calls (v3client), as allocd does with its embedded etcd; false: gRPC over loopback, as with "+
		"--etcd-servers")
	flag.StringVar(&o.memprofile, "memprofile", "",
		"write an allocation profile to this file after the Allocate runs")
	flag.TextVar(&o.logLevel, "log-level", slog.LevelInfo, "the allocator's log level (info: a line per "+
		"write, formatted and discarded, as allocd does; warn: none, to measure what the lines cost)")
	flag.StringVar(&o.dir, "dir", "",
		"etcd data directory (default: a new temporary directory, removed at the end)")
	flag.Parse()
	var err error
	if o.cidr, err = netip.ParsePrefix(cidr); err != nil {
		fail(err)
	}
	if o.portRange, err = allocator.ParsePortRange(ports); err != nil {
		fail(err)
	}
	if err := run(context.Background(), o); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func run(ctx context.Context, o options) error {
	env, err := setUp(ctx, o)
	if err != nil {
		return err
	}
	defer env.close()
	fmt.Printf("allocd bench: %d clients over %d connections, embedded etcd with fsync on in %s, "+
		"GOMAXPROCS=%d, NumCPU=%d\n",
		o.clients, o.conns, env.dir, runtime.GOMAXPROCS(0), runtime.NumCPU())

	// 1. The empty call.
	empty := func(ctx context.Context, g, i int) error {
		_, err := env.health(g).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	var r results
	r.empty = measure(ctx, o, "empty call (Health/Check)", empty, o.duration/2)

	// 2. Allocate, one ClusterIP per distinct owner.
	var seq atomic.Int64
	allocIP := func(ctx context.Context, g, i int) error {
		n := seq.Add(1)
		_, err := env.alloc(g).Allocate(ctx,
			&allocdv1.AllocateRequest{Owner: &allocdv1.Owner{Namespace: "bench",
				Name: "svc", Uid: "ip-" + strconv.FormatInt(n, 10)}})
		return err
	}
	stop, err := startProfiles(o)
	if err != nil {
		return err
	}
	r.alloc = measure(ctx, o, "Allocate ClusterIP "+o.cidr.String(), allocIP, o.duration)
	if err := stop(); err != nil {
		return err
	}
	r.batch = histogramMean(env.reg, "allocd_allocator_commit_batch_requests")

	// 1b. The empty call again, now that etcd holds the Allocate runs' keys: the same
	// process state as the Allocate runs (a large etcd heap makes every call's garbage
	// collection dearer), so that both sides of the ratio pay for it.
	r.emptyAfter = measure(ctx, o, "empty call (Health/Check), after the Allocate runs", empty, o.duration/2)

	// 2b. The etcd floor: the same transactions without allocd.
	r.floor = floor(ctx, env.cli, o, max(1, int(r.batch+0.5)))

	// 2c. What a call costs for taking as long as an Allocate: a bare Health server,
	// its Check answered at once and held for Allocate's p50.
	if r.bare, r.held, err = heldCalls(ctx, o, r.alloc.p50); err != nil {
		return err
	}

	// 3. Allocate, one ClusterIP and one NodePort, until the ports would run low.
	if o.portRunMax > 0 {
		r.ports = portRun(ctx, o, env, &seq)
	}

	// 4. The Kubernetes-style baseline on the same etcd.
	if r.k8s, err = baseline(ctx, env.cli, o, 1<<o.baselineBits); err != nil {
		return err
	}
	r.print()
	fmt.Printf("ClusterIPs in use: %d of %d\n", env.a.Ranges()[0].Used, env.a.Ranges()[0].Size)

	// 5. Many ServiceCIDRs against one.
	if o.cidrRuns {
		cr, err := cidrRuns(ctx, o, env)
		if err != nil {
			return err
		}
		cr.print()
	}
	return nil
}

// env is what the runs share: the embedded etcd, the allocator, the gRPC server and
// the client connections.
type env struct {
	dir     string
	cli     *clientv3.Client
	a       *allocator.Allocator
	reg     *prometheus.Registry
	conns   []*grpc.ClientConn
	closers []func()
}

func (e *env) health(i int) healthpb.HealthClient {
	return healthpb.NewHealthClient(e.conns[i%len(e.conns)])
}

func (e *env) alloc(i int) allocdv1.AllocatorServiceClient {
	return allocdv1.NewAllocatorServiceClient(e.conns[i%len(e.conns)])
}

func (e *env) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// setUp starts the embedded etcd, the allocator and the gRPC server, and dials it.
func setUp(ctx context.Context, o options) (*env, error) {
	e := &env{dir: o.dir, reg: prometheus.NewRegistry()}
	ok := false
	defer func() {
		if !ok {
			e.close()
		}
	}()
	if e.dir == "" {
		d, err := os.MkdirTemp("", "allocd-bench-")
		if err != nil {
			return nil, err
		}
		e.closers = append(e.closers, func() { os.RemoveAll(d) })
		e.dir = filepath.Join(d, "etcd")
	}
	ca, err := freeAddr()
	if err != nil {
		return nil, err
	}
	pa, err := freeAddr()
	if err != nil {
		return nil, err
	}
	etcd, err := embedded.Start(ctx, embedded.Config{Name: "bench", Dir: e.dir,
		ClientURL: "http://" + ca, PeerURL: "http://" + pa})
	if err != nil {
		return nil, err
	}
	e.closers = append(e.closers, etcd.Close)
	if o.inProcess {
		e.cli = v3client.New(etcd.Server)
	} else if e.cli, err = clientv3.New(clientv3.Config{Endpoints: []string{"http://" + ca},
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()}); err != nil {
		return nil, err
	}
	e.closers = append(e.closers, func() { e.cli.Close() })
	if err := e.serve(ctx, o); err != nil {
		return nil, err
	}
	ok = true
	return e, nil
}

// serve starts the allocator and the gRPC server and dials o.conns connections.
func (e *env) serve(ctx context.Context, o options) error {
	// The daemon's logger (text handler) at its default level, info (-log-level), into
	// io.Discard: the allocator's per-write lines are formatted, as in production, and
	// dropped.
	log := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: o.logLevel}))
	actx, cancel := context.WithCancel(ctx)
	a, err := allocator.New(actx, e.cli,
		allocator.Config{Prefix: "/allocd", ClusterIPRanges: []netip.Prefix{o.cidr},
			NodePortRange: o.portRange, Logger: log, Registerer: e.reg, CommitConcurrency: o.concurrency})
	if err != nil {
		cancel()
		return err
	}
	e.a = a
	runDone := make(chan error, 1)
	go func() { runDone <- a.Run(actx) }()
	e.closers = append(e.closers, func() { cancel(); <-runDone })

	gs, hs := server.NewGRPCServer(server.Options{Logger: log, Registerer: e.reg})
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	allocdv1.RegisterAllocatorServiceServer(gs, server.NewAllocatorService(a, log))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go func() { _ = gs.Serve(l) }()
	e.closers = append(e.closers, gs.Stop)
	for range o.conns {
		c, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		e.conns = append(e.conns, c)
		e.closers = append(e.closers, func() { c.Close() })
	}
	return nil
}

// startProfiles starts the CPU profile of -cpuprofile; the function returned stops it
// and writes the allocation profile of -memprofile.
func startProfiles(o options) (func() error, error) {
	var cpu *os.File
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, err
		}
		cpu = f
	}
	return func() error {
		if cpu != nil {
			pprof.StopCPUProfile()
			cpu.Close()
		}
		if o.memprofile == "" {
			return nil
		}
		f, err := os.Create(o.memprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		return pprof.Lookup("allocs").WriteTo(f, 0)
	}, nil
}

// portRun allocates one ClusterIP and one NodePort per call, until the ports would
// run low.
func portRun(ctx context.Context, o options, e *env, seq *atomic.Int64) result {
	limit := int64(min(o.portRunMax, o.portRange.Size*8/10))
	var done atomic.Int64
	call := func(ctx context.Context, g, i int) error {
		if done.Add(1) > limit {
			return errStop
		}
		n := seq.Add(1)
		_, err := e.alloc(g).Allocate(ctx,
			&allocdv1.AllocateRequest{Owner: &allocdv1.Owner{Namespace: "bench",
				Name: "svc", Uid: "port-" + strconv.FormatInt(n, 10)}, NodePortCount: 1})
		return err
	}
	o1 := o
	o1.repeat, o1.warmup = 1, 0
	return measure(ctx, o1, fmt.Sprintf("Allocate ClusterIP + NodePort %s (at most %d)", o.portRange, limit),
		call, o.duration)
}

// results are the medians of a run's measurements.
type results struct {
	empty, emptyAfter, alloc, floor, ports, k8s result
	// bare and held: a Health Check on a server without interceptors, answered at
	// once and held for Allocate's p50.
	bare, held result
	batch      float64 // requests per group commit
}

// print prints the table, the ratios and allocd's own share of an Allocate's CPU.
func (r results) print() {
	fmt.Println()
	fmt.Printf("%-58s %9s %10s %10s %10s %7s\n", "", "rate/s", "p50", "p99", "cpu/call", "errors")
	for _, x := range []result{r.empty, r.emptyAfter, r.floor, r.alloc, r.ports, r.k8s, r.bare, r.held} {
		if x.name == "" {
			continue
		}
		fmt.Printf("%-58s %9.0f %10s %10s %10s %7d\n", x.name, x.rate, x.p50.Round(time.Microsecond),
			x.p99.Round(time.Microsecond), x.cpu.Round(100*time.Nanosecond), x.errs)
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	own := r.alloc.cpu - r.emptyAfter.cpu - r.floor.cpu
	fmt.Println()
	fmt.Printf("CPU per call: empty call %.1f µs, etcd floor %.1f µs, Allocate %.1f µs; allocd's own "+
		"share (Allocate - empty - floor) %.1f µs (goal <= 8)\n",
		us(r.emptyAfter.cpu), us(r.floor.cpu), us(r.alloc.cpu), us(own))
	wait := r.held.cpu - r.bare.cpu
	fmt.Printf("of which the cost of a call held as long as an Allocate (held - bare call) %.1f µs; the "+
		"rest, allocd's code, %.1f µs\n",
		us(wait), us(own-wait))
	if r.held.cpu+r.floor.cpu > 0 {
		fmt.Printf("Allocate CPU / (held call + floor): %6.2f   (goal <= 1.10: %.1f µs against %.1f + "+
			"%.1f µs, one run)\n",
			float64(r.alloc.cpu)/float64(r.held.cpu+r.floor.cpu), us(r.alloc.cpu), us(r.held.cpu),
			us(r.floor.cpu))
	}
	fmt.Printf("Allocate / empty call:          %6.2f   (goal >= 0.45; the empty call measured first, on "+
		"an empty etcd)\n", r.alloc.rate/r.empty.rate)
	fmt.Printf("Allocate / empty call after:    %6.2f   (the empty call measured after the Allocate runs, "+
		"on the same etcd)\n", r.alloc.rate/r.emptyAfter.rate)
	fmt.Printf("ceiling of that ratio:          %6.2f   (empty CPU / (empty + floor CPU): an Allocate that "+
		"costs only the call and etcd)\n",
		float64(r.emptyAfter.cpu)/float64(r.emptyAfter.cpu+r.floor.cpu))
	fmt.Printf("Allocate / Kubernetes-style:    %6.1fx  (target >= 40)\n", r.alloc.rate/r.k8s.rate)
	fmt.Printf("empty call CPU / Allocate CPU:  %6.2f   (the rate ratio when both are CPU-bound; the "+
		"machine's other load does not skew it)\n",
		float64(r.emptyAfter.cpu)/float64(r.alloc.cpu))
	fmt.Printf("requests per group-commit transaction (mean): %.1f\n", r.batch)
}

// heldCalls measures a Health Check on a bare gRPC server (no interceptors), answered
// at once and held for hold: the difference is what a call costs for taking that long
// with o.clients callers (the transport batches less, a timer and a wake-up more),
// which an Allocate pays for waiting for its commit.
func heldCalls(ctx context.Context, o options, hold time.Duration) (bare, held result, err error) {
	measureHeld := func(name string, d time.Duration) (result, error) {
		gs := grpc.NewServer()
		healthpb.RegisterHealthServer(gs, heldHealth{hold: d})
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return result{}, err
		}
		go func() { _ = gs.Serve(l) }()
		defer gs.Stop()
		var conns []healthpb.HealthClient
		for range o.conns {
			c, err := grpc.NewClient(l.Addr().String(),
				grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return result{}, err
			}
			defer c.Close()
			conns = append(conns, healthpb.NewHealthClient(c))
		}
		call := func(ctx context.Context, g, i int) error {
			_, err := conns[g%len(conns)].Check(ctx, &healthpb.HealthCheckRequest{})
			return err
		}
		return measure(ctx, o, name, call, o.duration/2), nil
	}
	if bare, err = measureHeld("bare call (Health/Check, no interceptors)", 0); err != nil {
		return
	}
	held, err = measureHeld(fmt.Sprintf("bare call held %v (Allocate's p50)",
		hold.Round(10*time.Microsecond)), hold)
	return
}

// heldHealth answers Check after hold.
type heldHealth struct {
	healthpb.UnimplementedHealthServer
	hold time.Duration
}

func (h heldHealth) Check(context.Context,
	*healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if h.hold > 0 {
		time.Sleep(h.hold)
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// floor measures etcd's own cost for the keys of an Allocate: transactions of batch
// allocations, each an item key and an owner record created with a CreateRevision
// compare (values of the allocator's sizes), o.concurrency transactions in flight as
// the committer has them, on the same client and etcd, with no gRPC and no allocator
// code. A call is one allocation.
func floor(ctx context.Context, cli *clientv3.Client, o options, batch int) result {
	conc := o.concurrency
	if conc <= 0 {
		conc = allocator.DefaultCommitConcurrency
	}
	var seq atomic.Int64
	item := `{"namespace":"bench","name":"svc","uid":"floor-0000000","time":"2026-11-25T03:04:05.123456789Z"}`
	call := func(ctx context.Context, g, i int) error {
		cmps := make([]clientv3.Cmp, 0, 2*batch)
		puts := make([]clientv3.Op, 0, 2*batch)
		for range batch {
			n := strconv.FormatInt(seq.Add(1), 10)
			ik, ok := "/floor/clusterips/"+n, "/floor/owners/floor-"+n
			rec := `{"namespace":"bench","name":"svc","uid":"floor-` + n + `","clusterIPs":["10.1.2.3"],` +
				`"last":{"hash":"0123456789abcdef","clusterIPs":["10.1.2.3"]}}`
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(ik), "=", 0),
				clientv3.Compare(clientv3.CreateRevision(ok), "=", 0))
			puts = append(puts, clientv3.OpPut(ik, item), clientv3.OpPut(ok, rec))
		}
		_, err := cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
		return err
	}
	o1 := o
	o1.clients = conc
	r := measure(ctx, o1, fmt.Sprintf("etcd floor, txns of %d allocations (lines: per txn)", batch), call,
		o.duration/2)
	// Per allocation, not per transaction.
	r.rate *= float64(batch)
	r.cpu /= time.Duration(batch)
	r.bytes /= uint64(batch)
	return r
}

var errStop = fmt.Errorf("stop")

type result struct {
	name     string
	rate     float64
	cpu      time.Duration // process CPU time per successful call
	bytes    uint64        // bytes allocated per successful call
	p50, p99 time.Duration
	errs     int64
	firstErr error
}

// measure warms up, then runs call from o.clients goroutines for d, o.repeat times,
// and returns the run with the median rate (its p50 and p99).
func measure(ctx context.Context, o options, name string, call func(ctx context.Context, g, i int) error,
	d time.Duration) result {
	if o.warmup > 0 {
		once(ctx, o, name, call, o.warmup)
	}
	var runs []result
	for range max(o.repeat, 1) {
		r := once(ctx, o, name, call, d)
		fmt.Printf("  %-50s %8.0f/s p50 %-9s p99 %-9s cpu/call %-7s alloc/call %-6d errors %d\n", name,
			r.rate, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond),
			r.cpu.Round(100*time.Nanosecond), r.bytes, r.errs)
		if r.firstErr != nil {
			fmt.Printf("    first error: %v\n", r.firstErr)
		}
		runs = append(runs, r)
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].rate < runs[j].rate })
	return runs[len(runs)/2]
}

func once(ctx context.Context, o options, name string, call func(ctx context.Context, g, i int) error,
	d time.Duration) result {
	lats := make([][]time.Duration, o.clients)
	var errs atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	cpu0 := cpuTime()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	alloc0 := ms.TotalAlloc
	start := time.Now()
	deadline := start.Add(d)
	var end atomic.Int64
	for g := range o.clients {
		lats[g] = make([]time.Duration, 0, 1<<14)
		wg.Go(func() {
			for i := 0; ; i++ {
				t0 := time.Now()
				if t0.After(deadline) {
					return
				}
				err := call(ctx, g, i)
				if err == errStop {
					end.CompareAndSwap(0, int64(time.Since(start)))
					return
				}
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				lats[g] = append(lats[g], time.Since(t0))
			}
		})
	}
	wg.Wait()
	cpu := cpuTime() - cpu0
	runtime.ReadMemStats(&ms)
	allocated := ms.TotalAlloc - alloc0
	el := time.Since(start)
	if e := end.Load(); e != 0 {
		el = time.Duration(e)
	}
	all := slices.Concat(lats...)
	slices.Sort(all)
	r := result{name: name, rate: float64(len(all)) / el.Seconds(), errs: errs.Load()}
	if len(all) > 0 {
		r.p50, r.p99 = all[len(all)/2], all[len(all)*99/100]
		r.cpu = cpu / time.Duration(len(all))
		r.bytes = allocated / uint64(len(all))
	}
	if v := firstErr.Load(); v != nil {
		r.firstErr = v.(error)
	}
	return r
}

// baseline runs a Kubernetes-style allocator: one key holds the whole bitmap; an
// allocation reads it, sets a free bit from a random start and writes it back with a
// ModRevision compare, re-reading and retrying on conflict (GuaranteedUpdate).
func baseline(ctx context.Context, cli *clientv3.Client, o options, size int) (result, error) {
	const key = "/bench/registry/ranges/serviceips"
	if _, err := cli.Put(ctx, key, string(make([]byte, size/8))); err != nil {
		return result{}, err
	}
	var conflicts atomic.Int64
	allocate := func(ctx context.Context, g, i int) error {
		for {
			resp, err := cli.Get(ctx, key)
			if err != nil {
				return err
			}
			kv := resp.Kvs[0]
			bm := slices.Clone(kv.Value)
			bit, ok := freeBit(bm, size)
			if !ok {
				return allocator.ErrFull
			}
			bm[bit/8] |= 1 << (bit % 8)
			tr, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
				Then(clientv3.OpPut(key, string(bm))).Commit()
			if err != nil {
				return err
			}
			if tr.Succeeded {
				return nil
			}
			conflicts.Add(1)
		}
	}
	o1 := o
	o1.repeat, o1.warmup = 1, min(o.warmup, time.Second)
	name := fmt.Sprintf("Kubernetes-style bitmap (%d KiB key, Get + CAS)", size/8/1024)
	r := measure(ctx, o1, name, allocate, o.baseline)
	fmt.Printf("    compare-and-swap conflicts: %d\n", conflicts.Load())
	return r, nil
}

func freeBit(bm []byte, size int) (int, bool) {
	start := rand.IntN(size)
	for n := range size {
		b := (start + n) % size
		if bm[b/8]&(1<<(b%8)) == 0 {
			return b, true
		}
	}
	return 0, false
}

// cpuTime returns the process's user + system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// histogramMean returns sum/count of a histogram in reg.
func histogramMean(reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.Metric) > 0 {
			h := mf.Metric[0].GetHistogram()
			if h.GetSampleCount() > 0 {
				return h.GetSampleSum() / float64(h.GetSampleCount())
			}
		}
	}
	return 0
}
