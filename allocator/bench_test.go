package allocator

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bits-and-blooms/bitset"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"

	"github.com/allocd/allocd/internal/etcd/embedded"
	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// BenchmarkList lists the allocations of 100k dual-stack Services (a /12 and a /108)
// and every port of the default NodePort range: the repair pass's read. It lists
// over gRPC (RangeStream) and through the in-process client (pages).
func BenchmarkList(b *testing.B) {
	const n = 100_000
	ctx := context.Background()
	e := benchEtcd(b, true)
	grpcCli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Config().ListenClientUrls[0].String()},
		DialTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer grpcCli.Close()
	cfg := testConfig("10.0.0.0/12", "fd00::/108")
	// Write the item keys directly, 128 to a transaction: Allocate would take seconds.
	a4, a6 := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::2")
	now := time.Now()
	var puts []clientv3.Op
	flush := func() {
		if _, err := grpcCli.Txn(ctx).Then(puts...).Commit(); err != nil {
			b.Fatal(err)
		}
		puts = puts[:0]
	}
	put := func(key string, o Owner) {
		puts = append(puts, clientv3.OpPut(key, string(appendItemValue(nil, o, now))))
		if len(puts) == maxTxnOps {
			flush()
		}
	}
	for i := range n {
		o := Owner{Namespace: "bench", Name: "svc-" + strconv.Itoa(i), UID: "uid-" + strconv.Itoa(i)}
		put(cfg.Prefix+"/clusterips/"+a4.String(), o)
		put(cfg.Prefix+"/clusterips/"+a6.String(), o)
		if i < cfg.NodePortRange.Size {
			put(cfg.Prefix+"/nodeports/"+strconv.Itoa(cfg.NodePortRange.Base+i), o)
		}
		a4, a6 = a4.Next(), a6.Next()
	}
	flush()
	want := 2*n + cfg.NodePortRange.Size + 1
	for _, c := range []struct {
		name string
		cli  *clientv3.Client
	}{{"grpc", grpcCli}, {"in-process", v3client.New(e.Server)}} {
		b.Run(c.name, func(b *testing.B) {
			a, err := New(ctx, c.cli, cfg)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				_, all, err := a.List(ctx)
				if err != nil || len(all) != want {
					b.Fatalf("List() = %d allocations, %v; want %d", len(all), err, want)
				}
			}
		})
	}
}

// BenchmarkAllocate allocates one ClusterIP per distinct owner from 64 goroutines,
// through the in-process etcd client of an embedded etcd with fsync on (as
// tools/bench does, without the gRPC server): the allocator's and etcd's share of
// an Allocate call, its log line included. It reports the process CPU time per
// allocation.
func BenchmarkAllocate(b *testing.B) { benchAllocate(b, false) }

// BenchmarkAllocateKeepingHolders is BenchmarkAllocate with the holders kept (seeded
// by a ListExcept before it starts), as every replica of the daemon keeps them: the
// watch records each allocation's holder.
func BenchmarkAllocateKeepingHolders(b *testing.B) { benchAllocate(b, true) }

func benchAllocate(b *testing.B, keepHolders bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := benchEtcd(b, false)
	cli := v3client.New(e.Server)
	defer cli.Close()
	cfg := testConfig("10.0.0.0/8")
	// The daemon's text handler at its default level, into io.Discard: the per-write
	// lines are formatted, as in production, and dropped (as tools/bench has it).
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
	a, err := New(ctx, cli, cfg)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if keepHolders {
		if _, _, err := a.ListExcept(ctx, nil, nil); err != nil || !a.hold.kept() {
			b.Fatalf("ListExcept = %v; want the holders seeded", err)
		}
	}
	var seq atomic.Int64
	b.SetParallelism(32) // 64 goroutines on 2 CPUs
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			uid := "ip-" + strconv.FormatInt(seq.Add(1), 10)
			if _, err := a.Allocate(ctx,
				Request{Owner: Owner{Namespace: "bench", Name: "svc", UID: uid}}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// benchEtcd starts an embedded etcd (fsync off with noFsync) until the benchmark ends.
func benchEtcd(b *testing.B, noFsync bool) *embed.Etcd {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e, err := embedded.Start(ctx, embedded.Config{Name: "bench", Dir: b.TempDir(), UnsafeNoFsync: noFsync,
		ClientURL: "http://" + etcdtest.FreeAddr(b), PeerURL: "http://" + etcdtest.FreeAddr(b)})
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close(); cancel() })
	return e
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCollectTombstones collects the tombstones of 20,000 full releases (a mass
// release: a namespace of Services deleted), the way the epoch loop does, a round at a
// time: each round moves the epoch on and collects what it may. It reports the rounds
// the collection took (the epoch loop runs one a second) and the time per tombstone.
func BenchmarkCollectTombstones(b *testing.B) {
	const n = 20_000
	ctx := context.Background()
	cli := v3client.New(benchEtcd(b, true).Server)
	defer cli.Close()
	a, err := New(ctx, cli, testConfig("10.0.0.0/16"))
	if err != nil {
		b.Fatal(err)
	}
	var rounds int
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		writeTombstones(b, cli, a, "uid", n)
		b.StartTimer()
		for {
			resp, err := cli.Get(ctx, a.tombPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				b.Fatal(err)
			}
			if resp.Count == 0 {
				break
			}
			if err := a.epochs.round(ctx); err != nil {
				b.Fatal(err)
			}
			rounds++
		}
	}
	b.ReportMetric(float64(rounds)/float64(b.N), "rounds/op")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/tombstone")
}

// BenchmarkEncodeSnapshot encodes a checkpoint of 1,000 ServiceCIDRs (999 full /29s and
// a /12 with 10,000 items) and the default NodePort range: what a checkpoint costs with
// many ranges, most of it per range.
func BenchmarkEncodeSnapshot(b *testing.B) {
	snap := &indexSnapshot{rev: 1}
	add := func(name string, size uint64, used uint) {
		s := bitset.New(uint(size))
		for i := range used {
			s.Set(i)
		}
		snap.ranges = append(snap.ranges, snapRange{name: name, size: size, used: s})
	}
	for i := range 999 {
		add("full-"+strconv.Itoa(i), 8, 8)
	}
	add("room", 1<<20, 10_000)
	add("nodeports", uint64(DefaultNodePortRange.Size), 1_000)
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		if _, parts, err := encodeSnapshot(snap, now); err != nil || len(parts) < len(snap.ranges) {
			b.Fatalf("encodeSnapshot = %d parts, %v; want at least %d", len(parts), err, len(snap.ranges))
		}
	}
}
