package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// result is one run's figures.
type result struct {
	pushes                time.Duration // the three snapshot pushes
	syncEps, syncSlices   time.Duration // end of the pushes → every object on the watch
	epP50, epP99          time.Duration // churn: ack → WatchServiceEndpoints
	slP50, slP99          time.Duration // churn: ack → WatchEndpointSlices
	flips, applied        int
	epWrites, sliceWrites int // watch events during the churn
	rate                  float64
	heapBefore, heapAfter float64 // go_memstats_alloc_bytes: lowest before the pushes, after the sync
	cpuSync, cpuChurn     float64 // allocd's CPU seconds: pushes and sync; churn
	rssAfter              float64
	pods                  int
	staleEps, staleSlices int // churn events that showed another count than the pending flip's
	// allocd's own event → commit histograms over the churn (allocd_endpoints_ and
	// allocd_endpointslice_event_to_commit_seconds): the commit's share of the latency.
	epCommitP50, epCommitP99, slCommitP50, slCommitP99 float64
}

// The histograms of allocd's event → commit latency.
const (
	epCommitHist    = "allocd_endpoints_event_to_commit_seconds"
	sliceCommitHist = "allocd_endpointslice_event_to_commit_seconds"
)

// runOnce starts bin, feeds it the workload, measures, and stops it.
func runOnce(ctx context.Context, o options, bin, dir string) (result, error) {
	p, err := startAllocd(ctx, bin, dir, o.profileDir != "")
	if err != nil {
		return result{}, err
	}
	defer p.stop()
	c, err := client.New(p.grpc)
	if err != nil {
		return result{}, err
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := result{pods: o.w.services * o.w.podsPerSvc}
	if r.heapBefore, err = lowestHeap(ctx, p, 2*time.Second); err != nil {
		return r, err
	}
	eps, sl, err := openWatches(ctx, c, o.w)
	if err != nil {
		return r, err
	}
	if err := r.sync(ctx, o, p, c, eps, sl); err != nil {
		return r, err
	}
	hctx, stopHeap := context.WithCancel(ctx)
	heapc := make(chan float64, 1)
	go func() { h, _ := lowestHeap(hctx, p, 0); heapc <- h }()
	if err := r.churn(ctx, o, p, c, eps, sl); err != nil {
		stopHeap()
		return r, err
	}
	time.Sleep(2 * time.Second) // the heap after the last writes, a GC or two later
	stopHeap()
	r.heapAfter = <-heapc
	m, err := p.scrape(ctx, "process_resident_memory_bytes")
	if err != nil {
		return r, err
	}
	r.rssAfter = m["process_resident_memory_bytes"]
	if err := p.profile(ctx, "heap", "gc=1", o.profilePath(dir, "heap")); err != nil {
		return r, err
	}
	return r, nil
}

// openWatches reads etcd's revision and opens both watches from it.
func openWatches(ctx context.Context, c *client.Client, w workload) (eps, sl *tracker, err error) {
	l, err := c.ListServiceEndpoints(ctx, &allocdv1.ListServiceEndpointsRequest{PageSize: 1})
	if err != nil {
		return nil, nil, err
	}
	idx := w.index()
	eps, sl = newTracker("endpoints", idx, w.podsPerSvc), newTracker("slices", idx, w.podsPerSvc)
	go watchEndpoints(ctx, c, l.GetRevision(), eps)
	go watchSlices(ctx, c, l.GetRevision(), sl)
	return eps, sl, nil
}

// sync pushes the Nodes, Services and Pods as snapshots and waits until both watches
// show every Service with all its Pods ready.
func (r *result) sync(ctx context.Context, o options, p *process, c *client.Client, eps, sl *tracker) error {
	nodes, svcs, pods := o.w.nodeList(), o.w.serviceList(), o.w.podList()
	cpu0, err := p.cpu(ctx)
	if err != nil {
		return err
	}
	var prof sync.WaitGroup
	var profErr error
	prof.Go(func() {
		profErr = p.profile(ctx, "profile", "seconds="+fmt.Sprint(o.syncProfileSeconds), o.profilePath(p.dir,
			"cpu-sync"))
	})
	start := time.Now()
	if _, err := c.PushNodeSnapshot(ctx, &allocdv1.NodeSnapshot{Revision: 1, Nodes: nodes}); err != nil {
		return fmt.Errorf("push nodes: %w", err)
	}
	if _, err := c.PushServiceSnapshot(ctx, &allocdv1.ServiceSnapshot{Revision: 1,
		Services: svcs}); err != nil {
		return fmt.Errorf("push services: %w", err)
	}
	if _, err := c.PushPodSnapshot(ctx, &allocdv1.PodSnapshot{Revision: 1, Pods: pods}); err != nil {
		return fmt.Errorf("push pods: %w", err)
	}
	pushed := time.Now()
	r.pushes = pushed.Sub(start)
	for _, t := range []*tracker{eps, sl} {
		if err := waitAllIn(ctx, t, 5*time.Minute); err != nil {
			return err
		}
	}
	cpu1, err := p.cpu(ctx)
	if err != nil {
		return err
	}
	r.cpuSync = cpu1 - cpu0
	r.syncEps, r.syncSlices = eps.allIn.Sub(pushed), sl.allIn.Sub(pushed)
	prof.Wait()
	if profErr != nil {
		return profErr
	}
	// With profiles on, a heap profile of the end of the sync (after a GC it forces:
	// the lowest heap after the sync can be lower in a profiled run).
	return p.profile(ctx, "heap", "gc=1", o.profilePath(p.dir, "heap-sync"))
}

func waitAllIn(ctx context.Context, t *tracker, limit time.Duration) error {
	select {
	case <-t.allInC:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(limit):
		t.mu.Lock()
		defer t.mu.Unlock()
		return fmt.Errorf("%s: %d of %d Services synced on the watch after %v (watch error: %v)",
			t.name, t.synced, len(t.index), limit, t.err)
	}
}

// churn runs the readiness flips and collects their latencies and writes.
func (r *result) churn(ctx context.Context, o options, p *process, c *client.Client, eps, sl *tracker) error {
	time.Sleep(time.Second) // let the sync's last writes land before counting
	ts := []*tracker{eps, sl}
	for _, t := range ts {
		t.startChurn()
	}
	m0, err := p.scrape(ctx, "process_cpu_seconds_total", epCommitHist, sliceCommitHist)
	if err != nil {
		return err
	}
	var prof sync.WaitGroup
	var profErr error
	prof.Go(func() {
		secs := max(1, int(o.churnFor.Seconds())-2)
		profErr = p.profile(ctx, "profile", "seconds="+fmt.Sprint(secs), o.profilePath(p.dir, "cpu-churn"))
	})
	cr, err := churn(ctx, c, o.w, o.churnRate, o.churnFor, ts...)
	if err != nil {
		return err
	}
	if err := settle(ts, 2*time.Minute); err != nil {
		return err
	}
	m1, err := p.scrape(ctx, "process_cpu_seconds_total", epCommitHist, sliceCommitHist)
	if err != nil {
		return err
	}
	prof.Wait()
	r.cpuChurn = m1["process_cpu_seconds_total"] - m0["process_cpu_seconds_total"]
	r.epCommitP50, r.epCommitP99 = quantile(epCommitHist, m0, m1, 0.5), quantile(epCommitHist, m0, m1, 0.99)
	r.slCommitP50, r.slCommitP99 = quantile(sliceCommitHist, m0, m1, 0.5), quantile(sliceCommitHist, m0, m1,
		0.99)
	r.flips, r.applied, r.rate = cr.flips, cr.applied, float64(cr.flips)/cr.sent.Seconds()
	for _, t := range ts {
		t.mu.Lock()
	}
	r.epWrites, r.sliceWrites = eps.events, sl.events
	r.staleEps, r.staleSlices = eps.stale, sl.stale
	r.epP50, r.epP99 = pct(eps.lat, 0.50), pct(eps.lat, 0.99)
	r.slP50, r.slP99 = pct(sl.lat, 0.50), pct(sl.lat, 0.99)
	for _, t := range ts {
		t.mu.Unlock()
	}
	return profErr
}

func pct(lat []time.Duration, q float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// cpu is allocd's CPU seconds so far.
func (p *process) cpu(ctx context.Context) (float64, error) {
	m, err := p.scrape(ctx, "process_cpu_seconds_total")
	return m["process_cpu_seconds_total"], err
}

// lowestHeap is the lowest go_memstats_alloc_bytes of allocd read every second for d
// (0: until ctx ends). (A scrape costs allocd CPU: at 4 a second, 4 % of its CPU in the churn.)
func lowestHeap(ctx context.Context, p *process, d time.Duration) (float64, error) {
	if d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	low := math.Inf(1)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		m, err := p.scrape(ctx, "go_memstats_alloc_bytes")
		if err == nil {
			low = min(low, m["go_memstats_alloc_bytes"])
			fmt.Fprintf(p.heapLog, "%.2f\t%.0f\n", time.Since(p.startedAt).Seconds(),
				m["go_memstats_alloc_bytes"])
		} else if ctx.Err() == nil {
			return 0, err
		}
		select {
		case <-ctx.Done():
			if math.IsInf(low, 1) {
				return 0, fmt.Errorf("no heap sample of allocd")
			}
			return low, nil
		case <-tick.C:
		}
	}
}
