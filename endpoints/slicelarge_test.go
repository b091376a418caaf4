package endpoints

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/endpoints/kube"
	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// realisticPods are n ready Pods with Kubernetes-like names, uids and node names.
func realisticPods(ns string, n, nodes int) []*kube.Pod {
	var out []*kube.Pod
	for i := range n {
		p := testPod(ns, i, true, 1)
		p.Name = fmt.Sprintf("checkout-frontend-7d9f8b6c5d-%05d", i)
		p.UID = fmt.Sprintf("5f0c3a2e-8b1d-4c7e-9a6f-%012d", i)
		p.PodIPs = []string{fmt.Sprintf("10.%d.%d.%d", i/65536%256, i/256%256, i%256)}
		p.NodeName = fmt.Sprintf("node-%d", i%nodes)
		out = append(out, p)
	}
	return out
}

func realisticNodes(n int) []*kube.Node {
	out := testNodes(n, 3)
	return out
}

func TestSliceSize(t *testing.T) {
	svc := sliceService("production")
	svc.Name = "checkout-frontend"
	pods := realisticPods("production", 100, 50)
	s := ownSlice(svc, "checkout-frontend-abcde", pods)
	t.Logf("encoded slice of 100 endpoints: %d bytes", len(encodeSlice(s)))
}

// A Service of 12,000 Pods (max 100 per slice: 120 slices, one transaction of 120
// puts) never gets its slices: the request is larger than etcd's 1.5 MiB.
func TestLargeServiceNeverWritten(t *testing.T) {
	if testing.Short() {
		t.Skip("a Service of 6,000 Pods: seconds")
	}
	h := newSliceHarness(t, Config{Logger: slog.New(slog.NewTextHandler(&tw{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	svc := sliceService("production")
	svc.Name = "checkout-frontend"
	pods := realisticPods("production", 12000, 50)
	for _, p := range pods {
		p.Labels = map[string]string{"foo": "bar"}
	}
	h.sliceSnapshots(1, []*kube.Service{svc}, realisticNodes(50), pods)
	n := 0
	etcdtest.Eventually(15*time.Second, func() bool {
		n = len(h.slices("production", "checkout-frontend"))
		return n > 0
	})
	t.Logf("slices stored after 15 s: %d", n)
	if n == 0 {
		t.Errorf("no slice of a 12,000-Pod Service written in 15 s")
	}
	_ = strings.Join
}

type tw struct{ t *testing.T }

func (w *tw) Write(b []byte) (int, error) {
	s := string(b)
	if len(s) > 400 {
		s = s[:400]
	}
	w.t.Log(s)
	return len(b), nil
}

// Two Services of 6,000 Pods each (60 slices, ~800 KB each) synced at once: each
// write fits alone, but the committer puts both in one transaction.
func TestTwoBigServicesBatched(t *testing.T) {
	if testing.Short() {
		t.Skip("two Services of 6,000 Pods: seconds")
	}
	h := newSliceHarness(t, Config{Logger: slog.New(slog.NewTextHandler(&tw{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	var svcs []*kube.Service
	var pods []*kube.Pod
	for _, name := range []string{"alpha", "beta"} {
		svc := sliceService("production")
		svc.Name, svc.UID = name, "uid-"+name
		svc.Selector = map[string]string{"app": name}
		svcs = append(svcs, svc)
		for _, p := range realisticPods("production", 6000, 50) {
			p.Name = name + "-" + p.Name
			p.Labels = map[string]string{"app": name}
			pods = append(pods, p)
		}
	}
	h.sliceSnapshots(1, svcs, realisticNodes(50), pods)
	var a, b int
	etcdtest.Eventually(20*time.Second, func() bool {
		a, b = len(h.slices("production", "alpha")), len(h.slices("production", "beta"))
		return a > 0 && b > 0
	})
	t.Logf("slices after: alpha %d, beta %d", a, b)
	if a == 0 || b == 0 {
		t.Errorf("slices of two Services of 6,000 Pods: %d and %d; want both written", a, b)
	}
}

// A sync whose write is larger than one transaction (commitLarge) is seen by a watcher
// in parts: an endpoint in none of the Service's slices, or in two, at a revision.
func TestCommitLargeIntermediate(t *testing.T) {
	h := newSliceHarness(t, Config{MaxEndpointsPerSlice: 1, MaxTxnOps: 4})
	svc := sliceService("ns")
	pods := slicePods("ns", 9, 1)
	h.sliceSnapshots(1, []*kube.Service{svc}, testNodes(1, 1), pods)
	h.settle()
	start := h.rev()
	// The Pods resolve another port now (the Service's target port changes): every
	// endpoint moves to a slice of another port group, in one sync.
	svc2 := *svc
	svc2.Ports = []kube.ServicePort{{Port: 80, TargetPort: kube.TargetPort{Number: 9090}, Protocol: kube.ProtocolTCP}}
	h.events(Event{Type: Upsert, Revision: 2, Service: &svc2})
	h.settle()
	checkEveryRevision(t, h, start)
}

// checkEveryRevision replays the slice watch from start and reports every revision at
// which a Pod is in no slice or in two.
func checkEveryRevision(t *testing.T, h *harness, start int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	state := map[string]*kube.EndpointSlice{}
	for _, s := range h.slices("ns", "foo") { // not used for state: state starts from start
		_ = s
	}
	// Rebuild the state at start by listing at start.
	resp, err := h.cli.Get(ctx, testPrefix+"/endpointslices/", clientv3.WithPrefix(), clientv3.WithRev(start))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		s, err := h.c.slicesStore().decode(kv)
		if err != nil {
			t.Fatal(err)
		}
		state[string(kv.Key)] = s
	}
	bad := 0
	wch := h.cli.Watch(ctx, testPrefix+"/endpointslices/", clientv3.WithPrefix(), clientv3.WithRev(start+1))
	check := func(rev int64) {
		count := map[string]int{}
		for _, s := range state {
			for _, e := range s.Endpoints {
				count[e.TargetRef.Name]++
			}
		}
		var missing, twice []string
		for i := range 9 {
			n := fmt.Sprintf("pod%d", i)
			switch count[n] {
			case 0:
				missing = append(missing, n)
			case 1:
			default:
				twice = append(twice, n)
			}
		}
		t.Logf("revision %d: %d slices, missing %v, twice %v", rev, len(state), missing, twice)
		if len(missing)+len(twice) > 0 {
			bad++
		}
	}
	end := h.rev()
	for wr := range wch {
		var cur int64
		for _, ev := range wr.Events {
			if cur != 0 && ev.Kv.ModRevision != cur {
				check(cur)
			}
			cur = ev.Kv.ModRevision
			if ev.Type == clientv3.EventTypeDelete {
				delete(state, string(ev.Kv.Key))
			} else {
				s, _ := h.c.slicesStore().decode(ev.Kv)
				state[string(ev.Kv.Key)] = s
			}
		}
		if cur != 0 {
			check(cur)
		}
		if wr.Header.Revision >= end {
			break
		}
	}
	if bad > 0 {
		t.Errorf("%d revisions with a Pod in no slice or in two", bad)
	}
}
