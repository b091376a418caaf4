package kube

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// flipRec is one readiness flip and when each step of it was seen.
type flipRec struct {
	svc, pod, ip string
	ready        bool // the state flipped to
	// sched is when the flip was due, sent when its request went out, acked when the
	// API server answered it, podSeen when the test's Pod watch showed it.
	sched, sent, acked, podSeen time.Time
	// allocdEP and allocdSlice: allocd committed the changed Endpoints and slice (the
	// test follows allocd's own watches); ep and slice: the changed objects in the API.
	allocdEP, allocdSlice, ep, slice time.Time
	// ackRV is the Pod's resourceVersion in the flip's answer; epRV and sliceRV those
	// of the Endpoints and slice first seen showing it: the revision clock times them.
	ackRV, epRV, sliceRV string
	// allocdSliceKey and allocdSliceRev: the slice allocd committed showing the flip
	// (namespace/name) and the revision of that commit in allocd's etcd.
	allocdSliceKey string
	allocdSliceRev int64
	err            error
}

// committed is the best estimate of when the API server committed the flip: its
// answer or the Pod's watch event, whichever came first (a watch can show the change
// before the answer arrives).
func (r *flipRec) committed() time.Time {
	if r.podSeen.IsZero() || (!r.acked.IsZero() && r.acked.Before(r.podSeen)) {
		return r.acked
	}
	return r.podSeen
}

func (r *flipRec) complete() bool { return r.err != nil || (!r.ep.IsZero() && !r.slice.IsZero()) }

// flipTracker matches the objects the followers see against the flips waiting for
// them, by Pod IP and the state flipped to: before a run every object shows the old
// state (a run starts once the previous one is fully seen), so an object showing the
// new one was written after the flip.
type flipTracker struct {
	mu   sync.Mutex
	rc   *revClock // nil: none
	recs []*flipRec
	byIP map[string]*flipRec
	left int
	done chan struct{} // closed when every flip sent is complete and no more will be
	shut bool
}

func newFlipTracker(rc *revClock) *flipTracker {
	return &flipTracker{rc: rc, byIP: map[string]*flipRec{}, done: make(chan struct{})}
}

// seen sets the field's time to when and its resourceVersion to rv, the first time,
// for the flip of ip to ready, and reports the flip when that completed it.
func (tr *flipTracker) seen(ip, svc string, ready bool, field func(*flipRec) (*time.Time, *string),
	when time.Time, rv string) {
	r := tr.byIP[ip]
	if r == nil || r.svc != svc || r.ready != ready {
		return
	}
	at, atRV := field(r)
	if !at.IsZero() {
		return
	}
	was := r.complete()
	*at, *atRV = when, rv
	if !was && r.complete() {
		tr.completed()
	}
}

func (tr *flipTracker) completed() {
	tr.left--
	if tr.left == 0 && tr.shut {
		close(tr.done)
	}
}

func (tr *flipTracker) onPod(obj runtime.Object, deleted bool, at time.Time) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || deleted {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if r := tr.byIP[pod.Status.PodIP]; r != nil && r.pod == pod.Name && r.podSeen.IsZero() && podReady(pod) == r.ready {
		r.podSeen = at
	}
}

