package feed

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"

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
