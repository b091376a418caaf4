package feed

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/cmd/allocd/daemon"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// startAllocd starts a real allocd and returns a client of it.
func startAllocd(t *testing.T) *client.Client {
	t.Helper()
	d := daemon.StartForTest(t)
	c, err := client.New(d.GRPCAddr())
	if err != nil {
		t.Fatalf("client.New(%q) = %v", d.GRPCAddr(), err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func pod(name, rv string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: rv}}
}

// TestOutOfOrderChangeResyncs: a change older than one fed before (an informer's relist
// replays changes in name order) asks for snapshots; the first list's adds, in no
// order, and a periodic resync's same-object updates do not.
func TestOutOfOrderChangeResyncs(t *testing.T) {
	kube := fake.NewClientset()
	s, err := New(slog.New(slog.NewTextHandler(io.Discard, nil)), kube,
		informers.NewSharedInformerFactory(kube, 0), startAllocd(t), nil)
	if err != nil {
		t.Fatalf("New = %v", err)
	}
	h := s.handler()
	steps := []struct {
		name string
		do   func()
		want int64
	}{
		{"first list, in no order", func() {
			h.AddFunc(pod("b", "50"), true)
			h.AddFunc(pod("a", "40"), true)
		}, 0},
		{"a watch update", func() { h.UpdateFunc(pod("a", "40"), pod("a", "100")) }, 0},
		{"a periodic resync", func() { h.UpdateFunc(pod("a", "100"), pod("a", "100")) }, 0},
		{"a Service, its own order", func() {
			h.UpdateFunc(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", ResourceVersion: "5"}},
				&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", ResourceVersion: "60"}})
		}, 0},
		{"a relist's change older than the newest fed", func() {
			h.UpdateFunc(pod("b", "50"), pod("b", "90"))
		}, 1},
		{"a relist's add older than the newest fed", func() { h.AddFunc(pod("c", "95"), false) }, 2},
		{"a delete after", func() { h.DeleteFunc(pod("a", "120")) }, 2},
	}
	for _, st := range steps {
		st.do()
		if got := s.Resyncs(); got != st.want {
			t.Errorf("after %s: Resyncs() = %d; want %d", st.name, got, st.want)
		}
	}
}

// TestConvertLeavesOutWhatAllocdRefuses: values a newer API server may hold that allocd
// does not know (a trafficDistribution, a Pod phase, an init container's restart
// policy) are left out of the converted objects and told to Dropped, so that a real
// allocd takes the snapshots that hold them.
func TestConvertLeavesOutWhatAllocdRefuses(t *testing.T) {
	c := startAllocd(t)
	td := "PreferSomewhereNew"
	never := corev1.ContainerRestartPolicy("Never")
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "u1"},
		Spec: corev1.ServiceSpec{TrafficDistribution: &td, Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Port: 80}}}}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u2"},
		Spec:   corev1.PodSpec{InitContainers: []corev1.Container{{Name: "init", RestartPolicy: &never}}},
		Status: corev1.PodStatus{Phase: "Hibernating"}}
	var got []string
	dropped := Dropped(func(kind, object, field, value string) {
		got = append(got, kind+" "+object+" "+field+"="+value)
	})
	ctx := context.Background()
	if _, err := c.PushServiceSnapshot(ctx, &allocdv1.ServiceSnapshot{Revision: 5,
		Services: []*allocdv1.Service{convertService(svc, dropped)}}); err != nil {
		t.Errorf("PushServiceSnapshot(unknown trafficDistribution) = %v; want it taken", err)
	}
	if _, err := c.PushPodSnapshot(ctx, &allocdv1.PodSnapshot{Revision: 5,
		Pods: []*allocdv1.Pod{convertPod(p, dropped)}}); err != nil {
		t.Errorf("PushPodSnapshot(unknown phase, restart policy) = %v; want it taken", err)
	}
	want := []string{"services ns/web spec.trafficDistribution=PreferSomewhereNew",
		"pods ns/p status.phase=Hibernating", "pods ns/p spec.initContainers[init].restartPolicy=Never"}
	if !slices.Equal(got, want) {
		t.Errorf("Dropped told %q; want %q", got, want)
	}
}

// TestHeadlessWithoutPorts: a headless Service without ports, fed as the bridge feeds
// it, gets from allocd what kube-controller-manager writes: one port-less subset of
// its Pods' addresses, and a slice of them without ports. Without the Service's "None"
// in the feed, allocd writes no subset.
func TestHeadlessWithoutPorts(t *testing.T) {
	c := startAllocd(t)
	sel := map[string]string{"app": "db"}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db", UID: "u1"},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, ClusterIPs: []string{corev1.ClusterIPNone},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, Selector: sel}}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db-0", UID: "u2", Labels: sel,
		ResourceVersion: "4"},
		Spec: corev1.PodSpec{NodeName: "n1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.1.0.5"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.PushServiceSnapshot(ctx, &allocdv1.ServiceSnapshot{Revision: 5,
		Services: []*allocdv1.Service{Service(svc)}}); err != nil {
		t.Fatalf("PushServiceSnapshot = %v", err)
	}
	pods := &allocdv1.PodSnapshot{Revision: 5, Pods: []*allocdv1.Pod{Pod(p)}}
	if _, err := c.PushPodSnapshot(ctx, pods); err != nil {
		t.Fatalf("PushPodSnapshot = %v", err)
	}
	n1 := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: "3"}}
	if _, err := c.PushNodeSnapshot(ctx, &allocdv1.NodeSnapshot{Revision: 5,
		Nodes: []*allocdv1.Node{Node(n1)}}); err != nil {
		t.Fatalf("PushNodeSnapshot = %v", err)
	}
	var ep *allocdv1.ServiceEndpoints
	var sl []*allocdv1.EndpointSlice
	for ctx.Err() == nil {
		ep, _ = c.GetServiceEndpoints(ctx, "ns", "db")
		resp, err := c.ListEndpointSlices(ctx, &allocdv1.ListEndpointSlicesRequest{Namespace: "ns"})
		if err == nil {
			sl = resp.GetEndpointSlices()
		}
		if len(ep.GetSubsets()) > 0 && len(sl) > 0 && len(sl[0].GetEndpoints()) > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	subs := ep.GetSubsets()
	if len(subs) != 1 || len(subs[0].GetAddresses()) != 1 ||
		subs[0].GetAddresses()[0].GetIp() != "10.1.0.5" || len(subs[0].GetPorts()) != 0 {
		t.Errorf("Endpoints of ns/db = %v; want one port-less subset of 10.1.0.5", subs)
	}
	if len(sl) != 1 || len(sl[0].GetEndpoints()) != 1 || len(sl[0].GetPorts()) != 0 {
		t.Errorf("EndpointSlices of ns/db = %v; want one without ports, listing 10.1.0.5", sl)
	}
}
