package endpoints

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// TestUnreadableCounted: a stored value of either kind that does not decode is
// counted (allocd_endpoints_unreadable_objects_total, by kind) when the leader's view
// reads it, not only logged.
func TestUnreadableCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := newHarness(t, Config{Registerer: reg})
	tm, err := h.c.currentTerm()
	if err != nil {
		t.Fatal(err)
	}
	unreadable := func(kind string) float64 {
		var m dto.Metric
		if err := h.c.metrics.unreadable.WithLabelValues(kind).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	for _, kind := range []string{"Endpoints", "EndpointSlice"} {
		if n := unreadable(kind); n != 0 {
			t.Fatalf("unreadable %s before any = %v; want 0", kind, n)
		}
	}
	ctx := etcdtest.Context(t)
	revs := map[string]int64{}
	for _, key := range []string{"/endpoints/ns/bad", "/endpointslices/ns/svc/bad"} {
		resp, err := h.cli.Put(ctx, testPrefix+key, "\xff\xff")
		if err != nil {
			t.Fatal(err)
		}
		revs[key] = resp.Header.Revision
	}
	etcdtest.WaitFor(t, 5*time.Second, "both values read by the term's views", func() bool {
		return unreadable("Endpoints") == 1 && unreadable("EndpointSlice") == 1
	})
	// The slice is kept as one nobody manages (its name stays taken); the Endpoints
	// object as one nobody wrote, at the value's revision (a sync writes over it).
	if s := tm.storedSlices.get("ns/svc", "bad").obj; s == nil || managed(s) {
		t.Errorf("unreadable slice in the view = %+v; want a slice nobody manages", s)
	}
	if e := tm.storedEndpoints.get("ns/bad", "").obj; e == nil || e.ManagedBy != "" ||
		e.Revision != revs["/endpoints/ns/bad"] {
		t.Errorf("unreadable Endpoints in the view = %+v; want an object nobody wrote at revision %d", e,
			revs["/endpoints/ns/bad"])
	}
}
