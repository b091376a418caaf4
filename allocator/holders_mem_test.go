package allocator

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"
)

// heldItem returns the i-th item and owner UID that seedN seeds: every other address
// of 10.0.0.0/11 in an order that jumps about (as picks at random do; 2*i*7919 mod the
// size is distinct for distinct i below half of it, 7919 being prime), each held by an
// owner of its own with a UUID for a UID, as a Service's.
func heldItem(i int) (Item, string) {
	const size = 1<<21 - 2 // the addresses of 10.0.0.0/11
	span := newIPSpan(netip.MustParsePrefix("10.0.0.0/11"))
	return IP(span.addr(uint64(2*i) * 7919 % size)), fmt.Sprintf("%08x-4e2b-4c1a-9f3d-%012x", i, i*31)
}

// seedN returns new holders seeded with heldItem(0..n-1) at revision 1 as a replica's
// seeding does (fillSome, a listing's chunk at a time).
func seedN(n int) *holders {
	if n > 1<<20-1 {
		panic("seedN: more items than half the /11")
	}
	h := &holders{}
	gen, _ := h.start()
	chunk := make([]Allocation, 0, fillPart)
	for i := range n {
		it, uid := heldItem(i)
		chunk = append(chunk, Allocation{Item: it, Owner: Owner{UID: uid}})
		if len(chunk) == cap(chunk) || i == n-1 {
			h.fillSome(gen, chunk)
			chunk = chunk[:0]
		}
	}
	h.seededAt(gen, 1)
	return h
}

// holdersHeap seeds n items (seedN) and returns the heap the holders keep per item:
// the growth of HeapInuse and of HeapAlloc, after a collection, over n. The listing's
// chunks are garbage by then.
func holdersHeap(n int) (inuse, alloc float64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	h := seedN(n)
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(h)
	return float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / float64(n),
		float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
}

// BenchmarkHoldersMemory reports the heap the holders keep per held item at 100k and
// 1M items, seeded as at a replica's start (run it with -benchtime 1x: each iteration
// seeds anew).
func BenchmarkHoldersMemory(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprint("items=", n), func(b *testing.B) {
			var inuse, alloc float64
			for b.Loop() {
				inuse, alloc = holdersHeap(n)
			}
			b.ReportMetric(inuse, "inuse-B/item")
			b.ReportMetric(alloc, "alloc-B/item")
		})
	}
}

// BenchmarkHoldersCheck checks a repair pass's claims against 1M holders: each item
// claimed by its holder, but one in 1,000 claimed by another owner and one in 1,000
// claimed by nobody: 3,000 to read, as an item claimed by another owner is named twice
// (its claim is not held, and no claim marked it).
func BenchmarkHoldersCheck(b *testing.B) {
	const n = 1_000_000
	h := seedN(n)
	claims := make([]Claim, 0, n)
	for i := range n {
		it, uid := heldItem(i)
		switch {
		case i%1000 == 1:
			continue
		case i%1000 == 2:
			uid = "another"
		}
		claims = append(claims, Claim{Key: it.Key(), Holder: HolderHash(uid)})
	}
	held := make([]bool, len(claims))
	for b.Loop() {
		clear(held)
		read, ok := h.check(1, claims, held)
		if !ok || len(read) != 3*n/1000 {
			b.Fatalf("check = %d to read, %v; want %d", len(read), ok, 3*n/1000)
		}
	}
}

// TestHoldersMemory: the holders of 100k items keep at most 40 bytes an item (a key and
// a hash of one word each, in a map; 72 bytes with a map of ItemKeys and an array of
// hashes beside it).
func TestHoldersMemory(t *testing.T) {
	const n, most = 100_000, 40
	if _, alloc := holdersHeap(n); alloc > most {
		t.Errorf("holders of %d items keep %.1f bytes an item; want at most %d", n, alloc, most)
	} else {
		t.Logf("holders of %d items keep %.1f bytes an item", n, alloc)
	}
}
