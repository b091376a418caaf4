package allocator

import "testing"

// TestIndexSettle: a pending bit stays until the index reflects the revision that
// settled it, and clears at once when it does already; the revision only moves on.
func TestIndexSettle(t *testing.T) {
	ix := &rangeIndex{}
	r := newPortRange(PortRange{Base: 30000, Size: 10})
	pending := func(off uint64) bool {
		if r.Reserve(off) {
			r.Unpend(off)
			return false
		}
		return true
	}
	r.Reserve(1)
	r.Reserve(2)
	ix.settleAt(5, r, 1)
	ix.advance(4)
	if !pending(1) {
		t.Errorf("offset 1 settled at 5 is free at revision 4; want it pending")
	}
	ix.advance(5)
	if pending(1) {
		t.Errorf("offset 1 settled at 5 is pending at revision 5; want it cleared")
	}
	ix.advance(3)
	if rev := ix.progress.Rev(); rev != 5 {
		t.Errorf("revision after advance(3) = %d; want 5 (never back)", rev)
	}
	ix.settleAt(4, r, 2)
	if pending(2) {
		t.Errorf("offset 2 settled at 4, with the index at 5, is pending; want it cleared at once")
	}
}