func (tr *flipTracker) onEndpoints(obj runtime.Object, deleted bool, at time.Time) {
	ep, ok := obj.(*corev1.Endpoints)
	if !ok || deleted {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	field := func(r *flipRec) (*time.Time, *string) { return &r.ep, &r.epRV }
	for _, s := range ep.Subsets {
		for _, a := range s.Addresses {
			tr.seen(a.IP, ep.Name, true, field, at, ep.ResourceVersion)
		}
		for _, a := range s.NotReadyAddresses {
			tr.seen(a.IP, ep.Name, false, field, at, ep.ResourceVersion)
		}
	}
}

func (tr *flipTracker) onSlice(obj runtime.Object, deleted bool, at time.Time) {
	sl, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok || deleted {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	field := func(r *flipRec) (*time.Time, *string) { return &r.slice, &r.sliceRV }
	for _, e := range sl.Endpoints {
		if len(e.Addresses) > 0 {
			tr.seen(e.Addresses[0], sl.Labels[discoveryv1.LabelServiceName], sliceReady(e), field, at, sl.ResourceVersion)
		}
	}
}

// onAllocdEP and onAllocdSlice record allocd's commits; they complete no flip.
func (tr *flipTracker) onAllocdEP(ep *allocdv1.ServiceEndpoints, at time.Time) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, s := range ep.GetSubsets() {
		for _, a := range s.GetAddresses() {
			tr.seenAllocd(a.GetIp(), ep.GetName(), true, func(r *flipRec) *time.Time { return &r.allocdEP }, at)
		}
		for _, a := range s.GetNotReadyAddresses() {
			tr.seenAllocd(a.GetIp(), ep.GetName(), false, func(r *flipRec) *time.Time { return &r.allocdEP }, at)
		}
	}
}

func (tr *flipTracker) onAllocdSlice(sl *allocdv1.EndpointSlice, at time.Time) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, e := range sl.GetEndpoints() {
		if len(e.GetAddresses()) == 0 {
			continue
		}
		r := tr.byIP[e.GetAddresses()[0]]
		first := r != nil && r.allocdSlice.IsZero()
		tr.seenAllocd(e.GetAddresses()[0], sl.GetLabels()[discoveryv1.LabelServiceName],
			e.GetConditions().GetReady(), func(r *flipRec) *time.Time { return &r.allocdSlice }, at)
		if first && !r.allocdSlice.IsZero() {
			r.allocdSliceKey, r.allocdSliceRev = sl.GetNamespace()+"/"+sl.GetName(), sl.GetRevision()
		}
	}
}

func (tr *flipTracker) seenAllocd(ip, svc string, ready bool, field func(*flipRec) *time.Time, when time.Time) {
	if r := tr.byIP[ip]; r != nil && r.svc == svc && r.ready == ready && field(r).IsZero() {
		*field(r) = when
	}
}

// add registers a flip before its request goes out.
func (tr *flipTracker) add(r *flipRec) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.recs = append(tr.recs, r)
	tr.byIP[r.ip] = r
	tr.left++
}

// answered records the API server's answer to r's request.
func (tr *flipTracker) answered(r *flipRec, at time.Time, rv string, err error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	r.acked, r.ackRV = at, rv
	if err != nil && !r.complete() {
		r.err = err
		tr.completed()
	}
}

// sent says that no more flips come: done closes once every one is complete.
func (tr *flipTracker) sentAll() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.shut = true
	if tr.left == 0 {
		close(tr.done)
	}
}

var (
	readyPatch    = []byte(`{"status":{"conditions":[{"type":"Ready","status":"True","lastTransitionTime":"2026-01-03T00:00:00Z"}]}}`)
	notReadyPatch = []byte(`{"status":{"conditions":[{"type":"Ready","status":"False","lastTransitionTime":"2026-01-03T00:00:00Z"}]}}`)
)

// sendFlips sends recs' flips on their schedule, each from its own goroutine so that
// a slow answer never delays the next flip: the rate is the test's, whatever the API
// server and the controllers do. It returns once every request was answered.
func sendFlips(ctx context.Context, cs kubernetes.Interface, tr *flipTracker, recs []*flipRec) {
	var wg sync.WaitGroup
	for _, r := range recs {
		time.Sleep(time.Until(r.sched))
		r.sent = time.Now()
		tr.add(r)
		wg.Go(func() {
			patch := notReadyPatch
			if r.ready {
				patch = readyPatch
			}
			pod, err := cs.CoreV1().Pods(testNS).Patch(ctx, r.pod, types.StrategicMergePatchType, patch,
				metav1.PatchOptions{}, "status")
			rv := ""
			if err == nil {
				rv = pod.ResourceVersion
			}
			tr.answered(r, time.Now(), rv, err)
		})
	}
	wg.Wait()
	tr.sentAll()
}

// flipResult is what one run of flips on one side measured.
type flipResult struct {
	n, failed int
	// slice and ep: committed flip → the object in the API; patch: the flip's request
	// → its answer; allocd: committed flip → allocd's commit of the slice; bridge:
	// allocd's commit → the slice in the API. Only flips seen are in them.
	slice, ep, patch, allocd, bridge []time.Duration
	// sliceSched and epSched: the flip's scheduled send → the object in the API (what
	// a saturated API server adds before the flip is committed included); committed:
	// the scheduled send → the flip committed (how late the API server took it).
	sliceSched, epSched, committed []time.Duration
	// sliceRev and epRev: the flip's commit → the object's, both by the revision
	// clock (etcd's own watch); revCommitted: the scheduled send → the flip's commit
	// by the clock.
	sliceRev, epRev, revCommitted []time.Duration
	// watchLag: the flip's answer → the test's Pod watch showing it (negative when
	// the watch came first).
	watchLag []time.Duration
	// late is the most a flip went out after it was due.
	late time.Duration
	// hops: the slice's path through the bridge and allocd, hop by hop (allocd's side,
	// with the bridge's debug log).
	hops *hops
	// resumed and relisted sum the followers' resumed watches and lists after a 410.
	resumed, relisted int64
	// diag: the processes' CPU time and the side's own metrics.
	diag string
}

