package repair_test

import (
	"context"
	"flag"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allocd/allocd/allocator"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	"github.com/allocd/allocd/leader"
	"github.com/allocd/allocd/repair"
)

// benchServices is how many Services BenchmarkRepairPass100k uses (its name says the
// default): -repair-services 500000 for a million addresses (issue 22), the most the /12 and /108
// hold.
var benchServices = flag.Int("repair-services", 100_000, "Services of BenchmarkRepairPass100k")

// BenchmarkRepairPass100k measures a pass over a snapshot of 100k dual-stack Services
// against an IPv4 /12, an IPv6 /108 and the default NodePort range, with everything
// already allocated (200k addresses, and every one of the 2768 node ports): a pass
// rebuilds the expected state, reads from etcd only the allocations it must judge
// (after the first pass, which reads all 202,768: first-pass-ms) and finds nothing to
// do. Setup (the allocations, outside the timer) takes a while.
func BenchmarkRepairPass100k(b *testing.B) {
	n := *benchServices
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	b.Cleanup(func() { cancel(); wg.Wait() })

	e := etcdtest.New(b)
	v4 := netip.MustParsePrefix("10.0.0.0/12")
	v6 := netip.MustParsePrefix("fd00::/108")
	a, err := allocator.New(ctx, e.Client, allocator.Config{
		Prefix:          prefix,
		ClusterIPRanges: []netip.Prefix{v4, v6},
		NodePortRange:   allocator.DefaultNodePortRange,
	})
	if err != nil {
		b.Fatal(err)
	}
	wg.Go(func() { a.Run(ctx) })

	svcs := make([]repair.Service, n)
	reqs := make([]allocator.Request, n)
	a4, a6 := v4.Addr().Next().Next(), v6.Addr().Next().Next() // .1 is the kubernetes address
	pr := allocator.DefaultNodePortRange
	for i := range svcs {
		o := allocator.Owner{Namespace: "bench", Name: "svc-" + strconv.Itoa(i),
			UID: "uid-" + strconv.Itoa(i)}
		svcs[i] = repair.Service{Namespace: o.Namespace, Name: o.Name, UID: o.UID,
			ClusterIPs: []string{a4.String(), a6.String()}}
		reqs[i] = allocator.Request{Owner: o, ClusterIPs: []netip.Addr{a4, a6}}
		if i < pr.Size {
			p := pr.Base + i
			svcs[i].NodePorts = []repair.NodePort{{Port: p, Protocol: "TCP"}, {Port: p, Protocol: "UDP"}}
			reqs[i].NodePorts = []int{p}
		}
		a4, a6 = a4.Next(), a6.Next()
	}
	start := time.Now()
	var next atomic.Int64
	var setup sync.WaitGroup
	for range 64 {
		setup.Go(func() {
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				if _, err := a.Allocate(ctx, reqs[i]); err != nil {
					b.Errorf("Allocate(%s) = %v", reqs[i].Owner.UID, err)
					return
				}
			}
		})
	}
	setup.Wait()
	if b.Failed() {
		b.FailNow()
	}
	b.Logf("setup: %d Services allocated in %v", n, time.Since(start).Round(time.Millisecond))

	el, err := leader.New(e.Client, leader.Config{Prefix: prefix + "/repair/leader", Identity: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	ctl, err := repair.New(e.Client, a, repair.Config{Prefix: prefix, Interval: time.Hour, Leadership: el})
	if err != nil {
		b.Fatal(err)
	}
	wg.Go(func() { el.Run(ctx, ctl.Lead) })
	etcdtest.WaitFor(b, 10*time.Second, "repair leadership", ctl.IsLeader)
	rc, err := ctl.Receive(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if err := ctl.Accept(ctx, repair.Snapshot{Revision: 1, Services: svcs}, rc); err != nil {
		b.Fatalf("Accept(100k Services) = %v", err)
	}

	// The first pass of a term lists every allocation (and seeds the allocator's
	// holders); the passes after it read only what they judge.
	t0 := time.Now()
	if rep, err := ctl.RunRepair(ctx, false); err != nil || rep.Err != nil || len(rep.Findings) != 0 {
		b.Fatalf("first RunRepair() = %v, %v, %d findings; want a clean pass", err, rep.Err,
			len(rep.Findings))
	}
	b.ReportMetric(float64(time.Since(t0).Milliseconds()), "first-pass-ms")
	for b.Loop() {
		rep, err := ctl.RunRepair(ctx, false)
		if err != nil || rep.Err != nil || len(rep.Findings) != 0 {
			b.Fatalf("RunRepair() = %v, %v, %d findings; want a clean pass", err, rep.Err, len(rep.Findings))
		}
	}
	b.StopTimer()
	t0 = time.Now()
	_, all, err := a.List(ctx)
	if err != nil || len(all) != 2*n+pr.Size+1 {
		b.Fatalf("List() = %d allocations, %v; want %d", len(all), err, 2*n+pr.Size+1)
	}
	b.ReportMetric(float64(time.Since(t0).Milliseconds()), "list-ms")
}
