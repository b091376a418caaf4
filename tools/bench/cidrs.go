package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allocd/allocd/allocator"
)

// cidrResults are the ServiceCIDR runs: Allocate in process with one ServiceCIDR and
// with 1,000 (999 of them full, ahead of the one with room in allocation order), and
// the heap that 1,000 /16s take.
type cidrResults struct {
	one, many result
	heap16    uint64 // bytes of heap for 1,000 ServiceCIDRs of /16
}

// cidrRuns measures what the number of ServiceCIDRs costs an Allocate: the same calls,
// in process (no gRPC: the allocator's own cost), at o.clients, against an allocator
// whose one ServiceCIDR has room and against one that must pass 999 full ones first.
func cidrRuns(ctx context.Context, o options, e *env) (cidrResults, error) {
	var r cidrResults
	big := netip.MustParsePrefix("100.64.0.0/12")
	one, stopOne, err := benchAllocator(ctx, e, "/bench-one", big)
	if err != nil {
		return r, err
	}
	defer stopOne()
	many, stopMany, err := benchAllocator(ctx, e, "/bench-many", netip.MustParsePrefix("10.200.0.0/29"))
	if err != nil {
		return r, err
	}
	defer stopMany()
	start := time.Now()
	base := netip.MustParseAddr("172.16.0.0").As4()
	for i := range 998 {
		b := base
		n := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + uint32(i)*8
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}),
			29)
		if _, err := many.CreateServiceCIDR(ctx, "full-"+strconv.Itoa(i), []string{p.String()}); err != nil {
			return r, err
		}
	}
	if err := fill(ctx, o, many); err != nil {
		return r, err
	}
	if _, err := many.CreateServiceCIDR(ctx, "room", []string{big.String()}); err != nil {
		return r, err
	}
	fmt.Printf("  1,000 ServiceCIDRs created and 999 of them filled in %v\n",
		time.Since(start).Round(time.Millisecond))
	call := func(a *allocator.Allocator, prefix string) func(ctx context.Context, g, i int) error {
		var seq atomic.Int64
		return func(ctx context.Context, g, i int) error {
			_, err := a.Allocate(ctx,
				allocator.Request{Owner: allocator.Owner{Namespace: "bench", Name: "svc",
					UID: prefix + strconv.FormatInt(seq.Add(1), 10)}})
			return err
		}
	}
	// The two alternate, so that the machine's load and etcd's growth fall on both.
	r.one, r.many = alternate(ctx, o,
		"Allocate in process, 1 ServiceCIDR", call(one, "one-"),
		"Allocate in process, 1,000 ServiceCIDRs (999 full)", call(many, "many-"), o.duration/2)
	r.heap16, err = heap16(ctx, e)
	return r, err
}

// benchAllocator runs an allocator on e's etcd under prefix, seeded with cidr.
func benchAllocator(ctx context.Context, e *env, prefix string,
	cidr netip.Prefix) (*allocator.Allocator, func(), error) {
	actx, cancel := context.WithCancel(ctx)
	a, err := allocator.New(actx, e.cli,
		allocator.Config{Prefix: prefix, ClusterIPRanges: []netip.Prefix{cidr},
			NodePortRange: allocator.DefaultNodePortRange,
			Logger:        slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		cancel()
		return nil, nil, err
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	return a, func() { cancel(); <-done }, nil
}

// fill allocates until every range of a is full.
func fill(ctx context.Context, o options, a *allocator.Allocator) error {
	var wg sync.WaitGroup
	var first atomic.Value
	var seq atomic.Int64
	for range o.clients {
		wg.Go(func() {
			for {
				_, err := a.Allocate(ctx,
					allocator.Request{Owner: allocator.Owner{Namespace: "bench", Name: "fill",
						UID: "fill-" + strconv.FormatInt(seq.Add(1), 10)}})
				if err == nil {
					continue
				}
				if !isFull(err) {
					first.CompareAndSwap(nil, err)
				}
				return
			}
		})
	}
	wg.Wait()
	if err, _ := first.Load().(error); err != nil {
		return fmt.Errorf("fill the ServiceCIDRs: %w", err)
	}
	return nil
}

func isFull(err error) bool { return errors.Is(err, allocator.ErrFull) }

// print prints the ServiceCIDR runs and their ratio.
func (r cidrResults) print() {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	fmt.Println()
	fmt.Printf("Allocate in process, 1 ServiceCIDR:                 %8.0f/s  %6.1f µs CPU/call\n",
		r.one.rate, us(r.one.cpu))
	fmt.Printf("Allocate in process, 1,000 ServiceCIDRs (999 full): %8.0f/s  %6.1f µs CPU/call\n",
		r.many.rate, us(r.many.cpu))
	fmt.Printf("1,000 / 1 ServiceCIDRs: rate %.2f, CPU per call %.2f   (goal: within 10 %%)\n",
		r.many.rate/r.one.rate, float64(r.many.cpu)/float64(r.one.cpu))
	fmt.Printf("heap for 1,000 ServiceCIDRs of /16: %.1f MiB (%.1f KiB each)\n", float64(r.heap16)/(1<<20),
		float64(r.heap16)/1000/1024)
}

// heap16 is the heap an allocator holds for 1,000 ServiceCIDRs of /16: the live heap
// with it, minus the live heap once it is stopped and dropped (etcd, in this process,
// holds the same keys in both readings).
func heap16(ctx context.Context, e *env) (uint64, error) {
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	a, stop, err := benchAllocator(ctx, e, "/bench-heap", netip.MustParsePrefix("10.0.0.0/16"))
	if err != nil {
		return 0, err
	}
	for i := range 999 {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(11 + i/256), byte(i % 256), 0, 0}), 16)
		if _, err := a.CreateServiceCIDR(ctx, "s16-"+strconv.Itoa(i), []string{p.String()}); err != nil {
			stop()
			return 0, err
		}
	}
	if err := a.Sync(ctx); err != nil {
		stop()
		return 0, err
	}
	if n := len(a.Ranges()); n != 1001 {
		stop()
		return 0, fmt.Errorf("the allocator has %d ranges; want 1,000 and the node ports", n)
	}
	with := heap()
	stop()
	a = nil
	without := heap()
	return with - without, nil
}

// alternate warms both calls up, then runs them in turn o.repeat times, and returns
// the run of each with the median CPU per call.
func alternate(ctx context.Context, o options, an string, a func(ctx context.Context, g, i int) error,
	bn string, b func(ctx context.Context, g, i int) error, d time.Duration) (result, result) {
	if o.warmup > 0 {
		once(ctx, o, an, a, o.warmup)
		once(ctx, o, bn, b, o.warmup)
	}
	var ra, rb []result
	for range max(o.repeat, 1) {
		for _, x := range []struct {
			name string
			call func(ctx context.Context, g, i int) error
			out  *[]result
		}{{an, a, &ra}, {bn, b, &rb}} {
			r := once(ctx, o, x.name, x.call, d)
			fmt.Printf("  %-50s %8.0f/s p50 %-9s p99 %-9s cpu/call %-7s errors %d\n", x.name, r.rate,
				r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond),
				r.cpu.Round(100*time.Nanosecond), r.errs)
			*x.out = append(*x.out, r)
		}
	}
	median := func(rs []result) result {
		slices.SortFunc(rs, func(x, y result) int { return cmp.Compare(x.cpu, y.cpu) })
		return rs[len(rs)/2]
	}
	return median(ra), median(rb)
}
