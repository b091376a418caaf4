// Command bench measures allocd's Allocate against an empty gRPC call and against a
// Kubernetes-style allocator, all in one process on one embedded etcd with fsync on:
//
//	go run ./internal/bench [-duration 10s] [-clients 64] [-conns 4] [-repeat 3]
//
// It starts the embedded etcd in a temporary directory, an Allocator (on an
// in-process etcd client, as allocd with its embedded etcd; -in-process-etcd-client=false
// for gRPC over loopback, as with --etcd-servers) and a gRPC server built by
// server.NewGRPCServer (the production interceptors) on loopback,
// then runs, each after a warm-up and repeated -repeat times (medians reported):
//
//  1. grpc.health.v1.Health/Check, the empty unary call;
//  2. Allocate of one ClusterIP for a distinct owner per call, in -cidr (a /8);
//  3. Allocate of one ClusterIP and one NodePort (stops early before the ports run out);
//  4. a Kubernetes-style allocator: the whole bitmap of a /12 (128 KiB) in one key,
//     Get then Txn(ModRevision compare, Put) per allocation, retried on conflict;
//
// and prints a table with the ratios the issue targets: Allocate >= 0.5 x the empty
// call and >= 40 x the Kubernetes-style baseline.
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
	"github.com/allocd/allocd/internal/embedetcd"
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
}

