package feed

import (
	"io"
	"log/slog"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/cmd/allocd/daemon"
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
