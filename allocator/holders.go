package allocator

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"net/netip"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
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

// ListExcept reads the allocations a repair pass must look at. It marks held[i]
// (len(held) == len(claims)) for every claim that the index shows held by its Holder,
// at a revision at least as new as any write acknowledged before the call and not
// newer than the one returned; it returns, read at that revision, the allocation of
// every other item: the items of the claims not held, and those no claim names.
//
// The first call lists every allocation (as List, marking nothing) and seeds the
// holders; so does a call after the allocation watch was compacted or the ranges
// changed. When more than a quarter of the allocations (and more than a transaction's
// worth) are to be read, it lists them all, marking nothing. The index's watch waits
// while the claims are checked (about a tenth of a second per million).
func (a *Allocator) ListExcept(ctx context.Context, claims []Claim, held []bool) (
	int64, []Allocation, error) {
	if gen, ok := a.hold.start(); ok {
		return a.seedHolders(ctx, gen)
	}
	if err := a.Sync(ctx); err != nil {
		a.log.Debug("allocation index not current; listing every allocation", "err", err)
		return a.List(ctx)
	}
	read, ok := a.hold.check(a.progress.Rev(), claims, held)
	if !ok {
		return a.List(ctx) // still seeding
	}
	if len(read) > max(len(claims)/4, maxTxnOps) {
		clear(held)
		return a.List(ctx) // cheaper than reading them one by one
	}
	items := make([]Item, 0, len(read))
	once := make(map[ItemKey]struct{}, len(read))
	for _, k := range read {
		if _, dup := once[k]; !dup {
			once[k] = struct{}{}
			items = append(items, k.Item())
		}
	}
	return a.readItems(ctx, items)
}

// holdersDelay is how long after Run starts, and after the holders are dropped, a
// replica that keeps them (Config.KeepHolders) seeds them again.
const holdersDelay = 5 * time.Second

// holdersMaxWait bounds the wait between seedings that fail (it doubles each time).
const holdersMaxWait = time.Minute

// holdersLoop seeds the holders holdersWait after Run starts and checks every
// holdersWait after that: holders dropped since (a compaction of the watch, a change
// of the ranges, a seeding that failed) are seeded again, until ctx ends; after a
// seeding that failed it waits twice as long each time, up to holdersMaxWait. A
// ListExcept that comes first seeds them itself, as without KeepHolders.
func (a *Allocator) holdersLoop(ctx context.Context) {
	wait := a.holdersWait
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		gen, ok := a.hold.start()
		if !ok {
			wait = a.holdersWait
			continue
		}
		begin := time.Now()
		rev, n, err := a.streamHolders(ctx, gen)
		if err != nil {
			wait = min(2*wait, holdersMaxWait)
			if ctx.Err() == nil {
				a.log.Warn("holders not seeded; trying again", "err", err, "in", wait)
			}
			continue
		}
		wait = a.holdersWait
		a.log.Info("holders seeded", "allocations", n, "revision", rev,
			"took", time.Since(begin).Round(time.Millisecond))
	}
}

// streamHolders seeds the holders (started with gen) as seedHolders does, a chunk of
// the listing at a time: nothing of it but the holders stays in memory (a listing of
// 1M allocations would take hundreds of MB at once). It returns the listing's
// revision and how many allocations it held. Parts filled from a try whose revision
// was compacted hold for the items the watch has not changed since the start; the
// others' events come before the last try's revision is reached (check waits for it).
func (a *Allocator) streamHolders(ctx context.Context, gen uint64) (int64, int, error) {
	var chunk []Allocation
	n := 0
	rev, err := a.listing(ctx, func() { n = 0 }, func(kvs []*mvccpb.KeyValue, d *listDecoder) {
		chunk = a.decodeAll(chunk[:0], kvs, d)
		a.hold.fillSome(gen, chunk)
		n += len(chunk)
	})
	if err != nil {
		a.hold.dropSeeding(gen)
		return 0, 0, err
	}
	if !a.hold.seededAt(gen, rev) {
		return 0, 0, errors.New("holders dropped while they were listed")
	}
	return rev, n, nil
}

// seedHolders lists every allocation and seeds the holders (started) with them.
func (a *Allocator) seedHolders(ctx context.Context, gen uint64) (int64, []Allocation, error) {
	rev, all, err := a.List(ctx)
	if err != nil {
		a.hold.dropSeeding(gen)
		return 0, nil, err
	}
	a.hold.fill(gen, rev, all)
	return rev, all, nil
}

// readItems reads the allocations of items, maxTxnOps keys a transaction, every
// transaction at the first one's revision (again at a new one if that revision was
// compacted before the last).
func (a *Allocator) readItems(ctx context.Context, items []Item) (int64, []Allocation, error) {
	var err error
	for range listTries {
		var rev int64
		var all []Allocation
		if rev, all, err = a.readItemsAt(ctx, items, 0); !errors.Is(err, rpctypes.ErrCompacted) {
			return rev, all, err
		}
	}
	return 0, nil, err
}

// readItemsAt is one try of readItems, at rev (0: at the first transaction's), which
// it returns: the allocations of items, in their order, leaving out the free ones and
// those outside every range.
func (a *Allocator) readItemsAt(ctx context.Context, items []Item, rev int64) (int64, []Allocation, error) {
	all := make([]Allocation, 0, len(items))
	ops := make([]clientv3.Op, 0, maxTxnOps)
	for len(items) > 0 || rev == 0 {
		n := min(len(items), maxTxnOps)
		ops = ops[:0]
		for _, it := range items[:n] {
			ops = append(ops, clientv3.OpGet(a.key(it), clientv3.WithRev(rev)))
		}
		items = items[n:]
		if len(ops) == 0 {
			// Nothing to read: the revision alone, from a read of the config key.
			ops = append(ops, clientv3.OpGet(a.configKey, clientv3.WithKeysOnly()))
		}
		resp, err := a.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return 0, nil, fmt.Errorf("read allocations: %w", err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, r := range resp.Responses {
			for _, kv := range r.GetResponseRange().GetKvs() {
				if al, ok := a.allocation(kv); ok {
					all = append(all, al)
				}
			}
		}
		if len(items) == 0 {
			break
		}
	}
	return rev, all, nil
}