func main() {
	var o options
	var cidr, ports string
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "length of each measured Allocate run")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "warm-up before each kind of call")
	flag.DurationVar(&o.baseline, "baseline-duration", 5*time.Second, "length of the Kubernetes-style baseline run")
	flag.IntVar(&o.clients, "clients", 64, "concurrent client goroutines")
	flag.IntVar(&o.conns, "conns", 4, "gRPC client connections the goroutines share")
	flag.IntVar(&o.repeat, "repeat", 3, "runs of each measurement (medians reported)")
	flag.StringVar(&cidr, "cidr", "10.0.0.0/8", "service cluster IP range of the Allocate runs (2^24 addresses: room for every run)")
	flag.IntVar(&o.baselineBits, "baseline-bits", 20, "the Kubernetes-style bitmap has 2^bits bits (20: a /12, 128 KiB, Kubernetes' largest IPv4 range)")
	flag.StringVar(&ports, "node-port-range", "1024-65535", "service node port range of the NodePort run")
	flag.IntVar(&o.portRunMax, "port-run-max", 40000, "stop the NodePort run after this many allocations (0 = skip the run)")
	flag.IntVar(&o.concurrency, "commit-concurrency", 0, "group-commit transactions in flight (0 = the allocator's default)")
	flag.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the Allocate runs to this file")
	flag.BoolVar(&o.inProcess, "in-process-etcd-client", true, "talk to the embedded etcd through direct calls (v3client), as allocd does with its embedded etcd; false: gRPC over loopback, as with --etcd-servers")
	flag.StringVar(&o.memprofile, "memprofile", "", "write an allocation profile to this file after the Allocate runs")
	flag.StringVar(&o.dir, "dir", "", "etcd data directory (default: a new temporary directory, removed at the end)")
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
	dir := o.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "allocd-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = filepath.Join(d, "etcd")
	}
	ca, err := freeAddr()
	if err != nil {
		return err
	}
	pa, err := freeAddr()
	if err != nil {
		return err
	}
	e, err := embedetcd.Start(ctx, embedetcd.Config{Name: "bench", Dir: dir,
		ClientURL: "http://" + ca, PeerURL: "http://" + pa})
	if err != nil {
		return err
	}
	defer e.Close()
	var cli *clientv3.Client
	if o.inProcess {
		cli = v3client.New(e.Server)
	} else {
		cli, err = clientv3.New(clientv3.Config{Endpoints: []string{"http://" + ca}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
	}
	defer cli.Close()

	reg := prometheus.NewRegistry()
	// The daemon's logger (text handler) at its default level, info, into io.Discard:
	// the allocator's per-write lines are formatted, as in production, and dropped.
	log := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	a, err := allocator.New(actx, cli, allocator.Config{Prefix: "/allocd", ClusterIPRanges: []netip.Prefix{o.cidr},
		NodePortRange: o.portRange, Logger: log, Registerer: reg, CommitConcurrency: o.concurrency})
	if err != nil {
		return err
	}
	runDone := make(chan error, 1)
	go func() { runDone <- a.Run(actx) }()
	defer func() { cancel(); <-runDone }()

	gs, hs := server.NewGRPCServer(server.Options{Logger: log, Registerer: reg})
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	allocdv1.RegisterAllocatorServiceServer(gs, server.NewAllocatorService(a, log))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go func() { _ = gs.Serve(l) }()
	defer gs.Stop()

	conns := make([]*grpc.ClientConn, o.conns)
	for i := range conns {
		if conns[i], err = grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			return err
		}
		defer conns[i].Close()
	}
	health := func(i int) healthpb.HealthClient { return healthpb.NewHealthClient(conns[i%len(conns)]) }
	alloc := func(i int) allocdv1.AllocatorServiceClient {
		return allocdv1.NewAllocatorServiceClient(conns[i%len(conns)])
	}

	fmt.Printf("allocd bench: %d clients over %d connections, embedded etcd with fsync on in %s, GOMAXPROCS=%d, NumCPU=%d\n",
		o.clients, o.conns, dir, runtime.GOMAXPROCS(0), runtime.NumCPU())

	// 1. The empty call.
	empty := func(ctx context.Context, g, i int) error {
		_, err := health(g).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	hres := measure(ctx, o, "empty call (Health/Check)", empty, o.duration/2)

	// 2. Allocate, one ClusterIP per distinct owner.
	var seq atomic.Int64
	allocIP := func(ctx context.Context, g, i int) error {
		n := seq.Add(1)
		_, err := alloc(g).Allocate(ctx, &allocdv1.AllocateRequest{Owner: &allocdv1.Owner{Namespace: "bench",
			Name: "svc", Uid: "ip-" + strconv.FormatInt(n, 10)}})
		return err
	}
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer f.Close()
	}
	ares := measure(ctx, o, "Allocate ClusterIP "+o.cidr.String(), allocIP, o.duration)
	if o.cpuprofile != "" {
		pprof.StopCPUProfile()
	}
	if o.memprofile != "" {
		f, err := os.Create(o.memprofile)
		if err != nil {
			return err
		}
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			return err
		}
		f.Close()
	}
	batches := histogramMean(reg, "allocd_allocator_commit_batch_requests")

	// 1b. The empty call again, now that etcd holds the Allocate runs' keys: the same
	// process state as the Allocate runs (a large etcd heap makes every call's garbage
	// collection dearer), so that both sides of the ratio pay for it.
	hres2 := measure(ctx, o, "empty call (Health/Check), after the Allocate runs", empty, o.duration/2)

	// 3. Allocate, one ClusterIP and one NodePort, until the ports would run low.
	var pres result
	if o.portRunMax > 0 {
		allocPort := func(ctx context.Context, g, i int) error {
			n := seq.Add(1)
			_, err := alloc(g).Allocate(ctx, &allocdv1.AllocateRequest{Owner: &allocdv1.Owner{Namespace: "bench",
				Name: "svc", Uid: "port-" + strconv.FormatInt(n, 10)}, NodePortCount: 1})
			return err
		}
		max := min(o.portRunMax, o.portRange.Size*8/10)
		var done atomic.Int64
		limited := func(ctx context.Context, g, i int) error {
			if done.Add(1) > int64(max) {
				return errStop
			}
			return allocPort(ctx, g, i)
		}
		o1 := o
		o1.repeat, o1.warmup = 1, 0
		pres = measure(ctx, o1, fmt.Sprintf("Allocate ClusterIP + NodePort %s (at most %d)", o.portRange, max), limited, o.duration)
	}

	// 4. The Kubernetes-style baseline on the same etcd.
	bres, err := baseline(ctx, cli, o, 1<<o.baselineBits)
	if err != nil {
		return err
	}

	fmt.Println()
	fmt.Printf("%-58s %9s %10s %10s %10s %7s\n", "", "rate/s", "p50", "p99", "cpu/call", "errors")
	for _, r := range []result{hres, hres2, ares, pres, bres} {
		if r.name == "" {
			continue
		}
		fmt.Printf("%-58s %9.0f %10s %10s %10s %7d\n", r.name, r.rate, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.cpu.Round(100*time.Nanosecond), r.errs)
	}
	fmt.Println()
	fmt.Printf("Allocate / empty call:          %6.2f   (target >= 0.5; the empty call measured first, on an empty etcd)\n", ares.rate/hres.rate)
	fmt.Printf("Allocate / empty call after:    %6.2f   (the empty call measured after the Allocate runs, on the same etcd)\n", ares.rate/hres2.rate)
	fmt.Printf("Allocate / Kubernetes-style:    %6.1fx  (target >= 40)\n", ares.rate/bres.rate)
	fmt.Printf("empty call CPU / Allocate CPU:  %6.2f   (the rate ratio when both are CPU-bound; the machine's other load does not skew it)\n",
		float64(hres.cpu)/float64(ares.cpu))
	fmt.Printf("requests per group-commit transaction (mean): %.1f\n", batches)
	fmt.Printf("ClusterIPs in use: %d of %d\n", a.Ranges()[0].Used, a.Ranges()[0].Size)
	return nil
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
func measure(ctx context.Context, o options, name string, call func(ctx context.Context, g, i int) error, d time.Duration) result {
	if o.warmup > 0 {
		once(ctx, o, name, call, o.warmup)
	}
	var runs []result
	for range max(o.repeat, 1) {
		r := once(ctx, o, name, call, d)
		fmt.Printf("  %-50s %8.0f/s p50 %-9s p99 %-9s cpu/call %-7s alloc/call %-6d errors %d\n", name, r.rate, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.cpu.Round(100*time.Nanosecond), r.bytes, r.errs)
		if r.firstErr != nil {
			fmt.Printf("    first error: %v\n", r.firstErr)
		}
		runs = append(runs, r)
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].rate < runs[j].rate })
	return runs[len(runs)/2]
}

func once(ctx context.Context, o options, name string, call func(ctx context.Context, g, i int) error, d time.Duration) result {
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
