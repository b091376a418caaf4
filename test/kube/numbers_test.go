package kube

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/client"
)

// TestNumbers measures, on this machine, kube-controller-manager (its defaults: 5
// workers, --kube-api-qps 20) and allocd with the bridge (their defaults), one side at
// a time, the sides alternating (ABBA...) so that a drift of the machine's speed falls
// on both:
//
//   - the initial sync: every Service and Pod is in the cluster and the side's
//     controller (kube-controller-manager, or the bridge) is stopped; it is started,
//     and the time runs from its start until every Service's Endpoints and
//     EndpointSlices list all of its Pods, ready, in the API;
//   - readiness flips at 10 and at 200 per second, sent on schedule whatever the API
//     server and the controllers do: the time from the flip committed in the API to the
//     changed EndpointSlice (and Endpoints) in the API.
//
// Each figure is measured KUBE_E2E_RUNS times (default 3) per side (the initial sync
// KUBE_E2E_SYNC_RUNS times, default the same); the log has every run and the medians.
// The test's watches resume from their last resourceVersion and list again after a
// 410, so no flip goes unseen because a watch ended. It runs with KUBE_E2E_NUMBERS=1
// (make kube-numbers).
func TestNumbers(t *testing.T) {
	if os.Getenv("KUBE_E2E_NUMBERS") == "" {
		t.Skip("KUBE_E2E_NUMBERS is not set (make kube-numbers)")
	}
	cfg := numbersConfig{
		services: envInt("KUBE_E2E_SERVICES", 1000),
		podsPer:  envInt("KUBE_E2E_PODS_PER_SERVICE", 10),
		runs:     envInt("KUBE_E2E_RUNS", 3),
	}
	p := newPair(t)
	p.createNodes(t)
	sides := p.sides()
	p.createPods(t, cfg)
	var syncs [2][]time.Duration
	syncRuns := envInt("KUBE_E2E_SYNC_RUNS", cfg.runs)
	for r := range syncRuns {
		d := p.initialSync(t, cfg, sides, r)
		for i := range sides {
			if d[i] > 0 {
				syncs[i] = append(syncs[i], d[i])
			}
		}
	}
	t.Logf("initial sync of %d Services / %d Pods, from the controller's start to every Endpoints and slice "+
		"complete, median [min, max] of %d runs: %s %s; %s %s", cfg.services, cfg.services*cfg.podsPer, syncRuns,
		sides[0].name, spread(syncs[0]), sides[1].name, spread(syncs[1]))
	for _, f := range []struct {
		rate int
		d    time.Duration
	}{{10, envSeconds("KUBE_E2E_FLIP_SECONDS_10", 60)}, {200, envSeconds("KUBE_E2E_FLIP_SECONDS_200", 20)}} {
		if r := os.Getenv("KUBE_E2E_RATES"); r == "" || slices.Contains(strings.Split(r, ","), fmt.Sprint(f.rate)) {
			p.flipRuns(t, cfg, sides, f.rate, f.d)
		}
	}
}

type numbersConfig struct {
	services, podsPer, runs int
}

func (c numbersConfig) pods() int { return c.services * c.podsPer }

// podOf is the name and IP of Pod j of Service s.
func (c numbersConfig) podOf(s, j int) (svc, pod, ip string) {
	return fmt.Sprintf("n-%d", s), fmt.Sprintf("n-%d-%d", s, j), podIP4(s*c.podsPer + j)
}

func envInt(name string, def int) int {
	var n int
	if _, err := fmt.Sscan(os.Getenv(name), &n); err != nil || n <= 0 {
		return def
	}
	return n
}

func envSeconds(name string, def int) time.Duration {
	return time.Duration(envInt(name, def)) * time.Second
}

