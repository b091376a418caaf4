package endpoints

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/allocd/allocd/endpoints/endpointslice"
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

// longestPods are n ready Pods whose names, IPs and Nodes are as long as Kubernetes
// allows (a Pod name and a Node name of 253 characters, a namespace, a hostname and a
// zone of 63, an IPv6 address), on Nodes of their own.
func longestPods(svc *kube.Service, n int) ([]*kube.Pod, []*kube.Node) {
	var pods []*kube.Pod
	var nodes []*kube.Node
	for i := range n {
		p := testPod(svc.Namespace, i, true, 1)
		p.Name = fmt.Sprintf("%0253d", i)
		p.UID = fmt.Sprintf("5f0c3a2e-8b1d-4c7e-9a6f-%012d", i)
		p.PodIPs = []string{fmt.Sprintf("fd00:1234:5678:9abc:def0:1234:%04x:%04x", i/65536, i%65536)}
		p.Hostname, p.Subdomain = fmt.Sprintf("%063d", i), svc.Name
		p.NodeName = fmt.Sprintf("%0253d", i)
		pods = append(pods, p)
		nodes = append(nodes, &kube.Node{Name: p.NodeName,
			Labels: map[string]string{kube.LabelZone: fmt.Sprintf("%063d", i%3)}})
	}
	return pods, nodes
}

// TestSliceSize: the largest slice the controller writes (MaxMaxEndpointsPerSlice
// endpoints, every name as long as Kubernetes allows, hints for a zone and a node) is
// smaller than a request etcd takes (--max-request-bytes, 1.5 MiB by default): a slice
// larger than a transaction of the committer goes alone (commitLarge), so it must fit
// a request by itself, or its Service's slices are never written.
func TestSliceSize(t *testing.T) {
	svc := sliceService(fmt.Sprintf("%063d", 0))
	svc.Name = fmt.Sprintf("%063d", 1)
	svc.ClusterIPs, svc.IPFamilies = []string{"fd00::10"}, []string{kube.FamilyIPv6}
	pods, nodes := longestPods(svc, MaxMaxEndpointsPerSlice)
	s := &kube.EndpointSlice{Namespace: svc.Namespace, Service: svc.Name, Name: fmt.Sprintf("%0253d", 0),
		Labels: map[string]string{kube.LabelServiceName: svc.Name,
			kube.LabelSliceManagedBy: kube.SliceControllerName},
		Annotations: map[string]string{kube.AnnotationTriggerTime: time.Now().Format(time.RFC3339Nano)},
		AddressType: kube.AddressTypeIPv6, ServiceUID: svc.UID,
		Ports: []kube.Port{{Name: fmt.Sprintf("%015d", 0), Port: 8080, Protocol: kube.ProtocolTCP}}}
	for i, p := range pods {
		e := endpointslice.Endpoint(svc, p, nodes[i], kube.AddressTypeIPv6)
		e.Hints = &kube.Hints{ForZones: []string{e.Zone}, ForNodes: []string{e.NodeName}}
		s.Endpoints = append(s.Endpoints, e)
	}
	size := len(encodeSlice(s)) + len(testPrefix+"/endpointslices/"+svc.Key()+"/"+s.Name)
	t.Logf("a slice of %d endpoints with the longest names: %d bytes", len(s.Endpoints), size)
	// A request also carries the transaction's compares and framing: 1 KiB is plenty.
	if limit := int(embed.DefaultMaxRequestBytes) - 1024; size > limit {
		t.Errorf("a slice of %d endpoints encodes to %d bytes; want at most %d, or it never fits a request",
			len(s.Endpoints), size, limit)
	}
}

