package allocator

import (
	"context"
	"hash/maphash"
	"log/slog"
	"net/netip"
	"sync"
	"time"
)

// The holders: who holds every allocated item, as a hash of the owner's UID, kept by
// the watch beside the bitmaps once a listing seeded it. A repair pass asks
// ListExcept for the allocations it must look at; with the holders kept, those are
// read from etcd one by one, and every item held by the owner whose Service uses it is
// skipped without reading it: a pass over 1M Services reads a few keys instead of 1M.
//
// The holders cost nothing until the first ListExcept: a replica that never runs a
// repair pass keeps none. After a compaction of the watch (events lost) they are
// dropped, and the next ListExcept lists again. With Config.KeepHolders a replica seeds
// them in the background holdersDelay after Run starts, and again that long after they
// are dropped: a replica that becomes the leader has them at its first pass.

// ItemKey is an item as a comparable value without pointers (netip.Addr has one): a
// map key the collector does not scan, and cheaper to hash than an Item.
type ItemKey struct {
	addr [16]byte
	port int64 // any int: a bad port of a Service must not alias a good one
	kind uint8
	is4  bool
}

// Key returns it as an ItemKey.
func (it Item) Key() ItemKey {
	if it.Kind == KindClusterIP {
		return ItemKey{addr: it.Addr.As16(), kind: uint8(it.Kind), is4: it.Addr.Is4()}
	}
	return ItemKey{port: int64(it.Port), kind: uint8(it.Kind)}
}

// Item returns the item of k.
func (k ItemKey) Item() Item {
	switch {
	case Kind(k.kind) != KindClusterIP:
		return Item{Kind: Kind(k.kind), Port: int(k.port)}
	case k.is4:
		return IP(netip.AddrFrom4([4]byte(k.addr[12:])))
	}
	return IP(netip.AddrFrom16(k.addr))
}

// holders is the Allocator's record of who holds every item, and how far it is.
type holders struct {
	// log and fails are run's (keeping the holders from the start).
	log   *slog.Logger
	fails *failures

	mu sync.Mutex
	// idx maps every allocated item to its place in hs, which holds the HolderHash of
	// its owner's UID with the low bit set (0: a free place, listed in free); idx is
	// nil while the holders are not kept.
	idx  map[ItemKey]int32
	hs   []uint64
	free []int32
	// touched, while a listing seeds them, holds the items the watch changed since the
	// seeding started: the holders have their newer state, which the listing must not
	// overwrite.
	touched map[ItemKey]struct{}
	// seeded is the revision of the listing that seeded them (0 while seeding): they
	// equal etcd's item keys once the index reflects it.
	seeded int64
	// gen counts starts and drops: a seeding fills only the holders it started.
	gen uint64
}

// holderSeed seeds HolderHash: the holders live in memory only.
var holderSeed = maphash.MakeSeed()

// HolderHash is the hash of an owner's UID that a Claim names its holder by.
func HolderHash(uid string) uint64 { return maphash.String(holderSeed, uid) }

// kept reports whether the holders are kept, seeded or seeding.
func (h *holders) kept() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.idx != nil
}

// start begins keeping the holders unless they are kept already, and reports whether
// it did: from now on the watch records every change, and the listing that follows
// fills in the rest (fill).
func (h *holders) start() (gen uint64, started bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.idx != nil {
		return 0, false
	}
	h.idx, h.hs, h.free = map[ItemKey]int32{}, nil, nil
	h.touched, h.seeded = map[ItemKey]struct{}{}, 0
	h.gen++
	return h.gen, true
}

// fill fills the holders with the allocations of a listing at rev, except the items
// the watch changed since start (they have those, newer or to be corrected by events
// still to come). It does nothing unless the holders are those of the start that
// returned gen (not dropped, nor started again, meanwhile).
func (h *holders) fill(gen uint64, rev int64, all []Allocation) {
	for len(all) > 0 { // the lock a part at a time: the watch waits for it
		n := min(len(all), fillPart)
		h.fillSome(gen, all[:n])
		all = all[n:]
	}
	h.seededAt(gen, rev)
}

// fillPart is how many allocations fill takes under one hold of the lock (a few
// milliseconds; 1M took 0.7 s, past the watch's stall warning).
const fillPart = 1 << 14

// fillSome is fill with a part of the listing, seeded at the end by seededAt.
func (h *holders) fillSome(gen uint64, all []Allocation) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gen != gen || h.touched == nil {
		return
	}
	for i := range all {
		k := all[i].Item.Key()
		if _, ok := h.touched[k]; !ok {
			h.set(k, HolderHash(all[i].Owner.UID))
		}
	}
}

// seededAt ends the seeding that started with gen, by a listing at rev, and reports
// whether the holders are still those of that start.
func (h *holders) seededAt(gen uint64, rev int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gen != gen || h.touched == nil {
		return false
	}
	h.touched, h.seeded = nil, rev
	return true
}