// side is one of the two measured: a cluster and the process that writes its
// Endpoints and slices (paused by stopping it).
type side struct {
	name   string
	etcd   *clientv3.Client // of the etcd under both clusters: the revision clock's
	c      *cluster
	ctrl   *proc
	allocd *client.Client // allocd's side only: its commits are followed too
	// procs are the side's processes (their CPU time is reported); metrics the
	// Prometheus endpoints whose figures are reported.
	procs   []*proc
	metrics []string
	// flips is the state of the side's cluster's Pods (shared by two sides of one
	// cluster).
	flips *flipState
	// bridge is allocd's side's; bridgeArgs, when set, are the bridge's arguments on
	// this side: the bridge is started again with them before the side is measured
	// (KUBE_E2E_BRIDGE_B).
	bridge     *allocdSide
	bridgeArgs []string
}

// flipState is what the flips did to a cluster's Pods: next is the next Pod to flip
// (in turn over the Services), notReady the Pods flipped to not ready.
type flipState struct {
	next     int
	notReady map[string]bool
}

// bridgeB is KUBE_E2E_BRIDGE_B: extra arguments of the bridge that, when set, make
// the test compare the bridge with them (side A, in place of kube-controller-manager)
// against the bridge without them (side B), on allocd's cluster; the initial sync is
// then measured on side B alone.
func bridgeB() []string { return strings.Fields(os.Getenv("KUBE_E2E_BRIDGE_B")) }

// useBridgeArgs makes the running bridge's arguments the side's, starting it again
// (when running is set) if they differ.
func (s *side) useBridgeArgs(t *testing.T, running bool) {
	if s.bridgeArgs == nil || slices.Equal(s.bridge.Bridge.args, s.bridgeArgs) {
		return
	}
	s.bridge.Bridge.Stop()
	s.bridge.Bridge.args = s.bridgeArgs
	if running {
		s.bridge.Bridge.Start()
		s.bridge.WaitBridgeReady(t)
	}
}

func (p *pair) sides() []*side {
	etcd := p.etcd.NewClient()
	alcFlips := &flipState{notReady: map[string]bool{}}
	alc := &side{name: "allocd+bridge", etcd: etcd, c: p.alc, ctrl: p.allocd.Bridge, allocd: p.allocd.Client,
		bridge: p.allocd,
		flips:  alcFlips, procs: []*proc{p.alc.APIServer, p.alc.KCM, p.allocd.Bridge},
		metrics: []string{"http://" + p.allocd.bridgeHealth + "/metrics"}}
	for i, r := range p.allocd.Replicas {
		alc.procs = append(alc.procs, r)
		alc.metrics = append(alc.metrics, "http://"+p.allocd.Metrics[i]+"/metrics")
	}
	if b := bridgeB(); len(b) > 0 {
		alc.bridgeArgs = slices.Clone(p.allocd.bridgeArgs)
		a := *alc
		a.name = "allocd+bridge " + strings.Join(b, " ")
		a.bridgeArgs = append(slices.Clone(alc.bridgeArgs), b...)
		a.procs, a.metrics = slices.Clone(alc.procs), slices.Clone(alc.metrics)
		return []*side{&a, alc}
	}
	return []*side{
		{name: "kube-controller-manager", etcd: etcd, c: p.ref, ctrl: p.ref.KCM,
			flips: &flipState{notReady: map[string]bool{}},
			procs: []*proc{p.ref.APIServer, p.ref.KCM}},
		alc,
	}
}

// order is the order of the sides in run r: A B, then B A, and so on; sync says
// that it is for the initial sync.
// KUBE_E2E_SIDES=allocd (for a contributor's quicker loop) measures allocd's side alone.
func order(r int, sync bool) []int {
	if os.Getenv("KUBE_E2E_SIDES") == "allocd" {
		return []int{1}
	}
	if len(bridgeB()) > 0 && sync {
		return []int{1}
	}
	if r%2 == 0 {
		return []int{0, 1}
	}
	return []int{1, 0}
}

// createNodes creates three Ready Nodes in both clusters, node-i in zone-i.
func (p *pair) createNodes(t *testing.T) {
	p.both(t, func(ctx context.Context, cs kubernetes.Interface) error {
		for i := range 3 {
			if err := createNode(ctx, cs, fmt.Sprintf("node-%d", i), fmt.Sprintf("zone-%d", i)); err != nil {
				return err
			}
		}
		return nil
	})
}