func (tr *flipTracker) result() flipResult {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	res := flipResult{n: len(tr.recs)}
	for _, r := range tr.recs {
		res.late = max(res.late, r.sent.Sub(r.sched))
		if r.err != nil {
			res.failed++
			continue
		}
		c := r.committed()
		res.patch = append(res.patch, r.acked.Sub(r.sent))
		res.committed = append(res.committed, c.Sub(r.sched))
		if !r.podSeen.IsZero() {
			res.watchLag = append(res.watchLag, r.podSeen.Sub(r.acked))
		}
		if !r.slice.IsZero() {
			res.slice = append(res.slice, r.slice.Sub(c))
			res.sliceSched = append(res.sliceSched, r.slice.Sub(r.sched))
		}
		if !r.ep.IsZero() {
			res.ep = append(res.ep, r.ep.Sub(c))
			res.epSched = append(res.epSched, r.ep.Sub(r.sched))
		}
		tr.byRevision(&res, r)
		if !r.allocdSlice.IsZero() {
			res.allocd = append(res.allocd, r.allocdSlice.Sub(c))
			if !r.slice.IsZero() {
				res.bridge = append(res.bridge, r.slice.Sub(r.allocdSlice))
			}
		}
	}
	return res
}

// byRevision adds r's times by the revision clock to res.
func (tr *flipTracker) byRevision(res *flipResult, r *flipRec) {
	if tr.rc == nil {
		return
	}
	c, ok := tr.rc.when(r.ackRV)
	if !ok {
		return
	}
	res.revCommitted = append(res.revCommitted, c.Sub(r.sched))
	if at, ok := tr.rc.when(r.sliceRV); ok {
		res.sliceRev = append(res.sliceRev, at.Sub(c))
	}
	if at, ok := tr.rc.when(r.epRV); ok {
		res.epRev = append(res.epRev, at.Sub(c))
	}
}

// quantile is the q quantile of d among n samples, the missing ones (flips never
// seen) counted as longer than any: ok is false when it falls among those.
func quantile(d []time.Duration, n int, q float64) (time.Duration, bool) {
	s := slices.Clone(d)
	slices.Sort(s)
	i := min(n-1, int(q*float64(n)))
	if i >= len(s) || i < 0 {
		return 0, false
	}
	return s[i], true
}

func fmtQ(d []time.Duration, n int, q float64) string {
	v, ok := quantile(d, n, q)
	if !ok {
		return "unseen"
	}
	return roundDur(v).String()
}

func roundDur(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond)
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	default:
		return d.Round(time.Millisecond)
	}
}

