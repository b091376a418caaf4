package allocator

import (
	"net/netip"
	"testing"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// TestHeldAt: HeldAt answers who held items at a past revision, whatever happened
// since, and, once etcd compacted that revision, at the oldest revision etcd keeps.
func TestHeldAt(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/24"))
	ctx := etcdtest.Context(t)
	x, y, free := IP(netip.MustParseAddr("10.0.0.50")), Port(30050), IP(netip.MustParseAddr("10.0.0.60"))
	items := []Item{x, y, free}
	held := func(rev int64) (int64, []Item) {
		t.Helper()
		got, all, err := a.HeldAt(ctx, items, rev)
		if err != nil {
			t.Fatalf("HeldAt(%v, %d) = %v", items, rev, err)
		}
		var its []Item
		for _, al := range all {
			if al.Owner != owner("s1") {
				t.Errorf("HeldAt(%d): %v held by %v; want %v", rev, al.Item, al.Owner, owner("s1"))
			}
			its = append(its, al.Item)
		}
		return got, its
	}
	for _, it := range []Item{x, y} {
		if _, err := a.Assign(ctx, owner("s1"), it); err != nil {
			t.Fatalf("Assign(%v) = %v", it, err)
		}
	}
	resp, err := e.Client.Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	then := resp.Header.Revision
	if _, _, err := a.Release(ctx, owner("s1"), []Item{x, y}, false); err != nil {
		t.Fatalf("Release = %v", err)
	}
	if rev, its := held(then); rev != then || len(its) != 2 || its[0] != x || its[1] != y {
		t.Errorf("HeldAt(revision %d, before the release) = %d, %v; want %d, [%v %v]",
			then, rev, its, then, x, y)
	}
	if _, _, err := a.HeldAt(ctx, items, 0); err == nil {
		t.Errorf("HeldAt(revision 0) = nil error; want one")
	}

	// Compacted past the release: the oldest revision kept, where nothing is held.
	resp, err = e.Client.Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	if rev, its := held(then); rev != resp.Header.Revision || len(its) != 0 {
		t.Errorf("HeldAt(revision %d, compacted at %d) = %d, %v; want %d, none", then, resp.Header.Revision,
			rev, its, resp.Header.Revision)
	}
}