// createPods creates every Pod, ready, in both clusters, before any Service.
func (p *pair) createPods(t *testing.T, cfg numbersConfig) {
	start := time.Now()
	p.eachCluster(t, func(ctx context.Context, c *cluster) error {
		return parallel(ctx, cfg.pods(), func(ctx context.Context, i int) error {
			_, pod, ip := cfg.podOf(i/cfg.podsPer, i%cfg.podsPer)
			return createPod(ctx, c.Admin, podSpec{name: pod, app: fmt.Sprintf("n-%d", i/cfg.podsPer),
				node: fmt.Sprintf("node-%d", i%3), ip4: ip, ready: true})
		})
	})
	t.Logf("%d Pods created in each cluster in %v", cfg.pods(), time.Since(start).Round(time.Second))
}

// initialSync runs one round of the initial sync: the Services are deleted (after the
// first round) with the controllers running, until no Endpoints or slice is left; the
// controllers are stopped, the Services created again in both clusters, and each side's
// controller started in turn and timed.
func (p *pair) initialSync(t *testing.T, cfg numbersConfig, sides []*side, r int) [2]time.Duration {
	if r > 0 {
		p.deleteServices(t)
	}
	for _, s := range sides {
		s.ctrl.Stop()
	}
	start := time.Now()
	p.eachCluster(t, func(ctx context.Context, c *cluster) error {
		return parallel(ctx, cfg.services, func(ctx context.Context, i int) error {
			_, err := c.Admin.CoreV1().Services(testNS).Create(ctx, svcSpec{name: fmt.Sprintf("n-%d", i),
				app: fmt.Sprintf("n-%d", i)}.object(), metav1.CreateOptions{})
			return err
		})
	})
	t.Logf("run %d: %d Services created in each cluster in %v, controllers stopped", r+1, cfg.services,
		time.Since(start).Round(time.Second))
	var out [2]time.Duration
	for _, i := range order(r, true) {
		sides[i].useBridgeArgs(t, false)
		out[i] = sides[i].timeSync(t, cfg)
		t.Logf("run %d: initial sync, %s: %v", r+1, sides[i].name, roundDur(out[i]))
	}
	return out
}

// timeSync starts the side's controller and returns the time until every Service's
// Endpoints and slices list all of its Pods as ready.
func (s *side) timeSync(t *testing.T, cfg numbersConfig) time.Duration {
	ctx, cancel := context.WithCancel(context.Background())
	tr := newSyncTracker(cfg)
	eps := newFollower(endpointsLW(s.c.Admin, testNS), tr.onEndpoints)
	sls := newFollower(slicesLW(s.c.Admin, testNS), tr.onSlice)
	d1, d2 := eps.start(ctx), sls.start(ctx)
	defer func() { cancel(); <-d1; <-d2 }()
	start := time.Now()
	s.ctrl.Start()
	select {
	case <-tr.done:
	case <-time.After(20 * time.Minute):
		t.Fatalf("%s: initial sync: %d of %d Services complete after 20 minutes", s.name, tr.count(), cfg.services)
	}
	return tr.at.Sub(start)
}

// syncTracker counts the Services whose Endpoints and slices are complete: every one
// of its Pods listed, ready, and nothing else.
type syncTracker struct {
	mu       sync.Mutex
	cfg      numbersConfig
	eps      map[string]bool           // Service → its Endpoints are complete
	slices   map[string]map[string]int // Service → slice → its Pods ready in it (-1: anything else)
	complete map[string]bool
	at       time.Time
	done     chan struct{}
}

func newSyncTracker(cfg numbersConfig) *syncTracker {
	return &syncTracker{cfg: cfg, eps: map[string]bool{}, slices: map[string]map[string]int{},
		complete: map[string]bool{}, done: make(chan struct{})}
}

