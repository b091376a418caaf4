package kube

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// bridgeWrites sums the bridge's allocd_bridge_writes_total of kind over verbs.
func (p *pair) bridgeWrites(t testing.TB, kind string) int {
	t.Helper()
	resp, err := http.Get("http://" + p.allocd.bridgeHealth + "/metrics")
	if err != nil {
		t.Fatalf("bridge metrics: %v", err)
	}
	defer resp.Body.Close()
	n := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "allocd_bridge_writes_total{") || !strings.Contains(line, `kind="`+kind+`"`) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		n += int(v)
	}
	return n
}

// flipBoth flips a web Pod's readiness in both clusters; the counts of web and head
// move by one address from one list to the other.
func (p *pair) flipBoth(t *testing.T, pod string, ready bool, step int) {
	t.Helper()
	at := metav1.NewTime(readyTime.Add(time.Duration(step) * time.Minute))
	p.both(t, func(ctx context.Context, cs kubernetes.Interface) error { return setReady(ctx, cs, pod, ready, at) })
}

func (p *pair) currentWant(t *testing.T) map[string][2]int {
	t.Helper()
	m, err := listEndpoints(context.Background(), p.ref.Admin, testNS)
	if err != nil {
		t.Fatal(err)
	}
	return readyCounts(m)
}

// testFaults kills the bridge, allocd's leader and the API server of allocd's cluster,
// changing a Pod while each is down, and requires the clusters to agree again with
// nothing deleted wrongly (every Service keeps its Endpoints).
func (p *pair) testFaults(t *testing.T) {
	want := p.currentWant(t)
	ready, notReady := want["web"][0], want["web"][1]

	t.Run("bridge restarted", func(t *testing.T) {
		p.allocd.Bridge.Kill()
		p.flipBoth(t, "web-3", false, 10)
		want["web"], want["head"] = [2]int{ready - 1, notReady + 1}, [2]int{ready - 1, notReady + 1}
		// The reference converges while the bridge is down; allocd's cluster then lags.
		p.allocd.Bridge.Start()
		p.allocd.WaitBridgeReady(t)
		p.converge(t, want, 2, convergeLimit)
		// A restarted bridge writes what changed (web and head) and nothing else.
		time.Sleep(2 * time.Second)
		if n := p.bridgeWrites(t, "endpoints"); n > 2 {
			t.Errorf("restarted bridge wrote %d Endpoints; want at most 2 (web and head changed while it was down)", n)
		}
		if n := p.bridgeWrites(t, "endpointslices"); n > 2 {
			t.Errorf("restarted bridge wrote %d EndpointSlices; want at most 2 (web's and head's changed while it was down)", n)
		}
	})

	t.Run("allocd leader killed", func(t *testing.T) {
		st, err := p.allocd.Client.GetRepairStatus(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		killed := -1
		for i, r := range p.allocd.Replicas {
			if strings.Contains(st.GetLeader(), p.allocd.Addrs[i]) {
				r.Kill()
				killed = i
			}
		}
		if killed < 0 {
			t.Fatalf("leader %q is none of %v", st.GetLeader(), p.allocd.Addrs)
		}
		// Each step moves to a state the clusters were not in before, so that a
		// stuck feed cannot pass for a converged one.
		p.flipBoth(t, "web-5", false, 11)
		want["web"], want["head"] = [2]int{ready - 2, notReady + 2}, [2]int{ready - 2, notReady + 2}
		p.converge(t, want, 2, 2*convergeLimit)
		p.allocd.Replicas[killed].Start()
	})

	t.Run("api server restarted", func(t *testing.T) {
		p.alc.RestartAPIServer()
		p.flipBoth(t, "web-3", true, 12)
		want["web"], want["head"] = [2]int{ready - 1, notReady + 1}, [2]int{ready - 1, notReady + 1}
		p.converge(t, want, 2, 2*convergeLimit)
	})

	t.Run("foreign write put right", func(t *testing.T) {
		ctx := context.Background()
		ep, err := p.alc.Admin.CoreV1().Endpoints(testNS).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ep.Subsets = nil
		if _, err := p.alc.Admin.CoreV1().Endpoints(testNS).Update(ctx, ep, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		p.converge(t, want, 2, convergeLimit)
		if err := p.alc.Admin.CoreV1().Endpoints(testNS).Delete(ctx, "head", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		p.converge(t, want, 2, convergeLimit)
	})

	t.Run("unmanaged endpoints untouched", func(t *testing.T) {
		p.checkUnmanaged(t)
	})
	etcdtest.WaitFor(t, 10*time.Second, "bridge running", p.allocd.Bridge.Running)
}

// checkUnmanaged creates, in allocd's cluster, a Service without selector and its
// hand-written Endpoints: the bridge must leave them as they are.
func (p *pair) checkUnmanaged(t *testing.T) {
	ctx := context.Background()
	cs := p.alc.Admin
	svc := svcSpec{name: "manual", app: "none"}.object()
	svc.Spec.Selector = nil
	if _, err := cs.CoreV1().Services(testNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ep := &corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "manual"},
		Subsets: []corev1.EndpointSubset{{Addresses: []corev1.EndpointAddress{{IP: "10.1.2.3"}},
			Ports: []corev1.EndpointPort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}},
	}
	if _, err := cs.CoreV1().Endpoints(testNS).Create(ctx, ep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := js(ep.Subsets)
	time.Sleep(5 * time.Second)
	got, err := cs.CoreV1().Endpoints(testNS).Get(ctx, "manual", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("hand-written Endpoints of a Service without selector: %v", err)
	}
	if js(got.Subsets) != before || got.Labels["endpoints.kubernetes.io/managed-by"] != "" {
		t.Errorf("hand-written Endpoints changed: %s labels %v; want %s", js(got.Subsets), got.Labels, before)
	}
	if err := cs.CoreV1().Services(testNS).Delete(ctx, "manual", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	if _, err := cs.CoreV1().Endpoints(testNS).Get(ctx, "manual", metav1.GetOptions{}); err != nil {
		t.Errorf("hand-written Endpoints of a deleted Service without selector: %v; want them left alone", err)
	}
}
