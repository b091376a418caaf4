package endpoints

import (
	"testing"
	"time"

	"github.com/allocd/allocd/endpoints/endpointslice"
	"github.com/allocd/allocd/endpoints/kube"
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
