package endpoints

import (
	"maps"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/endpoints/endpointslice"
	"github.com/allocd/allocd/endpoints/kube"
	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// A slice under the Service's key that the controller does not manage (its managed-by
// label changed by hand) and that bears the name the controller picks for its next
// create: every sync conflicts and is retried at once, for ever.
func TestUnmanagedNameCollision(t *testing.T) {
	if testing.Short() {
		t.Skip("watches the controller for 2 s")
	}
	svc := sliceService("ns")
	foreign := ownSlice(svc, endpointslice.SliceName(svc, 0), nil)
	foreign.Labels[kube.LabelSliceManagedBy] = "someone-else"
	h := newSliceHarness(t, Config{}, foreign)
	h.sliceSnapshots(1, []*kube.Service{svc}, testNodes(1, 1), slicePods("ns", 3, 1))
	time.Sleep(2 * time.Second)
	tm, _ := h.c.currentTerm()
	t.Logf("idle after 2 s: %v; slices: %d", tm.idle(), len(h.slices("ns", "foo")))
	for _, s := range h.slices("ns", "foo") {
		t.Logf("  %s managed-by=%s endpoints=%d", s.Name, s.Labels[kube.LabelSliceManagedBy],
			len(s.Endpoints))
	}
	if !tm.idle() {
		t.Errorf("controller never idle: the conflicting create loops")
	}
}

// TestStoredNameDiffersFromKey: a slice stored under the key of the first name the
// controller would pick (SliceName(svc, 0)) whose value carries another name ("", or
// "hand-made"). A slice's name is its key's, and the sync of its Service ends: the
// controller creates no slice at the key of one it does not manage (it used to take
// the value's name, create at the key's, fail the create's compare and try again for
// ever), and writes one it manages at its key, under the key's name (it used to
// write at the key of the value's name, where nothing was: the same loop).
func TestStoredNameDiffersFromKey(t *testing.T) {
	for _, tc := range []struct {
		name      string
		managedBy string // of the slice stored
		valueName string
		// want: the endpoint counts of the stored slices, by the candidate name of
		// their key (0: SliceName(svc, 0)).
		want map[int]int
	}{
		{name: "unmanaged, no name", managedBy: "someone-else", valueName: "", want: map[int]int{0: 0, 1: 3}},
		{name: "unmanaged, another name", managedBy: "someone-else", valueName: "hand-made",
			want: map[int]int{0: 0, 1: 3}},
		{name: "managed, no name", managedBy: kube.SliceControllerName, valueName: "",
			want: map[int]int{0: 3}},
		{name: "managed, another name", managedBy: kube.SliceControllerName, valueName: "hand-made",
			want: map[int]int{0: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := sliceService("ns")
			h := newSliceHarness(t, Config{})
			tm, err := h.c.currentTerm()
			if err != nil {
				t.Fatal(err)
			}
			stored := ownSlice(svc, tc.valueName, nil)
			stored.Labels[kube.LabelSliceManagedBy] = tc.managedBy
			first := endpointslice.SliceName(svc, 0)
			resp, err := h.cli.Put(etcdtest.Context(t), h.c.sliceKey("ns", "foo", first),
				string(encodeSlice(stored)))
			if err != nil {
				t.Fatal(err)
			}
			etcdtest.WaitFor(t, 5*time.Second, "the slice seen by the term", func() bool {
				return tm.storedSlices.saw("ns/foo", first, resp.Header.Revision)
			})
			h.sliceSnapshots(1, []*kube.Service{svc}, testNodes(1, 1), slicePods("ns", 3, 1))
			counts := func() map[string]int {
				out := map[string]int{}
				for name, s := range h.slicesByKey("ns", "foo") {
					out[name] = len(s.Endpoints)
				}
				return out
			}
			if !etcdtest.Eventually(5*time.Second, tm.idle) {
				t.Fatalf("the sync of ns/foo still runs after 5 s; stored slices (key name: endpoints) %v",
					counts())
			}
			want := map[string]int{}
			for n, endpoints := range tc.want {
				want[endpointslice.SliceName(svc, n)] = endpoints
			}
			if got := counts(); !maps.Equal(got, want) {
				t.Errorf("stored slices (key name: endpoints) %v; want %v", got, want)
			}
			switch s := h.slicesByKey("ns", "foo")[first]; {
			case tc.managedBy == kube.SliceControllerName:
				if s == nil || s.Name != first {
					t.Errorf("the slice stored at %s is now %+v; want it named %s", first, s, first)
				}
			case s == nil || s.Name != tc.valueName || s.Labels[kube.LabelSliceManagedBy] != tc.managedBy ||
				s.Revision != resp.Header.Revision:
				t.Errorf("the slice stored at %s is now %+v; want it untouched", first, s)
			}
		})
	}
}

// slicesByKey reads the stored slices of one Service, by the name their key spells.
func (h *harness) slicesByKey(ns, svc string) map[string]*kube.EndpointSlice {
	h.t.Helper()
	prefix := h.c.sliceKey(ns, svc, "")
	resp, err := h.cli.Get(etcdtest.Context(h.t), prefix, clientv3.WithPrefix())
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]*kube.EndpointSlice{}
	for _, kv := range resp.Kvs {
		s, err := decodeSlice(kv.Value, svc, kv.ModRevision, kv.CreateRevision)
		if err != nil {
			h.t.Fatalf("stored slice %s: %v", kv.Key, err)
		}
		out[strings.TrimPrefix(string(kv.Key), prefix)] = s
	}
	return out
}
