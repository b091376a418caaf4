package kube

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// TestNumbers measures, side by side on this machine, kube-controller-manager (its
// defaults: 5 workers, --kube-api-qps 20) and allocd with the bridge: the initial sync of
// Services and Pods created into an empty cluster, and the latency from a readiness
// flip committed in the API to the changed Endpoints in the API, at 10 and at 200
// flips/s. It runs with KUBE_E2E_NUMBERS=1 (make kube-numbers); its figures go to
// the log.
func TestNumbers(t *testing.T) {
	if os.Getenv("KUBE_E2E_NUMBERS") == "" {
		t.Skip("KUBE_E2E_NUMBERS is not set (make kube-numbers)")
	}
	services, podsPer := envInt("KUBE_E2E_SERVICES", 1000), envInt("KUBE_E2E_PODS_PER_SERVICE", 10)
	p := newPair(t)
	p.both(t, func(ctx context.Context, cs kubernetes.Interface) error {
		for i := range 3 {
			if err := createNode(ctx, cs, fmt.Sprintf("node-%d", i), fmt.Sprintf("zone-%d", i)); err != nil {
				return err
			}
		}
		return nil
	})
	p.initialSync(t, services, podsPer)
	for _, rate := range []int{10, 200} {
		p.flipLatency(t, rate, services, podsPer, 20*time.Second)
	}
}

func envInt(name string, def int) int {
	var n int
	if _, err := fmt.Sscan(os.Getenv(name), &n); err != nil || n <= 0 {
		return def
	}
	return n
}

// initialSync creates services Services with podsPer ready Pods each in both clusters
// at once, and reports for each cluster the time from the first create until every
// Service's Endpoints list all of its Pods.
func (p *pair) initialSync(t *testing.T, services, podsPer int) {
	start := time.Now()
	var mu sync.Mutex
	done := map[string]time.Duration{}
	p.eachCluster(t, func(ctx context.Context, c *cluster) error {
		cs := c.Admin
		err := parallel(ctx, services, func(ctx context.Context, i int) error {
			_, err := cs.CoreV1().Services(testNS).Create(ctx, svcSpec{name: fmt.Sprintf("n-%d", i),
				app: fmt.Sprintf("n-%d", i)}.object(), metav1.CreateOptions{})
			return err
		})
		if err != nil {
			return err
		}
		err = parallel(ctx, services*podsPer, func(ctx context.Context, i int) error {
			s := i / podsPer
			return createPod(ctx, cs, podSpec{name: fmt.Sprintf("n-%d-%d", s, i%podsPer), app: fmt.Sprintf("n-%d", s),
				node: fmt.Sprintf("node-%d", i%3), ip4: podIP4(i), ready: true})
		})
		if err != nil {
			return err
		}
		for {
			m, err := listEndpoints(ctx, cs, testNS)
			if err != nil {
				return err
			}
			full := 0
			for name, c := range readyCounts(m) {
				if len(name) > 2 && name[:2] == "n-" && c == [2]int{podsPer, 0} {
					full++
				}
			}
			if full == services {
				mu.Lock()
				done[c.name] = time.Since(start)
				mu.Unlock()
				return nil
			}
			if time.Since(start) > 20*time.Minute {
				return fmt.Errorf("initial sync: %d of %d Services complete after 20 minutes", full, services)
			}
			time.Sleep(500 * time.Millisecond)
		}
	})
	t.Logf("initial sync of %d Services / %d Pods (created into both clusters at once, both sides at once): %v",
		services, services*podsPer, fmt.Sprintf("kube-controller-manager %v, allocd+bridge %v",
			done["ref"].Round(time.Millisecond), done["alc"].Round(time.Millisecond)))
}

// flip is one readiness flip: the Pod, its address, the state flipped to and when the
// API server committed it.
type flip struct {
	svc, pod, ip string
	ready        bool
	at           time.Time
}

