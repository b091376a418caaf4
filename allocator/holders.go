package allocator

import (
	"context"
	"encoding/binary"
	"hash/maphash"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
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
	// log, fails and clock are run's (keeping the holders from the start).
	log   *slog.Logger
	fails *failures
	clock clockwork.Clock

	mu sync.Mutex
	// idx maps every allocated item to the HolderHash of its owner's UID, its low bit
	// clear (check marks an item with it while it runs); idx is nil while the holders
	// are not kept. blocks are the IPv6 blocks of its keys (heldKey).
	idx    map[heldKey]uint64
	blocks v6Blocks
	// touched, while a listing seeds them, holds the items the watch changed since the
	// seeding started: the holders have their newer state, which the listing must not
	// overwrite.
	touched map[heldKey]struct{}
	// seeded is the revision of the listing that seeded them (0 while seeding): they
	// equal etcd's item keys once the index reflects it.
	seeded int64
	// gen counts starts and drops: a seeding fills only the holders it started.
	gen uint64
}

// heldKey is a held item as the holders key it: one machine word. With its owner's
// hash for a value, an item takes two words of a map the collector does not scan
// (BenchmarkHoldersMemory: 24 bytes an item at 100k, 38 at 1M where the map has just
// doubled; a map of ItemKeys to places in an array of hashes took 72 and 109). Its top
// two bits are the item's kind (heldIPv4, heldPort, heldIPv6), the rest
//
//	IPv4      the address
//	NodePort  the port
//	IPv6      the number of the address's block (its upper 104 bits, numbered by
//	          v6Blocks as the holders first see them) << blockBits | its lower 24 bits
//
// An IPv6 range has at most 2^MaxRangeBits addresses on a prefix boundary: they share
// one block, and a few ranges make a few blocks (38 bits number more blocks than any
// table has ranges). The holders hold only items of a range; a claim of an address of
// a block they do not number is of no item held.
type heldKey uint64

const (
	heldIPv4 heldKey = 1 << 62
	heldPort heldKey = 2 << 62
	heldIPv6 heldKey = 3 << 62
	heldKind heldKey = 3 << 62

	blockBits = MaxRangeBits
	blockMask = 1<<blockBits - 1
)

// v6Blocks numbers the IPv6 blocks of the holders' keys: byHigh finds a block's
// number by its upper 104 bits (As16's two words, the lower bits clear), high is the
// reverse.
type v6Blocks struct {
	byHigh map[[2]uint64]uint64
	high   [][2]uint64
}

// key returns k's heldKey. An IPv6 address of a block not numbered yet gets a number
// when add is set; without add it has no key (false), as an item of no kind or a
// port outside 0-65535: neither is held.
func (h *holders) key(k ItemKey, add bool) (heldKey, bool) {
	switch {
	case Kind(k.kind) == KindNodePort:
		if k.port < 0 || k.port > 0xffff {
			return 0, false
		}
		return heldPort | heldKey(k.port), true
	case Kind(k.kind) != KindClusterIP:
		return 0, false
	case k.is4:
		return heldIPv4 | heldKey(binary.BigEndian.Uint32(k.addr[12:])), true
	}
	lo := binary.BigEndian.Uint64(k.addr[8:])
	b := [2]uint64{binary.BigEndian.Uint64(k.addr[:8]), lo &^ blockMask}
	n, ok := h.blocks.byHigh[b]
	if !ok {
		if !add {
			return 0, false
		}
		n = uint64(len(h.blocks.high))
		h.blocks.byHigh[b] = n
		h.blocks.high = append(h.blocks.high, b)
	}
	return heldIPv6 | heldKey(n<<blockBits|lo&blockMask), true
}

// itemKey returns the ItemKey of hk, a key of the holders.
func (h *holders) itemKey(hk heldKey) ItemKey {
	v := uint64(hk &^ heldKind)
	switch hk & heldKind {
	case heldPort:
		return ItemKey{port: int64(v), kind: uint8(KindNodePort)}
	case heldIPv4:
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], uint32(v))
		return ItemKey{addr: netip.AddrFrom4(a).As16(), kind: uint8(KindClusterIP), is4: true}
	}
	b := h.blocks.high[v>>blockBits]
	k := ItemKey{kind: uint8(KindClusterIP)}
	binary.BigEndian.PutUint64(k.addr[:8], b[0])
	binary.BigEndian.PutUint64(k.addr[8:], b[1]|v&blockMask)
	return k
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
	h.idx, h.blocks = map[heldKey]uint64{}, v6Blocks{byHigh: map[[2]uint64]uint64{}}
	h.touched, h.seeded = map[heldKey]struct{}{}, 0
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
		k, ok := h.key(all[i].Item.Key(), true)
		if _, touched := h.touched[k]; ok && !touched {
			h.idx[k] = HolderHash(all[i].Owner.UID) &^ 1
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
	h.idx, h.blocks, h.touched, h.seeded = nil, v6Blocks{}, nil, 0
	h.gen++
}

// set records that the owner of UID hash holds k (h.mu held, the holders kept).
func (h *holders) set(k ItemKey, hash uint64) {
	if hk, ok := h.key(k, true); ok {
		h.idx[hk] = hash &^ 1
	}
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
		k, ok := h.key(c.it.Key(), true)
		switch {
		case !ok:
			continue
		case c.put:
			h.idx[k] = maphash.Bytes(holderSeed, c.uid) &^ 1
		default:
			delete(h.idx, k)
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
// index reflects (progress): then nothing is marked. The hashes compare without their
// low bit, which marks the items claimed until check returns.
func (h *holders) check(progress int64, claims []Claim, held []bool) (read []ItemKey, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.idx == nil || h.seeded == 0 || h.seeded > progress {
		return nil, false
	}
	for i, c := range claims {
		k, ok := h.key(c.Key, false)
		hash, in := h.idx[k]
		if !ok || !in || c.Holder == 0 || hash&^1 != c.Holder&^1 {
			read = append(read, c.Key)
			continue
		}
		held[i] = true
		if hash&1 == 0 {
			h.idx[k] = hash | 1
		}
	}
	for k, hash := range h.idx {
		if hash&1 == 0 {
			read = append(read, h.itemKey(k))
		} else {
			h.idx[k] = hash &^ 1 // an existing key: the range goes on as it was
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
		case <-h.clock.After(wait):
		}
		gen, ok := h.start()
		if !ok {
			wait = every
			continue
		}
		begin := h.clock.Now()
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
			"took", h.clock.Since(begin).Round(time.Millisecond))
	}
}