// line is the run's figures on one line.
func (r flipResult) line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "by etcd revision, the flip's commit → the object's: slice p50 %s p99 %s, endpoints p50 %s p99 %s "+
		"(%d, %d of %d timed), the flips committed after their scheduled send p50 %s p99 %s; as the test's watches "+
		"saw them: ", fmtQ(r.sliceRev, r.n, .5), fmtQ(r.sliceRev, r.n, .99), fmtQ(r.epRev, r.n, .5),
		fmtQ(r.epRev, r.n, .99), len(r.sliceRev), len(r.epRev), r.n,
		fmtQ(r.revCommitted, len(r.revCommitted), .5), fmtQ(r.revCommitted, len(r.revCommitted), .99))
	fmt.Fprintf(&b, "from the flip's commit: slice p50 %s p99 %s (%d of %d seen), "+
		"endpoints p50 %s p99 %s (%d seen); "+
		"from its scheduled send: slice p50 %s p99 %s, endpoints p50 %s p99 %s; "+
		"the flips committed after their scheduled send p50 %s p99 %s",
		fmtQ(r.slice, r.n, .5), fmtQ(r.slice, r.n, .99), len(r.slice), r.n,
		fmtQ(r.ep, r.n, .5), fmtQ(r.ep, r.n, .99), len(r.ep),
		fmtQ(r.sliceSched, r.n, .5), fmtQ(r.sliceSched, r.n, .99), fmtQ(r.epSched, r.n, .5), fmtQ(r.epSched, r.n, .99),
		fmtQ(r.committed, len(r.committed), .5), fmtQ(r.committed, len(r.committed), .99))
	if len(r.allocd) > 0 {
		fmt.Fprintf(&b, "; of the slice's: flip → allocd's commit p50 %s p99 %s, allocd's commit → API p50 %s p99 %s",
			fmtQ(r.allocd, len(r.allocd), .5), fmtQ(r.allocd, len(r.allocd), .99),
			fmtQ(r.bridge, len(r.bridge), .5), fmtQ(r.bridge, len(r.bridge), .99))
	}
	fmt.Fprintf(&b, "; the flips' requests p50 %s p99 %s, %d failed, sent at most %s late; "+
		"answer → Pod watch p50 %s p99 %s; watches resumed %d, relisted %d",
		fmtQ(r.patch, len(r.patch), .5), fmtQ(r.patch, len(r.patch), .99), r.failed, roundDur(r.late),
		fmtQ(r.watchLag, len(r.watchLag), .5), fmtQ(r.watchLag, len(r.watchLag), .99), r.resumed, r.relisted)
	if r.diag != "" {
		b.WriteString("\n\t" + r.diag)
	}
	if r.hops != nil {
		b.WriteString("\n\t" + r.hops.line())
	}
	return b.String()
}

// TestFlips measures readiness flips at a low rate, kube-controller-manager against
// allocd and the bridge, the way TestNumbers does at 10 and 200 flips/s (the same
// pair of clusters, one side at a time, ABBA): KUBE_E2E_FLIPS flips (default 50) at
// each rate of KUBE_E2E_FLIP_RATES per second (default 5), KUBE_E2E_RUNS runs per side
// (default 3), over 25 Services of 4 Pods. The bridge logs at debug level, so that
// allocd's side is also timed hop by hop (hops). The figures are logged, not judged
// (on a shared machine they move run by run); the test fails when a flip is not seen
// in the slices of its side. It runs with KUBE_E2E_NUMBERS=1 (make kube-numbers).
func TestFlips(t *testing.T) {
	if os.Getenv("KUBE_E2E_NUMBERS") == "" {
		t.Skip("KUBE_E2E_NUMBERS is not set (make kube-numbers)")
	}
	cfg := numbersConfig{services: 25, podsPer: 4, runs: envInt("KUBE_E2E_RUNS", 3)}
	p := newPairWith(t, "--log-level=debug")
	p.createNodes(t)
	sides := p.sides()
	p.createPods(t, cfg)
	p.eachCluster(t, func(ctx context.Context, c *cluster) error {
		return parallel(ctx, cfg.services, func(ctx context.Context, i int) error {
			_, err := c.Admin.CoreV1().Services(testNS).Create(ctx, svcSpec{name: fmt.Sprintf("n-%d", i),
				app: fmt.Sprintf("n-%d", i)}.object(), metav1.CreateOptions{})
			return err
		})
	})
	want := map[string][2]int{}
	for i := range cfg.services {
		want[fmt.Sprintf("n-%d", i)] = [2]int{cfg.podsPer, 0}
	}
	waitSameEndpoints(t, p.ref.Admin, p.alc.Admin, want, convergeLimit)
	waitSameSlices(t, p.ref.Admin, p.alc.Admin, want, nil, convergeLimit)
	n := envInt("KUBE_E2E_FLIPS", 50)
	rates := strings.Split(os.Getenv("KUBE_E2E_FLIP_RATES"), ",")
	if rates[0] == "" {
		rates = []string{"5"}
	}
	for _, r := range rates {
		var rate int
		if _, err := fmt.Sscan(r, &rate); err != nil || rate <= 0 {
			t.Fatalf("KUBE_E2E_FLIP_RATES: %q is not a rate", r)
		}
		res := p.flipRuns(t, cfg, sides, rate, time.Duration(n)*time.Second/time.Duration(rate))
		for i, runs := range res {
			for k, fr := range runs {
				if len(fr.slice) != fr.n {
					t.Errorf("%d flips/s, %s, run %d: %d of %d flips seen in the slices", rate, sides[i].name,
						k+1, len(fr.slice), fr.n)
				}
			}
		}
	}
}
