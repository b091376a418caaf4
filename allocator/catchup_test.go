package allocator

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// TestCatchUpInParts: a catch-up split into parts of a few revisions each, some parts
// without an event of the index's keys (writes elsewhere) and the last revisions too,
// with a ServiceCIDR added among them, builds the same index as the list at the
// revision it reports, whatever the parts' size (one revision each, a few, or one
// part: the default for so few).
func TestCatchUpInParts(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	cfg := testConfig("10.0.0.0/22", "fd00::/110")
	other, err := New(ctx, e.Client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runWith(t, other, func(a *Allocator) { a.cp.ch = nil })
	churn(t, other, "a", 30)
	writer(t, e, cfg)()
	elsewhere := func(name string, n int) {
		t.Helper()
		for i := range n {
			if _, err := e.Client.Put(ctx, fmt.Sprintf("/elsewhere/%s/%d", name, i), "x"); err != nil {
				t.Fatal(err)
			}
		}
	}
	churn(t, other, "b", 20)
	elsewhere("middle", 12)
	if _, err := other.CreateServiceCIDR(ctx, "extra", []string{"10.1.0.0/24"}); err != nil {
		t.Fatal(err)
	}
	churn(t, other, "c", 20)
	elsewhere("tail", 9)

	head, err := other.cp.revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, span := range []int64{1, 3, 0} {
		t.Run(fmt.Sprint("span ", span), func(t *testing.T) {
			a := newAllocator(e.NewClient(), cfg)
			a.idx.catchUpSpan = span
			if err := a.start(ctx); err != nil {
				t.Fatal(err)
			}
			if a.idx.loadedFrom != "checkpoint" {
				t.Fatalf("loaded from %q; want checkpoint", a.idx.loadedFrom)
			}
			if rev := a.idx.progress.Rev(); span > 0 && rev-head < 20*span {
				t.Fatalf("checkpoint at %d, index at %d: want more than 20 parts to replay", head, rev)
			}
			checkEqualsList(t, a)
			if len(a.idx.tab.Load().ip) != 3 {
				t.Errorf("index has ClusterIP ranges %v; want the two of the flags and extra's",
					a.idx.rangeNames())
			}
		})
	}
}

// TestCatchUpQuietStore: a catch-up in parts of a few revisions after writes that end
// with revisions outside the index's keys, on a store nobody writes to any more (no
// epoch rewritten), ends, whatever the parts' size.
func TestCatchUpQuietStore(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	cfg := testConfig("10.0.0.0/22", "fd00::/110")
	other, err := New(ctx, e.Client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := runWith(t, other, func(a *Allocator) { a.cp.ch = nil })
	writer(t, e, cfg)()
	churn(t, other, "b", 80)
	stop()
	for i := range 9 {
		if _, err := e.Client.Put(ctx, fmt.Sprintf("/elsewhere/%d", i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	for _, span := range []int64{1, 3, 0} {
		t.Run(fmt.Sprint("span ", span), func(t *testing.T) {
			a := newAllocator(e.NewClient(), cfg)
			a.idx.catchUpSpan = span
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := a.start(sctx); err != nil {
				t.Fatal(err)
			}
			checkEqualsList(t, a)
		})
	}
}