// TestLargeServiceWritten: a Service of 12,000 Pods (max 100 per slice: 120 slices,
// 1.6 MB, more than one etcd request takes) gets all its slices, every Pod in one of
// them: the committer splits the write into transactions that fit.
func TestLargeServiceWritten(t *testing.T) {
	if testing.Short() {
		t.Skip("a Service of 12,000 Pods: seconds")
	}
	h := newSliceHarness(t, Config{Logger: slog.New(slog.NewTextHandler(&tw{t},
		&slog.HandlerOptions{Level: slog.LevelWarn}))})
	svc := sliceService("production")
	svc.Name = "checkout-frontend"
	const n = 12000
	pods := realisticPods("production", n, 50)
	for _, p := range pods {
		p.Labels = map[string]string{"foo": "bar"}
	}
	h.sliceSnapshots(1, []*kube.Service{svc}, realisticNodes(50), pods)
	var names []string
	var sl []*kube.EndpointSlice
	etcdtest.Eventually(15*time.Second, func() bool {
		sl = h.slices("production", "checkout-frontend")
		names = endpointNames(sl)
		return len(names) >= n
	})
	if len(names) != n || len(sl) != n/DefaultMaxEndpointsPerSlice {
		t.Fatalf("after 15 s: %d endpoints in %d slices; want %d in %d", len(names), len(sl), n,
			n/DefaultMaxEndpointsPerSlice)
	}
	for i := 1; i < len(names); i++ {
		if names[i] == names[i-1] {
			t.Fatalf("Pod %s is in two slices", names[i])
		}
	}
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
	h := newSliceHarness(t, Config{Logger: slog.New(slog.NewTextHandler(&tw{t},
		&slog.HandlerOptions{Level: slog.LevelWarn}))})
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

// TestCommitLargeIntermediate: a sync whose write is larger than one transaction
// (commitLarge) is seen by a watcher in parts, and no part shows an endpoint in none of
// the Service's slices, or in two.
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
	svc2.Ports = []kube.ServicePort{{Port: 80, TargetPort: kube.TargetPort{Number: 9090},
		Protocol: kube.ProtocolTCP}}
	h.events(Event{Type: Upsert, Revision: 2, Service: &svc2})
	h.settle()
	if parts := checkEveryRevision(t, h, start, 9); parts < 2 {
		t.Errorf("the sync's write committed in %d revisions; want it split over several (MaxTxnOps 4)",
			parts)
	}
}

// checkEveryRevision replays the slice watch from start to the current revision and
// reports every revision at which one of the Pods pod0 to pod(n-1) is in no slice or in
// two; it returns how many revisions changed a slice.
func checkEveryRevision(t *testing.T, h *harness, start int64, n int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	decode := h.c.slicesStore().decode
	// The state at start, listed at start.
	state := map[string]*kube.EndpointSlice{}
	resp, err := h.cli.Get(ctx, testPrefix+"/endpointslices/", clientv3.WithPrefix(), clientv3.WithRev(start))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		s, err := decode(kv)
		if err != nil {
			t.Fatalf("decode %s at revision %d: %v", kv.Key, start, err)
		}
		state[string(kv.Key)] = s
	}
	bad, revisions := 0, 0
	check := func(rev int64) {
		revisions++
		count := map[string]int{}
		for _, s := range state {
			for _, e := range s.Endpoints {
				count[e.TargetRef.Name]++
			}
		}
		var missing, twice []string
		for i := range n {
			name := fmt.Sprintf("pod%d", i)
			switch count[name] {
			case 0:
				missing = append(missing, name)
			case 1:
			default:
				twice = append(twice, name)
			}
		}
		t.Logf("revision %d: %d slices, missing %v, twice %v", rev, len(state), missing, twice)
		if len(missing)+len(twice) > 0 {
			bad++
		}
	}
	end := h.rev()
	reached := end <= start
	wch := h.cli.Watch(ctx, testPrefix+"/endpointslices/", clientv3.WithPrefix(), clientv3.WithRev(start+1))
	for wr := range wch {
		if err := wr.Err(); err != nil {
			t.Fatalf("watch from revision %d: %v", start+1, err)
		}
		var cur int64
		for _, ev := range wr.Events {
			if cur != 0 && ev.Kv.ModRevision != cur {
				check(cur)
			}
			cur = ev.Kv.ModRevision
			if ev.Type == clientv3.EventTypeDelete {
				delete(state, string(ev.Kv.Key))
				continue
			}
			s, err := decode(ev.Kv)
			if err != nil {
				t.Fatalf("decode %s at revision %d: %v", ev.Kv.Key, cur, err)
			}
			state[string(ev.Kv.Key)] = s
		}
		if cur != 0 {
			check(cur)
		}
		if wr.Header.Revision >= end {
			reached = true
			break
		}
	}
	if !reached {
		t.Fatalf("the watch ended before revision %d (%v): the revisions after it went unchecked", end,
			ctx.Err())
	}
	if bad > 0 {
		t.Errorf("%d revisions with a Pod in no slice or in two", bad)
	}
	return revisions
}
