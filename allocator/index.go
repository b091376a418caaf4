package allocator

import (
	"math/rand/v2"
	"net/netip"
	"sync"

	"github.com/bits-and-blooms/bitset"
	"github.com/prometheus/client_golang/prometheus"
)

// rng is one configured range and its in-memory index. The index knows offsets only;
// span (ClusterIP) or ports (NodePort) map items to offsets.
//
// used holds what the watch has seen in etcd; pending holds local reservations that
// the watch has not seen settle yet; busy = used | pending is what dynamic picks skip.
// All three are guarded by mu and have exactly size bits: every Set is bounds-checked
// first, because a bitset grows silently.
type rng struct {
	name    string
	kind    Kind
	span    ipSpan    // KindClusterIP
	ports   PortRange // KindNodePort
	size    uint64
	band    uint64 // offsets [0, band) are the static band
	primary bool

	mu                  sync.Mutex
	used, pending, busy *bitset.BitSet
	nused               uint64

	allocStatic, allocDynamic prometheus.Counter
}

func newIPRange(p netip.Prefix, primary bool) *rng {
	s := newIPSpan(p)
	return &rng{
		name: s.prefix.String(), kind: KindClusterIP, span: s, size: s.size,
		band: min(ipBand(s.total), s.size), primary: primary,
		used: bitset.New(uint(s.size)), pending: bitset.New(uint(s.size)), busy: bitset.New(uint(s.size)),
	}
}

func newPortRange(pr PortRange) *rng {
	size := uint64(pr.Size)
	return &rng{
		name: pr.String(), kind: KindNodePort, ports: pr, size: size,
		band: min(portBand(size), size),
		used: bitset.New(uint(size)), pending: bitset.New(uint(size)), busy: bitset.New(uint(size)),
	}
}

// offset returns it's offset in r, and false when it is not a usable item of r.
func (r *rng) offset(it Item) (uint64, bool) {
	if it.Kind != r.kind {
		return 0, false
	}
	if r.kind == KindClusterIP {
		return r.span.offset(it.Addr)
	}
	if !r.ports.Contains(it.Port) {
		return 0, false
	}
	return uint64(it.Port - r.ports.Base), true
}

// item returns the item at offset off < size.
func (r *rng) item(off uint64) Item {
	if r.kind == KindClusterIP {
		return IP(r.span.addr(off))
	}
	return Port(r.ports.Base + int(off))
}

// static reports whether off lies in the static band.
func (r *rng) static(off uint64) bool { return off < r.band }

// pick reserves a free offset for a dynamic allocation: upper band first, from a
// random start with wrap-around, then the lower band. It returns false when both are
// full (used or pending).
func (r *rng) pick() (uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	off, ok := scan(r.busy, r.band, r.size)
	if !ok {
		off, ok = scan(r.busy, 0, r.band)
	}
	if ok {
		r.pending.Set(uint(off))
		r.busy.Set(uint(off))
	}
	return off, ok
}

// scan finds a clear bit in [lo, hi) from a random start, wrapping around once.
func scan(b *bitset.BitSet, lo, hi uint64) (uint64, bool) {
	if lo >= hi {
		return 0, false
	}
	start := lo + rand.Uint64N(hi-lo)
	if x, ok := b.NextClear(uint(start)); ok && uint64(x) < hi {
		return uint64(x), true
	}
	if x, ok := b.NextClear(uint(lo)); ok && uint64(x) < start {
		return uint64(x), true
	}
	return 0, false
}

// reserve marks a specific offset pending unless it is busy already. It returns
// whether the caller now holds the pending bit (and must unpend it).
func (r *rng) reserve(off uint64) bool {
	if off >= r.size {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.busy.Test(uint(off)) {
		return false
	}
	r.pending.Set(uint(off))
	r.busy.Set(uint(off))
	return true
}

// unpend drops a local reservation.
func (r *rng) unpend(off uint64) {
	if off >= r.size {
		return
	}
	r.mu.Lock()
	r.pending.Clear(uint(off))
	if !r.used.Test(uint(off)) {
		r.busy.Clear(uint(off))
	}
	r.mu.Unlock()
}

// setUsed records what the watch saw in etcd.
func (r *rng) setUsed(off uint64, v bool) {
	if off >= r.size {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	was := r.used.Test(uint(off))
	switch {
	case v && !was:
		r.used.Set(uint(off))
		r.busy.Set(uint(off))
		r.nused++
	case !v && was:
		r.used.Clear(uint(off))
		r.nused--
		if !r.pending.Test(uint(off)) {
			r.busy.Clear(uint(off))
		}
	}
}

// isUsed reports whether the watch has seen off allocated.
func (r *rng) isUsed(off uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return off < r.size && r.used.Test(uint(off))
}

// replaceUsed installs a freshly listed used set, keeping the pending reservations.
func (r *rng) replaceUsed(used *bitset.BitSet) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.used = used
	r.nused = uint64(used.Count())
	r.busy = used.Union(r.pending)
}

// counts returns the used count of the whole range and of its static band.
func (r *rng) counts() (used, staticUsed uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nused, uint64(r.used.OnesBetween(0, uint(r.band)))
}
