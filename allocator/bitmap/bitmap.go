package bitmap

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/bits-and-blooms/bitset"
)

// Bitmap is the used and pending offsets of one range. See the package doc.
type Bitmap struct {
	size, band uint64

	mu sync.Mutex
	// busy = used | pending: what picks skip. All three have exactly size bits.
	used, pending, busy *bitset.BitSet
	nused               uint64
	// nbusy counts busy's bits, so that Full answers without the lock: an allocator
	// that skips a thousand full ranges must not take a thousand locks.
	nbusy atomic.Uint64
}

// New returns an empty Bitmap of size offsets whose first band offsets are the static
// band (band is capped at size).
func New(size, band uint64) *Bitmap {
	return &Bitmap{size: size, band: min(band, size),
		used: bitset.New(uint(size)), pending: bitset.New(uint(size)), busy: bitset.New(uint(size))}
}

// Size returns the number of offsets.
func (b *Bitmap) Size() uint64 { return b.size }

// Band returns the size of the static band.
func (b *Bitmap) Band() uint64 { return b.band }

// Static reports whether off lies in the static band.
func (b *Bitmap) Static(off uint64) bool { return off < b.band }

// Pick reserves (marks pending) a free offset for a dynamic allocation: the dynamic
// band first, from a random start with wrap-around, then the static band. It returns
// false when both are full (used or pending).
func (b *Bitmap) Pick() (uint64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	off, ok := scan(b.busy, b.band, b.size)
	if !ok {
		off, ok = scan(b.busy, 0, b.band)
	}
	if ok {
		b.pending.Set(uint(off))
		b.setBusy(off)
	}
	return off, ok
}

// scan finds a clear bit in [lo, hi) from a random start, wrapping around once.
func scan(s *bitset.BitSet, lo, hi uint64) (uint64, bool) {
	if lo >= hi {
		return 0, false
	}
	start := lo + rand.Uint64N(hi-lo)
	if x, ok := s.NextClear(uint(start)); ok && uint64(x) < hi {
		return uint64(x), true
	}
	if x, ok := s.NextClear(uint(lo)); ok && uint64(x) < start {
		return uint64(x), true
	}
	return 0, false
}

// Reserve marks a specific offset pending unless it is used or pending already. It
// reports whether the caller now holds the pending bit (and must Unpend it).
func (b *Bitmap) Reserve(off uint64) bool {
	if off >= b.size {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.busy.Test(uint(off)) {
		return false
	}
	b.pending.Set(uint(off))
	b.setBusy(off)
	return true
}

// Unpend drops a reservation.
func (b *Bitmap) Unpend(off uint64) {
	if off >= b.size {
		return
	}
	b.mu.Lock()
	b.pending.Clear(uint(off))
	if !b.used.Test(uint(off)) {
		b.clearBusy(off)
	}
	b.mu.Unlock()
}

// SetUsed records whether off is allocated in etcd.
func (b *Bitmap) SetUsed(off uint64, v bool) {
	if off >= b.size {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	was := b.used.Test(uint(off))
	switch {
	case v && !was:
		b.used.Set(uint(off))
		b.setBusy(off)
		b.nused++
	case !v && was:
		b.used.Clear(uint(off))
		b.nused--
		if !b.pending.Test(uint(off)) {
			b.clearBusy(off)
		}
	}
}

// IsUsed reports whether off is recorded as allocated.
func (b *Bitmap) IsUsed(off uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return off < b.size && b.used.Test(uint(off))
}

// CopyUsed returns a copy of the used set (a checkpoint of the index).
func (b *Bitmap) CopyUsed() *bitset.BitSet {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used.Clone()
}

// NewUsed returns an empty set of the Bitmap's size, for Replace.
func (b *Bitmap) NewUsed() *bitset.BitSet { return bitset.New(uint(b.size)) }

// Replace installs a freshly listed used set (from NewUsed, with no bit set at or past
// Size), keeping the pending reservations.
func (b *Bitmap) Replace(used *bitset.BitSet) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used = used
	b.nused = uint64(used.Count())
	b.busy = used.Union(b.pending)
	b.nbusy.Store(uint64(b.busy.Count()))
}

// setBusy and clearBusy change busy and its count; b.mu is held.
func (b *Bitmap) setBusy(off uint64) {
	if !b.busy.Test(uint(off)) {
		b.busy.Set(uint(off))
		b.nbusy.Add(1)
	}
}

func (b *Bitmap) clearBusy(off uint64) {
	if b.busy.Test(uint(off)) {
		b.busy.Clear(uint(off))
		b.nbusy.Add(^uint64(0))
	}
}

// Full reports, without taking the lock, whether every offset is used or pending: a
// Pick would fail. It may be stale by the time the caller acts on it.
func (b *Bitmap) Full() bool { return b.nbusy.Load() >= b.size }

// EachUsed calls fn with every used offset, in order, under the lock: fn must not
// call b.
func (b *Bitmap) EachUsed(fn func(off uint64)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, ok := b.used.NextSet(0); ok; i, ok = b.used.NextSet(i + 1) {
		fn(uint64(i))
	}
}

// Counts returns how many offsets are used, in all and in the static band.
func (b *Bitmap) Counts() (used, staticUsed uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.nused, uint64(b.used.OnesBetween(0, uint(b.band)))
}
