package bitmap

import "testing"

func TestPick(t *testing.T) {
	b := New(30, 16) // a /27: 30 usable addresses, a static band of 16
	seen := map[uint64]bool{}
	for i := range 30 {
		off, ok := b.Pick()
		if !ok {
			t.Fatalf("Pick %d = full; want an offset", i)
		}
		if seen[off] {
			t.Fatalf("Pick %d = %d twice", i, off)
		}
		seen[off] = true
		// The upper band (offsets 16..29, 14 of them) goes first.
		if i < 14 && off < 16 {
			t.Errorf("Pick %d = %d in the static band while the dynamic band has room", i, off)
		}
	}
	if off, ok := b.Pick(); ok {
		t.Errorf("Pick on a full range = %d, true; want false", off)
	}
	b.Unpend(3)
	if off, ok := b.Pick(); !ok || off != 3 {
		t.Errorf("Pick after freeing 3 = %d, %v; want 3, true", off, ok)
	}
	b.SetUsed(40, true) // out of bounds: must not grow the bitset
	if b.used.Len() != uint(b.size) {
		t.Errorf("used.Len() = %d after an out-of-range Set; want %d", b.used.Len(), b.size)
	}
}

func TestUsedAndPending(t *testing.T) {
	b := New(8, 0)
	if !b.Reserve(2) || b.Reserve(2) {
		t.Fatal("Reserve(2) twice = first true, then true; want true, then false")
	}
	b.SetUsed(2, true)
	b.Unpend(2)
	if !b.IsUsed(2) || b.Reserve(2) {
		t.Errorf("offset 2 used and unpended: IsUsed = %v, Reserve = true; want used, not reservable",
			b.IsUsed(2))
	}
	b.SetUsed(2, false)
	if b.IsUsed(2) || !b.Reserve(2) {
		t.Errorf("offset 2 freed: IsUsed = %v; want free and reservable", b.IsUsed(2))
	}
	used := b.NewUsed()
	used.Set(5)
	b.Replace(used) // offset 2 stays pending
	if n, _ := b.Counts(); n != 1 || b.Reserve(2) || b.Reserve(5) {
		t.Errorf("after Replace: used %d, offsets 2 (pending) and 5 (used) reservable; want 1 used, "+
			"neither reservable", n)
	}
	for range 6 { // 8 offsets, 2 busy
		if _, ok := b.Pick(); !ok {
			t.Fatal("Pick = full with free offsets left")
		}
	}
	if off, ok := b.Pick(); ok {
		t.Errorf("Pick = %d with every offset used or pending; want full", off)
	}
}
