package allocator

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"net/netip"
	"sync"

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
// dropped, and the next ListExcept lists again.

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

// holders is the Allocator's map of holders and how far it is.
type holders struct {
	mu sync.Mutex
	// m maps every allocated item to the hash of its owner's UID; nil while not kept.
	m map[ItemKey]uint64
	// touched, while a listing seeds m, holds the items the watch changed since the
	// seeding started: m has their newer state, which the listing must not overwrite.
	touched map[ItemKey]struct{}
	// seeded is the revision of the listing that seeded m (0 while seeding): m equals
	// etcd's item keys once the index reflects it.
	seeded int64
}

// holderSeed seeds HolderHash: the holders live in memory only.
var holderSeed = maphash.MakeSeed()

// HolderHash is the hash of an owner's UID that ListExcept hands to Claims.Claim.
func HolderHash(uid string) uint64 { return maphash.String(holderSeed, uid) }

// kept reports whether m is kept, seeded or seeding.
func (h *holders) kept() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.m != nil
}

// start begins keeping m unless it is kept already, and reports whether it did: from
// now on the watch records every change, and the listing that follows fills in the
// rest (fill).
func (h *holders) start() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m != nil {
		return false
	}
	h.m, h.touched, h.seeded = map[ItemKey]uint64{}, map[ItemKey]struct{}{}, 0
	return true
}

// fill fills m with the allocations of a listing at rev, except the items the watch
// changed since start (m has them, newer or to be corrected by events still to come).
// It does nothing if the holders were dropped meanwhile.
func (h *holders) fill(rev int64, all []Allocation) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.touched == nil {
		return
	}
	for i := range all {
		k := all[i].Item.Key()
		if _, ok := h.touched[k]; !ok {
			h.m[k] = HolderHash(all[i].Owner.UID)
		}
	}
	h.touched, h.seeded = nil, rev
}

// drop stops keeping m: the watch lost events (a compaction), the ranges changed (List,
// which seeds m, leaves out the items outside every range: a new range may hold one),
// or a seeding failed.
func (h *holders) drop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.m, h.touched, h.seeded = nil, nil, 0
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
	if h.m == nil {
		return
	}
	for _, c := range cs {
		k := c.it.Key()
		if c.put {
			h.m[k] = maphash.Bytes(holderSeed, c.uid)
		} else {
			delete(h.m, k)
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

// holderEntry is one item of m and its owner's hash.
type holderEntry struct {
	k ItemKey
	h uint64
}

// entries copies m, if it is seeded at a revision the index reflects (progress); nil
// otherwise.
func (h *holders) entries(progress int64) []holderEntry {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil || h.seeded == 0 || h.seeded > progress {
		return nil
	}
	es := make([]holderEntry, 0, len(h.m))
	for k, v := range h.m {
		es = append(es, holderEntry{k, v})
	}
	return es
}

// Claims is what ListExcept asks of its caller (a repair pass) about each allocated
// item.
type Claims interface {
	// Claim is asked about the allocated item k, held (the index shows) by the owner
	// whose UID's HolderHash is held: it returns whether k must be read. When it
	// returns false, the caller takes k as held by its claimant, whether or not
	// ListExcept's result has it (it has when ListExcept listed everything after all).
	Claim(k ItemKey, held uint64) (read bool)
}

// ListExcept reads the allocations a repair pass must look at, at the revision it
// returns: every allocation, except those of the items that the index (at a revision
// at least as new as any write acknowledged before the call, and not newer than the
// one returned) shows held by their claimant: c.Claim said so.
//
// The first call lists every allocation (as List, asking c nothing) and seeds the
// holders; so does a call after the allocation watch was compacted. When more than a
// quarter of the allocations (and more than a transaction's worth) are to be read,
// it lists them all.
func (a *Allocator) ListExcept(ctx context.Context, c Claims) (int64, []Allocation, error) {
	if a.hold.start() {
		return a.seedHolders(ctx)
	}
	if err := a.Sync(ctx); err != nil {
		a.log.Debug("allocation index not current; listing every allocation", "err", err)
		return a.List(ctx)
	}
	es := a.hold.entries(a.progress.Rev())
	if es == nil {
		return a.List(ctx) // still seeding
	}
	var read []Item
	for _, e := range es {
		if c.Claim(e.k, e.h) {
			read = append(read, e.k.Item())
		}
	}
	if len(read) > max(len(es)/4, maxTxnOps) {
		return a.List(ctx) // cheaper than reading them one by one
	}
	return a.readItems(ctx, read)
}

// seedHolders lists every allocation and seeds the holders (started) with them.
func (a *Allocator) seedHolders(ctx context.Context) (int64, []Allocation, error) {
	rev, all, err := a.List(ctx)
	if err != nil {
		a.hold.drop()
		return 0, nil, err
	}
	a.hold.fill(rev, all)
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
		if rev, all, err = a.readItemsAt(ctx, items); !errors.Is(err, rpctypes.ErrCompacted) {
			return rev, all, err
		}
	}
	return 0, nil, err
}

func (a *Allocator) readItemsAt(ctx context.Context, items []Item) (int64, []Allocation, error) {
	var rev int64
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