func (tr *syncTracker) count() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.complete)
}

// ownIP reports whether ip is the address of one of svc's Pods.
func (tr *syncTracker) ownIP(svc, ip string) bool {
	var s int
	if _, err := fmt.Sscanf(svc, "n-%d", &s); err != nil {
		return false
	}
	i := ipIndex(ip)
	return i >= s*tr.cfg.podsPer && i < (s+1)*tr.cfg.podsPer
}

// ipIndex inverts podIP4: -1 for an address that is not one.
func ipIndex(ip string) int {
	var a, b int
	if _, err := fmt.Sscanf(ip, "10.244.%d.%d", &a, &b); err != nil || b < 1 || b > 250 {
		return -1
	}
	return a*250 + b - 1
}

func (tr *syncTracker) onEndpoints(obj runtime.Object, deleted bool, at time.Time) {
	ep, ok := obj.(*corev1.Endpoints)
	if !ok || !strings.HasPrefix(ep.Name, "n-") {
		return
	}
	good, bad := 0, false
	for _, s := range ep.Subsets {
		for _, a := range s.Addresses {
			if tr.ownIP(ep.Name, a.IP) {
				good++
			} else {
				bad = true
			}
		}
		bad = bad || len(s.NotReadyAddresses) > 0
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.eps[ep.Name] = !deleted && !bad && good == tr.cfg.podsPer
	tr.update(ep.Name, at)
}

func (tr *syncTracker) onSlice(obj runtime.Object, deleted bool, at time.Time) {
	sl, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok || !strings.HasPrefix(sl.Labels[discoveryv1.LabelServiceName], "n-") {
		return
	}
	svc := sl.Labels[discoveryv1.LabelServiceName]
	good := 0
	for _, e := range sl.Endpoints {
		if len(e.Addresses) == 1 && sliceReady(e) && tr.ownIP(svc, e.Addresses[0]) {
			good++
		} else {
			good = -1
			break
		}
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.slices[svc] == nil {
		tr.slices[svc] = map[string]int{}
	}
	if deleted {
		delete(tr.slices[svc], sl.Name)
	} else {
		tr.slices[svc][sl.Name] = good
	}
	tr.update(svc, at)
}

func (tr *syncTracker) update(svc string, at time.Time) {
	n, ok := 0, tr.eps[svc]
	for _, g := range tr.slices[svc] {
		ok = ok && g >= 0
		n += g
	}
	if ok && n == tr.cfg.podsPer {
		tr.complete[svc] = true
	} else {
		delete(tr.complete, svc)
	}
	if len(tr.complete) == tr.cfg.services && tr.at.IsZero() {
		tr.at = at
		close(tr.done)
	}
}

// deleteServices deletes every Service of the test namespace in both clusters, the
// controllers running, and waits until no Endpoints or EndpointSlice is left there.
func (p *pair) deleteServices(t *testing.T) {
	start := time.Now()
	p.eachCluster(t, func(ctx context.Context, c *cluster) error {
		list, err := c.Admin.CoreV1().Services(testNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		err = parallel(ctx, len(list.Items), func(ctx context.Context, i int) error {
			return c.Admin.CoreV1().Services(testNS).Delete(ctx, list.Items[i].Name, metav1.DeleteOptions{})
		})
		if err != nil {
			return err
		}
		for time.Since(start) < 10*time.Minute {
			eps, err := c.Admin.CoreV1().Endpoints(testNS).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			sls, err := c.Admin.DiscoveryV1().EndpointSlices(testNS).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			if len(eps.Items)+len(sls.Items) == 0 {
				return nil
			}
			time.Sleep(2 * time.Second)
		}
		return fmt.Errorf("Endpoints or slices left 10 minutes after their Services were deleted")
	})
	t.Logf("Services deleted, their Endpoints and slices gone, in %v", time.Since(start).Round(time.Second))
}

// spread is "median [min, max]" of d.
func spread(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return fmt.Sprintf("%v [%v, %v]", roundDur(s[len(s)/2]), roundDur(s[0]), roundDur(s[len(s)-1]))
}

// flipRuns measures runs of rate flips/s for d on each side in turn, and returns each
// side's runs.
func (p *pair) flipRuns(t *testing.T, cfg numbersConfig, sides []*side, rate int,
	d time.Duration) [2][]flipResult {
	n := int(float64(rate) * d.Seconds())
	if n > cfg.pods() {
		t.Fatalf("%d flips in a run need as many Pods; there are %d", n, cfg.pods())
	}
	res := [2][]flipResult{}
	for r := range cfg.runs {
		for _, i := range order(r, false) {
			sides[i].useBridgeArgs(t, true)
			fr := sides[i].flipRun(t, cfg, rate, n)
			res[i] = append(res[i], fr)
			t.Logf("run %d, %d flips at %d/s, %s: %s", r+1, n, rate, sides[i].name, fr.line())
		}
	}
	for i, s := range sides {
		t.Logf("%d flips/s, %s, median [min, max] of %d runs: by etcd revision, the flip's commit → the object's: "+
			"slice p50 %s, p99 %s; Endpoints p50 %s, p99 %s; the flips committed after their scheduled send p50 %s, "+
			"p99 %s", rate, s.name, cfg.runs, summary(res[i], sliceRevPick, .5), summary(res[i], sliceRevPick, .99),
			summary(res[i], epRevPick, .5), summary(res[i], epRevPick, .99), summary(res[i], revCommittedPick, .5),
			summary(res[i], revCommittedPick, .99))
		t.Logf("%d flips/s, %s, median [min, max] of %d runs, as the test's watches saw them: from the flip's "+
			"commit in the API: slice p50 %s, p99 %s; "+
			"Endpoints p50 %s, p99 %s; from the flip's scheduled send: slice p50 %s, p99 %s; Endpoints p50 %s, p99 %s; "+
			"the flips committed after their scheduled send p50 %s, p99 %s", rate, s.name, cfg.runs,
			summary(res[i], slicePick, .5), summary(res[i], slicePick, .99), summary(res[i], epPick, .5),
			summary(res[i], epPick, .99), summary(res[i], sliceSchedPick, .5), summary(res[i], sliceSchedPick, .99),
			summary(res[i], epSchedPick, .5), summary(res[i], epSchedPick, .99),
			summary(res[i], committedPick, .5), summary(res[i], committedPick, .99))
	}
	for _, f := range []struct {
		from string
		pick func(flipResult) []time.Duration
	}{{"the flip's commit to the slice's, by etcd revision", sliceRevPick},
		{"the flip's commit (as the test saw it)", slicePick}, {"the flip's scheduled send", sliceSchedPick}} {
		t.Logf("%d flips/s, from %s: slice p99 %s / %s, run by run: %s",
			rate, f.from, sides[0].name, sides[1].name, p99Ratios(res, f.pick))
	}
	for i, s := range sides {
		if line := hopsSummary(res[i]); line != "" {
			t.Logf("%d flips/s, %s, hop by hop, median [min, max] of %d runs:%s", rate, s.name, cfg.runs,
				line)
		}
	}
	return res
}

// The figures of a flipResult that summary and p99Ratios pick.
func slicePick(r flipResult) []time.Duration        { return r.slice }
func epPick(r flipResult) []time.Duration           { return r.ep }
func sliceSchedPick(r flipResult) []time.Duration   { return r.sliceSched }
func epSchedPick(r flipResult) []time.Duration      { return r.epSched }
func committedPick(r flipResult) []time.Duration    { return r.committed }
func sliceRevPick(r flipResult) []time.Duration     { return r.sliceRev }
func epRevPick(r flipResult) []time.Duration        { return r.epRev }
func revCommittedPick(r flipResult) []time.Duration { return r.revCommitted }

// p99Ratios is, run by run, the ratio of the p99s of pick of the two sides.
func p99Ratios(res [2][]flipResult, pick func(flipResult) []time.Duration) string {
	var ratios []string
	for r := range min(len(res[0]), len(res[1])) {
		a, okA := quantile(pick(res[0][r]), res[0][r].n, .99)
		b, okB := quantile(pick(res[1][r]), res[1][r].n, .99)
		if okA && okB && b > 0 {
			ratios = append(ratios, fmt.Sprintf("%.1f", float64(a)/float64(b)))
		} else {
			ratios = append(ratios, "n/a")
		}
	}
	return strings.Join(ratios, ", ")
}

// summary is the median [min, max] over runs of each run's q quantile.
func summary(runs []flipResult, pick func(flipResult) []time.Duration, q float64) string {
	var qs []time.Duration
	unseen := 0
	for _, r := range runs {
		v, ok := quantile(pick(r), r.n, q)
		if !ok {
			unseen++
			continue
		}
		qs = append(qs, v)
	}
	if unseen > 0 {
		return fmt.Sprintf("%s (%d runs with that quantile unseen)", spread(qs), unseen)
	}
	return spread(qs)
}

// flipRun flips n Pods of the side at rate per second, each to the state it is not
// in, and measures each flip; it returns once every flip was seen in the Endpoints and
// a slice, or 5 minutes after the last was sent.
func (s *side) flipRun(t *testing.T, cfg numbersConfig, rate, n int) flipResult {
	ctx, cancel := context.WithCancel(context.Background())
	rc, rcDone, err := startRevClock(ctx, s.etcd, "/"+s.c.name+"/")
	if err != nil {
		t.Fatal(err)
	}
	tr := newFlipTracker(rc)
	fols := []*follower{
		newFollower(podsLW(s.c.Admin, testNS), tr.onPod),
		newFollower(endpointsLW(s.c.Admin, testNS), tr.onEndpoints),
		newFollower(slicesLW(s.c.Admin, testNS), tr.onSlice),
	}
	dones := []<-chan struct{}{rcDone}
	for _, f := range fols {
		dones = append(dones, f.start(ctx))
	}
	if s.allocd != nil {
		dones = append(dones, followAllocd(ctx, s.allocd, testNS, tr.onAllocdEP, tr.onAllocdSlice))
	}
	recs := s.plan(cfg, rate, n)
	began := time.Now()
	u, before := startUsage(s.procs...), s.scrape()
	if os.Getenv("KUBE_E2E_PROFILE") != "" {
		go s.profile(ctx, t, fmt.Sprintf("%s-%d", s.c.name, rate))
	}
	sendFlips(ctx, s.c.Admin, tr, recs)
	select {
	case <-tr.done:
	case <-time.After(5 * time.Minute):
	}
	diag := u.String() + s.metricsLine(before, s.scrape())
	cancel()
	for _, d := range dones {
		<-d
	}
	res := tr.result()
	for _, f := range fols {
		res.resumed += f.resumed.Load()
		res.relisted += f.relisted.Load()
	}
	res.diag = diag
	if s.bridge != nil && slices.Contains(s.bridge.Bridge.args, "--log-level=debug") {
		lines, err := readLog(s.bridge.Bridge.log, began)
		if err != nil {
			t.Fatalf("the bridge's log: %v", err)
		}
		res.hops = bridgeHops(tr.recs, lines, rc)
	}
	s.settle(t, tr)
	return res
}

// scrape reads the side's metrics endpoints into one map (series summed over them).
func (s *side) scrape() map[string]float64 {
	out := map[string]float64{}
	for _, url := range s.metrics {
		for k, v := range scrape(url) {
			out[k] += v
		}
	}
	return out
}

// metricsLine says, from the side's metrics, what allocd and the bridge did between
// before and after: allocd's time from an event to its commit, the bridge's time per
// write, and its writes.
func (s *side) metricsLine(before, after map[string]float64) string {
	if len(s.metrics) == 0 {
		return ""
	}
	mean := func(sum, count string) string {
		d := metricsDelta(before, after, sum)[""]
		n := metricsDelta(before, after, count)[""]
		if n == 0 {
			return "none"
		}
		return fmt.Sprintf("%v (%d)", roundDur(time.Duration(d/n*float64(time.Second))), int(n))
	}
	var b strings.Builder
	for _, k := range []string{"endpoints", "endpointslice"} {
		fmt.Fprintf(&b, "; allocd %s event→commit mean %s", k,
			mean("allocd_"+k+"_event_to_commit_seconds_sum", "allocd_"+k+"_event_to_commit_seconds_count"))
	}
	push := func(suffix string) float64 {
		n := 0.0
		for k, v := range metricsDelta(before, after, "grpc_server_handling_seconds_"+suffix) {
			if strings.Contains(k, `grpc_method="PushEvents"`) {
				n += v
			}
		}
		return n
	}
	if n := push("count"); n > 0 {
		fmt.Fprintf(&b, "; allocd PushEvents mean %v (%d)", roundDur(time.Duration(push("sum")/n*float64(time.Second))), int(n))
	}
	for _, k := range []string{"endpoints", "endpointslices"} {
		l := `{kind="` + k + `"}`
		fmt.Fprintf(&b, "; bridge %s sync mean %s, updates %d", k,
			mean("allocd_bridge_sync_duration_seconds_sum"+l, "allocd_bridge_sync_duration_seconds_count"+l),
			int(metricsDelta(before, after, `allocd_bridge_writes_total{kind="`+k+`",verb="update"}`)[""]))
	}
	return b.String()
}

// plan is the next n flips of the side, due at rate per second from 200 ms on.
func (s *side) plan(cfg numbersConfig, rate, n int) []*flipRec {
	start := time.Now().Add(200 * time.Millisecond)
	recs := make([]*flipRec, n)
	for k := range n {
		i := s.flips.next
		s.flips.next++
		svc, pod, ip := cfg.podOf(i%cfg.services, (i/cfg.services)%cfg.podsPer)
		recs[k] = &flipRec{svc: svc, pod: pod, ip: ip, ready: s.flips.notReady[pod],
			sched: start.Add(time.Duration(k) * time.Second / time.Duration(rate))}
	}
	return recs
}

// settle records the Pods' new states; a flip whose request failed is read back.
func (s *side) settle(t *testing.T, tr *flipTracker) {
	for _, r := range tr.recs {
		ready := r.ready
		if r.err != nil {
			pod, err := s.c.Admin.CoreV1().Pods(testNS).Get(context.Background(), r.pod, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("%s: flip of %s failed (%v), and reading it back too: %v", s.name, r.pod, r.err, err)
			}
			ready = podReady(pod)
		}
		if ready {
			delete(s.flips.notReady, r.pod)
		} else {
			s.flips.notReady[r.pod] = true
		}
	}
}

// profile saves CPU profiles of the side's kube-apiserver and, on allocd's side, of
// the bridge, over 15 s, into the logs (KUBE_E2E_PROFILE=1, which also turns
// kube-apiserver's and the bridge's --profiling on).
func (s *side) profile(ctx context.Context, t *testing.T, name string) {
	var wg sync.WaitGroup
	wg.Go(func() {
		b, err := s.c.Admin.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", "15").DoRaw(ctx)
		saveProfile(t, name+"-kube-apiserver", b, err)
	})
	if s.bridge != nil {
		wg.Go(func() {
			b, err := httpGet(ctx, "http://"+s.bridge.bridgeHealth+"/debug/pprof/profile?seconds=15")
			saveProfile(t, name+"-allocd-bridge", b, err)
		})
	}
	wg.Wait()
}

func saveProfile(t *testing.T, name string, b []byte, err error) {
	if err == nil {
		err = os.WriteFile(filepath.Join(logDir(t), name+".pprof"), b, 0o644)
	}
	if err != nil {
		t.Logf("profile %s: %v", name, err)
	}
}

// httpGet is the body of url (an error unless 200 OK).
func httpGet(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b, err
}