// drop stops keeping the holders: the watch lost events (a compaction), the ranges
// changed (List, which seeds them, leaves out the items outside every range: a new
// range may hold one), or a seeding failed.
func (h *holders) drop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reset()
}

// dropSeeding drops the holders if they are still those of the start that returned
// gen: its listing failed.
func (h *holders) dropSeeding(gen uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gen == gen {
		h.reset()
	}
}

// reset forgets the holders (h.mu held).
func (h *holders) reset() {
	h.idx, h.hs, h.free, h.touched, h.seeded = nil, nil, nil, nil, 0
	h.gen++
}

// set records that the owner of UID hash holds k.
func (h *holders) set(k ItemKey, hash uint64) {
	if i, ok := h.idx[k]; ok {
		h.hs[i] = hash | 1
		return
	}
	var i int32
	if n := len(h.free); n > 0 {
		i, h.free = h.free[n-1], h.free[:n-1]
	} else {
		i = int32(len(h.hs))
		h.hs = append(h.hs, 0)
	}
	h.hs[i], h.idx[k] = hash|1, i
}

// holderChange is one change of an item key, as the watch applies it.
type holderChange struct {
	it  Item
	put bool
	uid []byte // the owner's UID as stored (put only)
}

// apply records the watch's changes, in order.
func (h *holders) apply(cs []holderChange) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.idx == nil {
		return
	}
	for _, c := range cs {
		k := c.it.Key()
		switch i, ok := h.idx[k]; {
		case c.put:
			h.set(k, maphash.Bytes(holderSeed, c.uid))
		case ok:
			delete(h.idx, k)
			h.hs[i], h.free = 0, append(h.free, i)
		}
		if h.touched != nil {
			h.touched[k] = struct{}{}
		}
	}
}

// itemUID returns the owner's UID in an item value (nil for a delete).
func itemUID(v []byte, put bool) []byte {
	if !put {
		return nil
	}
	if f, _, ok := scanItemValue(v); ok {
		return v[f[4]:f[5]]
	}
	o, _, _ := decodeItemValueJSON(v) // undecodable: held by nobody's UID, read by every pass
	return []byte(o.UID)
}

// Claim is an item that a caller (a repair pass) expects held by the owner whose
// UID's HolderHash is Holder; 0: no owner is expected, the item is read whoever holds
// it.
type Claim struct {
	Key    ItemKey
	Holder uint64
}

// check marks held[i] for every claim the holders show held by its Holder, and
// returns the items to read: those of the claims not held, and every item held that
// no claim marked. ok is false when the holders are not seeded at a revision the
// index reflects (progress): then nothing is marked.
func (h *holders) check(progress int64, claims []Claim, held []bool) (read []ItemKey, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.idx == nil || h.seeded == 0 || h.seeded > progress {
		return nil, false
	}
	seen := make([]bool, len(h.hs))
	for i, c := range claims {
		if j, ok := h.idx[c.Key]; ok && c.Holder != 0 && h.hs[j] == c.Holder|1 {
			held[i], seen[j] = true, true
		} else {
			read = append(read, c.Key)
		}
	}
	for k, j := range h.idx {
		if !seen[j] {
			read = append(read, k)
		}
	}
	return read, true
}

// holdersDelay is how long after Run starts, and after the holders are dropped, a
// replica that keeps them (Config.KeepHolders) seeds them again.
const holdersDelay = 5 * time.Second

// holdersMaxWait bounds the wait between seedings that fail (it doubles each time).
const holdersMaxWait = time.Minute

// run keeps the holders (Config.KeepHolders): it seeds them every after it starts
// and checks every every after that: holders dropped since (a compaction of the
// watch, a change of the ranges, a seeding that failed) are seeded again by seed (a
// listing of every allocation that fills the holders of the start gen), until ctx
// ends; after a seeding that failed it waits twice as long each time, up to
// holdersMaxWait. A ListExcept that comes first seeds them itself, as without
// KeepHolders.
func (h *holders) run(ctx context.Context, every time.Duration,
	seed func(ctx context.Context, gen uint64) (rev int64, n int, err error)) {
	wait := every
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		gen, ok := h.start()
		if !ok {
			wait = every
			continue
		}
		begin := time.Now()
		rev, n, err := seed(ctx, gen)
		if err != nil {
			wait = min(2*wait, holdersMaxWait)
			if ctx.Err() == nil {
				h.fails.fail(stepHoldersSeed, "holders not seeded; trying again", err, "in", wait)
			}
			continue
		}
		h.fails.ok(stepHoldersSeed)
		wait = every
		h.log.Info("holders seeded", "allocations", n, "revision", rev,
			"took", time.Since(begin).Round(time.Millisecond))
	}
}
