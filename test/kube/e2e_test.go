package kube

import (
	"context"
	"crypto/x509/pkix"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// advertise is both API servers' --advertise-address: a documentation address that
// nothing dials (Endpoints refuse loopback addresses), the same in both clusters so
// that their kubernetes Endpoints compare.
const advertise = "192.0.2.1"

// pair is the differential setup: a reference cluster whose kube-controller-manager
// runs the endpoint controllers, and a cluster where allocd and the bridge do.
type pair struct {
	etcd   *etcdtest.Server
	ref    *cluster
	alc    *cluster
	allocd *allocdSide
	lease  *proc
	// moved are the Nodes moved to another zone (see movedZones).
	moved movedZones
}

func newPair(t *testing.T) *pair {
	t.Helper()
	return newPairWith(t)
}

// newPairWith is newPair with the bridge's extra arguments.
func newPairWith(t *testing.T, extra ...string) *pair {
	t.Helper()
	p := &pair{etcd: etcdtest.New(t)}
	var g errgroup.Group
	// kube-controller-manager's garbage collector deletes a deleted Service's
	// EndpointSlices (their owner reference), and endpointslicemirroring mirrors the
	// Endpoints of Services without selector, in both clusters alike.
	g.Go(func() error {
		p.ref = startCluster(t, clusterConfig{name: "ref", etcd: p.etcd.Endpoint, reconciler: "lease",
			controllers: "endpoint,endpointslice,endpointslicemirroring,garbagecollector", advertise: advertise})
		return nil
	})
	g.Go(func() error {
		p.alc = startCluster(t, clusterConfig{name: "alc", etcd: p.etcd.Endpoint, reconciler: "none",
			controllers: "endpointslicemirroring,garbagecollector", advertise: advertise})
		return nil
	})
	_ = g.Wait()
	if t.Failed() {
		t.FailNow()
	}
	port := p.alc.URL[len("https://127.0.0.1:"):]
	p.allocd = startAllocd(t, p.etcd.Endpoint, 2, "--kubernetes-service-port="+port)
	p.lease = startProc(t, "allocd-bridge-lease", binary(t, "allocd-bridge"), "lease",
		"--allocd-address="+p.allocd.target(), "--advertise-address="+advertise, "--lease-ttl=15s")
	kubeconfig := p.bridgeKubeconfig(t)
	bridgeArgs := append([]string{"--manage-kubernetes-service"}, extra...)
	if os.Getenv("KUBE_E2E_PROFILE") != "" {
		bridgeArgs = append(bridgeArgs, "--profiling")
	}
	p.allocd.startBridge(t, p.alc, kubeconfig, bridgeArgs...)
	for _, c := range []*cluster{p.ref, p.alc} {
		mustCreateNamespace(t, c.Admin, testNS)
	}
	return p
}

// bridgeKubeconfig is the bridge's kubeconfig in allocd's cluster: a user bound to the
// ClusterRole of deploy/kube (applied here as the manifest defines it), so that the
// test also proves the manifest's rules enough.
func (p *pair) bridgeKubeconfig(t *testing.T) string {
	t.Helper()
	applyBridgeRBAC(t, p.alc.Admin, "allocd-bridge-user")
	return p.alc.pki.kubeconfig(t, "bridge", p.alc.URL, pkix.Name{CommonName: "allocd-bridge-user"})
}

// both runs fn against both clusters at once.
func (p *pair) both(t testing.TB, fn func(ctx context.Context, cs kubernetes.Interface) error) {
	t.Helper()
	p.eachCluster(t, func(ctx context.Context, c *cluster) error { return fn(ctx, c.Admin) })
}

// eachCluster runs fn against both clusters at once.
func (p *pair) eachCluster(t testing.TB, fn func(ctx context.Context, c *cluster) error) {
	t.Helper()
	g, ctx := errgroup.WithContext(context.Background())
	for _, c := range []*cluster{p.ref, p.alc} {
		g.Go(func() error {
			if err := fn(ctx, c); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

// parallel runs fn(i) for i in [0, n) with 32 at a time.
func parallel(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for i := range n {
		g.Go(func() error { return fn(ctx, i) })
	}
	return g.Wait()
}

const convergeLimit = 90 * time.Second

// TestKube is the differential test and what hangs on its state: the same objects and
// changes go to both clusters, and their Endpoints must be equal after each step.
func TestKube(t *testing.T) {
	p := newPair(t)
	t.Run("endpoints", p.testEndpoints)
	t.Run("kubernetes service", p.testKubernetesService)
	t.Run("faults", p.testFaults)
	t.Run("adoption", p.testAdoption)
}

func (p *pair) testEndpoints(t *testing.T) {
	zones := []string{"zone-a", "zone-b", "zone-c"}
	p.both(t, func(ctx context.Context, cs kubernetes.Interface) error {
		for i, z := range zones {
			if err := createNode(ctx, cs, fmt.Sprintf("node-%d", i), z); err != nil {
				return err
			}
		}
		for _, s := range []svcSpec{
			{name: "web", app: "web", labels: map[string]string{"tier": "front"}},
			{name: "head", app: "web", headless: true},
			{name: "bare", app: "db", headless: true, noPorts: true},
			{name: "dual", app: "dual", dualStack: true},
			{name: "np", app: "np", nodePort: true},
			{name: "big", app: "big"},
		} {
			if _, err := cs.CoreV1().Services(testNS).Create(ctx, s.object(), metav1.CreateOptions{}); err != nil {
				return err
			}
		}
		var pods []podSpec
		for i := range 10 {
			pods = append(pods, podSpec{name: fmt.Sprintf("web-%d", i), app: "web", node: fmt.Sprintf("node-%d", i%3),
				ip4: podIP4(i), ready: i < 8})
		}
		for i := range 4 {
			pods = append(pods, podSpec{name: fmt.Sprintf("dual-%d", i), app: "dual", node: "node-1",
				ip4: podIP4(100 + i), ip6: podIP6(100 + i), ready: true})
		}
		for i := range 3 {
			pods = append(pods, podSpec{name: fmt.Sprintf("np-%d", i), app: "np", node: "node-2", ip4: podIP4(200 + i),
				ready: true})
		}
		for i := range 3 { // of the headless Service without ports
			pods = append(pods, podSpec{name: fmt.Sprintf("db-%d", i), app: "db",
				node: fmt.Sprintf("node-%d", i), ip4: podIP4(300 + i), ready: i < 2})
		}
		return parallel(ctx, len(pods), func(ctx context.Context, i int) error { return createPod(ctx, cs, pods[i]) })
	})
	want := map[string][2]int{"web": {8, 2}, "head": {8, 2}, "bare": {2, 1}, "dual": {4, 0}, "np": {3, 0},
		"big": {0, 0}}
	t.Run("initial sync", func(t *testing.T) { p.converge(t, want, 0, convergeLimit) })

	flip := metav1.NewTime(readyTime.Add(time.Hour))
	p.both(t, func(ctx context.Context, cs kubernetes.Interface) error {
		if err := setReady(ctx, cs, "web-0", false, flip); err != nil {
			return err
		}
		return setReady(ctx, cs, "web-9", true, flip)
	})
	t.Run("readiness flips", func(t *testing.T) { p.converge(t, want, 0, convergeLimit) })
	p.both(t, func(ctx context.Context, cs kubernetes.Interface) error {
		return setReady(ctx, cs, "web-1", false, flip)
	})
	want["web"], want["head"] = [2]int{7, 3}, [2]int{7, 3}
	t.Run("readiness flip", func(t *testing.T) { p.converge(t, want, 0, convergeLimit) })

	for _, n := range []int{150, 1100} {
		p.scale(t, "big", n)
		want["big"] = [2]int{min(n, 1000), 0}
		t.Run(fmt.Sprintf("scale up to %d", n), func(t *testing.T) { p.converge(t, want, 0, 3*convergeLimit) })
	}
	for _, n := range []int{900, 60} {
		p.scale(t, "big", n)
		want["big"] = [2]int{n, 0}
		t.Run(fmt.Sprintf("scale down to %d", n), func(t *testing.T) { p.converge(t, want, 0, 3*convergeLimit) })
	}

	p.both(t, func(ctx context.Context, cs kubernetes.Interface) error {
		if err := deletePod(ctx, cs, "web-2", true); err != nil {
			return err
		}
		return deletePod(ctx, cs, "web-0", true)
	})
	want["web"], want["head"] = [2]int{6, 2}, [2]int{6, 2}
	// Terminating Pods leave the Endpoints but stay in the slices (terminating: true).
	t.Run("terminating pods", func(t *testing.T) { p.converge(t, want, 2, convergeLimit) })

	p.both(t, func(ctx context.Context, cs kubernetes.Interface) error {
		return setNodeZone(ctx, cs, "node-1", "zone-c")
	})
	p.moved = movedZones{"node-1": "zone-c"}
	t.Run("node changes zone", func(t *testing.T) { p.converge(t, want, 2, convergeLimit) })

	p.both(t, func(ctx context.Context, cs kubernetes.Interface) error {
		return cs.CoreV1().Services(testNS).Delete(ctx, "np", metav1.DeleteOptions{})
	})
	delete(want, "np")
	t.Run("service deleted", func(t *testing.T) { p.converge(t, want, 2, convergeLimit) })
}

// converge waits until both clusters' Endpoints have the address counts of want and
// are equal, then until their EndpointSlices are equal and hold as many endpoints
// (terminating more in the web Services: their terminating Pods stay in the slices).
func (p *pair) converge(t *testing.T, want map[string][2]int, terminating int, limit time.Duration) {
	t.Helper()
	waitSameEndpoints(t, p.ref.Admin, p.alc.Admin, want, limit)
	sw := maps.Clone(want)
	for _, n := range []string{"web", "head"} {
		if c, ok := sw[n]; ok {
			sw[n] = [2]int{c[0], c[1] + terminating}
		}
	}
	waitSameSlices(t, p.ref.Admin, p.alc.Admin, sw, p.moved, limit)
}

// scale makes the Service "big" have n ready Pods (big-0 ... big-(n-1)) in both clusters.
func (p *pair) scale(t *testing.T, app string, n int) {
	t.Helper()
	p.both(t, func(ctx context.Context, cs kubernetes.Interface) error {
		list, err := cs.CoreV1().Pods(testNS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			return err
		}
		have := map[string]bool{}
		for _, pod := range list.Items {
			have[pod.Name] = true
		}
		var drop []string
		for _, pod := range list.Items {
			var i int
			if _, err := fmt.Sscanf(pod.Name, app+"-%d", &i); err == nil && i >= n {
				drop = append(drop, pod.Name)
			}
		}
		if err := parallel(ctx, len(drop), func(ctx context.Context, i int) error {
			return deletePod(ctx, cs, drop[i], false)
		}); err != nil {
			return err
		}
		return parallel(ctx, n, func(ctx context.Context, i int) error {
			name := fmt.Sprintf("%s-%d", app, i)
			if have[name] {
				return nil
			}
			return createPod(ctx, cs, podSpec{name: name, app: app, node: fmt.Sprintf("node-%d", i%3),
				ip4: podIP4(1000 + i), ready: true})
		})
	})
}

// testKubernetesService checks default/kubernetes in allocd's cluster: kube-apiserver
// writes nothing (--endpoint-reconciler-type=none); the lease sidecar keeps the API
// server's lease in allocd and the bridge writes the Endpoints from it, as the
// reference cluster's kube-apiserver writes its own.
func (p *pair) testKubernetesService(t *testing.T) {
	ctx := context.Background()
	port := p.alc.URL[len("https://127.0.0.1:"):]
	var last string
	etcdtest.WaitFor(t, convergeLimit, "default/kubernetes Endpoints from allocd's master lease", func() bool {
		ep, err := p.alc.Admin.CoreV1().Endpoints("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false
		}
		last = js(normalizeEndpoints(ep))
		return len(ep.Subsets) == 1 && len(ep.Subsets[0].Addresses) == 1 &&
			ep.Subsets[0].Addresses[0].IP == advertise && len(ep.Subsets[0].Ports) == 1 &&
			fmt.Sprint(ep.Subsets[0].Ports[0].Port) == port && ep.Subsets[0].Ports[0].Name == "https" &&
			ep.Labels["endpointslice.kubernetes.io/skip-mirror"] == "true"
	})
	ref, err := p.ref.Admin.CoreV1().Endpoints("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	alc, err := p.alc.Admin.CoreV1().Endpoints("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The ports differ (each API server has its own); the rest must not.
	for _, ep := range []*corev1.Endpoints{ref, alc} {
		for i := range ep.Subsets {
			for j := range ep.Subsets[i].Ports {
				ep.Subsets[i].Ports[j].Port = 0
			}
		}
	}
	if a, b := js(normalizeEndpoints(ref)), js(normalizeEndpoints(alc)); a != b {
		t.Errorf("default/kubernetes Endpoints differ (ports aside):\n  reference: %s\n  allocd:    %s (last: %s)", a, b, last)
	}
	// Its EndpointSlice too, as kube-apiserver's reconciler writes it (the port aside).
	var a, b map[string]*normSliceGroup
	etcdtest.WaitFor(t, convergeLimit, "default/kubernetes EndpointSlice", func() bool {
		var err1, err2 error
		a, err1 = listSlices(ctx, p.ref.Admin, "default")
		b, err2 = listSlices(ctx, p.alc.Admin, "default")
		return err1 == nil && err2 == nil && len(b) > 0
	})
	portless := func(m map[string]*normSliceGroup) string {
		var out []string
		for _, g := range m {
			c := *g
			c.Ports = nil
			out = append(out, js(c))
		}
		slices.Sort(out)
		return strings.Join(out, "\n")
	}
	if x, y := portless(a), portless(b); x != y {
		t.Errorf("default/kubernetes EndpointSlices differ (ports aside):\n  reference: %s\n  allocd:    %s", x, y)
	}
}
