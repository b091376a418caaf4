package allocator

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The listings of every allocation: List (streamed at one revision), ListExcept (what a
// repair pass must look at, with the holders) and the reads of given items.

// List reads every allocation at one revision and returns that revision. Each
// prefix is streamed (etcd's RangeStream: chunks of one revision, the server walking
// the range once); against a server without RangeStream (etcd before 3.7, the
// in-process client) it reads pages of listPageSize keys, at the first page's
// revision.
func (a *Allocator) List(ctx context.Context) (int64, []Allocation, error) {
	var n uint64
	for _, r := range a.idx.tab.Load().all {
		used, _ := r.Counts()
		n += used
	}
	all := make([]Allocation, 0, n+n/64+64) // the index's count, and some room
	rev, err := a.listing(ctx, func() { all = all[:0] },
		func(kvs []*mvccpb.KeyValue, d *listDecoder) { all = a.decodeAll(all, kvs, d) })
	if err != nil {
		return 0, nil, err
	}
	return rev, all, nil
}

// listTries bounds List's reads again from a new revision after a compaction.
const listTries = 3

// listing reads every item key at one revision, a chunk at a time to each (with one
// decoder for the whole listing), and returns that revision. When the revision is
// compacted before the last chunk, it reads again at a new one (begin runs before each
// try): the caller wants one consistent view, not that revision.
func (a *Allocator) listing(ctx context.Context, begin func(),
	each func(kvs []*mvccpb.KeyValue, d *listDecoder)) (int64, error) {
	var err error
	for range listTries {
		begin()
		var rev int64
		if rev, err = a.listAt(ctx, each); !errors.Is(err, rpctypes.ErrCompacted) {
			return rev, err
		}
	}
	return 0, err
}

// listAt is one try of listing.
func (a *Allocator) listAt(ctx context.Context, each func(kvs []*mvccpb.KeyValue, d *listDecoder)) (
	int64, error) {
	var d listDecoder
	var rev int64
	for _, prefix := range []string{a.ipPrefix, a.portPrefix} {
		r, err := a.scan(ctx, prefix, rev, func(kvs []*mvccpb.KeyValue) { each(kvs, &d) })
		if a.afterPageRead != nil {
			a.afterPageRead()
		}
		if err != nil {
			// RangeStream's errors come as gRPC statuses: as the etcd client's, so that
			// listing sees a compaction.
			return 0, fmt.Errorf("list allocations: %w", rpctypes.Error(err))
		}
		if rev == 0 {
			rev = r
		}
	}
	return rev, nil
}

// listDecoder decodes the item key-values of List a chunk at a time: the keys of a
// chunk are parsed from one string, and the owner strings of a chunk share one
// allocation.
type listDecoder struct {
	keys, strs []byte
	items      []listItem
}

type listItem struct {
	kind              Kind
	key               [2]int32 // offsets in keys
	owner             [4]int32 // namespace, name and uid end at owner[1:] in strs
	at                time.Time
	createRev, modRev int64
}

// notOwnForm is the line of an item key not in its own form (ownForm).
const notOwnForm = "allocation under a key not in its own form; ignored"

// decodeAll appends the allocations of kvs to all.
func (a *Allocator) decodeAll(all []Allocation, kvs []*mvccpb.KeyValue, d *listDecoder) []Allocation {
	d.keys, d.strs, d.items = d.keys[:0], d.strs[:0], d.items[:0]
	for _, kv := range kvs {
		li := listItem{createRev: kv.CreateRevision, modRev: kv.ModRevision}
		k := kv.Key
		switch {
		case len(k) > len(a.ipPrefix) && string(k[:len(a.ipPrefix)]) == a.ipPrefix:
			li.kind, k = KindClusterIP, k[len(a.ipPrefix):]
		case len(k) > len(a.portPrefix) && string(k[:len(a.portPrefix)]) == a.portPrefix:
			li.kind, k = KindNodePort, k[len(a.portPrefix):]
		default:
			a.log.Warn("allocation outside the configured ranges", "key", string(kv.Key))
			continue
		}
		li.key[0] = int32(len(d.keys))
		d.keys = append(d.keys, k...)
		li.key[1] = int32(len(d.keys))
		li.owner[0] = int32(len(d.strs))
		if f, t, ok := scanItemValue(kv.Value); ok {
			d.strs = append(d.strs, kv.Value[f[0]:f[1]]...)
			li.owner[1] = int32(len(d.strs))
			d.strs = append(d.strs, kv.Value[f[2]:f[3]]...)
			li.owner[2] = int32(len(d.strs))
			d.strs = append(d.strs, kv.Value[f[4]:f[5]]...)
			li.owner[3] = int32(len(d.strs))
			li.at = t
		} else {
			o, t, err := decodeItemValueJSON(kv.Value)
			if err != nil {
				a.log.Warn("undecodable allocation", "key", string(kv.Key), "err", err)
			}
			d.strs = append(d.strs, o.Namespace...)
			li.owner[1] = int32(len(d.strs))
			d.strs = append(d.strs, o.Name...)
			li.owner[2] = int32(len(d.strs))
			d.strs = append(d.strs, o.UID...)
			li.owner[3] = int32(len(d.strs))
			li.at = t
		}
		d.items = append(d.items, li)
	}
	keys, strs := string(d.keys), string(d.strs)
	for _, li := range d.items {
		k := keys[li.key[0]:li.key[1]]
		var it Item
		if li.kind == KindClusterIP {
			addr, err := netip.ParseAddr(k)
			if err != nil {
				a.log.Warn("allocation outside the configured ranges", "key", a.ipPrefix+k)
				continue
			}
			if it = IP(addr); !ownForm(it, k) {
				a.log.Warn(notOwnForm, "key", a.ipPrefix+k)
				continue
			}
		} else {
			p, err := strconv.Atoi(k)
			if err != nil {
				a.log.Warn("allocation outside the configured ranges", "key", a.portPrefix+k)
				continue
			}
			if it = Port(p); !ownForm(it, k) {
				a.log.Warn(notOwnForm, "key", a.portPrefix+k)
				continue
			}
		}
		r, _, err := a.idx.locate(it)
		if err != nil {
			a.log.Warn("allocation outside the configured ranges", "key", a.key(it))
			continue
		}
		all = append(all, Allocation{Item: it, Range: r.name,
			Owner: Owner{Namespace: strs[li.owner[0]:li.owner[1]], Name: strs[li.owner[1]:li.owner[2]],
				UID: strs[li.owner[2]:li.owner[3]]},
			AllocateTime: li.at, CreateRevision: li.createRev, ModRevision: li.modRev})
	}
	return all
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
		if ctx.Err() == nil {
			a.bg.fail(stepListFallback, "allocation index not current; listing every allocation", err)
		}
		return a.List(ctx)
	}
	a.bg.ok(stepListFallback)
	read, ok := a.hold.check(a.idx.progress.Rev(), claims, held)
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

// allocation decodes an item key-value; false for keys that are not allocations of
// the configured ranges.
func (a *Allocator) allocation(kv *mvccpb.KeyValue) (Allocation, bool) {
	it, ok := a.parseKey(kv.Key)
	if !ok {
		return Allocation{}, false
	}
	r, _, err := a.idx.locate(it)
	if err != nil {
		return Allocation{}, false
	}
	o, t, err := decodeItemValue(kv.Value)
	if err != nil {
		a.log.Warn("undecodable allocation", "key", string(kv.Key), "err", err)
	}
	return Allocation{Item: it, Range: r.name, Owner: o, AllocateTime: t,
		CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision}, true
}