// flipLatency flips, at rate per second for d, Pods not flipped before (each once, to
// not ready), in both clusters at once, and reports the p50 and p99 of the time from the
// committed flip to the Endpoints in the API showing it, for each side.
func (p *pair) flipLatency(t *testing.T, rate, services, podsPer int, d time.Duration) {
	n := int(float64(rate) * d.Seconds())
	if n > services*podsPer {
		t.Fatalf("%d flips need as many Pods; there are %d", n, services*podsPer)
	}
	// Each run flips its own Pods: those not flipped by an earlier run.
	offset := flipOffset
	flipOffset += n
	var wg sync.WaitGroup
	eps, sls := map[string][]time.Duration{}, map[string][]time.Duration{}
	var mu sync.Mutex
	for _, c := range []*cluster{p.ref, p.alc} {
		wg.Go(func() {
			e, s, err := measureFlips(c.Admin, rate, n, offset, services, podsPer)
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			mu.Lock()
			eps[c.name], sls[c.name] = e, s
			mu.Unlock()
		})
	}
	wg.Wait()
	t.Logf("readiness flip → EndpointSlice in the API, %d flips at %d/s: kube-controller-manager %s; allocd+bridge %s",
		n, rate, percentiles(sls["ref"], n), percentiles(sls["alc"], n))
	t.Logf("readiness flip → Endpoints in the API, %d flips at %d/s: kube-controller-manager %s; allocd+bridge %s",
		n, rate, percentiles(eps["ref"], n), percentiles(eps["alc"], n))
}

var flipOffset int

func percentiles(d []time.Duration, n int) string {
	if len(d) == 0 {
		return "no flip seen"
	}
	slices.Sort(d)
	q := func(f float64) time.Duration { return d[min(len(d)-1, int(f*float64(len(d))))].Round(time.Millisecond) }
	return fmt.Sprintf("p50 %v p99 %v max %v (%d of %d seen)", q(0.50), q(0.99), d[len(d)-1].Round(time.Millisecond), len(d), n)
}

// measureFlips watches the namespace's Endpoints, makes n flips at rate per second on
// Pods offset, offset+1, ... (spread over the Services), and returns the latency of each
// flip seen within a minute of the last.
func measureFlips(cs kubernetes.Interface, rate, n, offset, services, podsPer int) (eps, slices []time.Duration, err error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	list, err := cs.CoreV1().Endpoints(testNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	w, err := cs.CoreV1().Endpoints(testNS).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		return nil, nil, err
	}
	defer w.Stop()
	sw, err := cs.DiscoveryV1().EndpointSlices(testNS).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		return nil, nil, err
	}
	defer sw.Stop()
	var mu sync.Mutex
	pending := map[string]flip{}      // by IP, until the Endpoints show it
	pendingSlice := map[string]flip{} // by IP, until a slice shows it
	go func() {
		for ev := range w.ResultChan() {
			ep, ok := ev.Object.(*corev1.Endpoints)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			now := time.Now()
			mu.Lock()
			for _, s := range ep.Subsets {
				for _, a := range s.NotReadyAddresses {
					if f, ok := pending[a.IP]; ok && f.svc == ep.Name {
						eps = append(eps, now.Sub(f.at))
						delete(pending, a.IP)
					}
				}
			}
			mu.Unlock()
		}
	}()
	go func() {
		for ev := range sw.ResultChan() {
			sl, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			now := time.Now()
			mu.Lock()
			for _, e := range sl.Endpoints {
				if len(e.Addresses) == 0 || e.Conditions.Ready == nil || *e.Conditions.Ready {
					continue
				}
				if f, ok := pendingSlice[e.Addresses[0]]; ok && f.svc == sl.Labels[discoveryv1.LabelServiceName] {
					slices = append(slices, now.Sub(f.at))
					delete(pendingSlice, e.Addresses[0])
				}
			}
			mu.Unlock()
		}
	}()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	patch := []byte(`{"status":{"conditions":[{"type":"Ready","status":"False","lastTransitionTime":"2026-01-03T00:00:00Z"}]}}`)
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for k := range n {
		<-tick.C
		// Pod k of the run: spread over the Services, so that flips hit many.
		i := offset + k
		s, j := i%services, i/services
		f := flip{svc: fmt.Sprintf("n-%d", s), pod: fmt.Sprintf("n-%d-%d", s, j), ip: podIP4(s*podsPer + j)}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			// Timed from the request: the watch may show the change before the
			// answer comes back.
			f.at = time.Now()
			mu.Lock()
			pending[f.ip], pendingSlice[f.ip] = f, f
			mu.Unlock()
			_, err := cs.CoreV1().Pods(testNS).Patch(ctx, f.pod, types.StrategicMergePatchType, patch,
				metav1.PatchOptions{}, "status")
			if err != nil {
				mu.Lock()
				delete(pending, f.ip)
				delete(pendingSlice, f.ip)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		mu.Lock()
		left := len(pending) + len(pendingSlice)
		mu.Unlock()
		if left == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	return append([]time.Duration(nil), eps...), append([]time.Duration(nil), slices...), nil
}
