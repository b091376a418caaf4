package allocator

import (
	"context"
	"fmt"
	"strings"

	"github.com/allocd/allocd/internal/etcd/call"
)

// Picking items: reserving a specific item or a free address of a family in the index,
// before a transaction writes it.

// releasePicks drops the pending bits of picks that will not be committed.
func releasePicks(picks []*pick) {
	for _, p := range picks {
		if p.pending {
			p.r.Unpend(p.off)
			p.pending = false
		}
	}
}

// specificPick reserves a named item: an address in the first ready range that
// holds it (a *TerminatingError when only terminating ones do), a node port in the
// node port range.
func (a *Allocator) specificPick(it Item) (*pick, error) {
	r, off, err := a.idx.locate(it)
	if err != nil {
		return nil, err
	}
	if it.Kind == KindClusterIP && r.guard == nil {
		// Only in terminating ranges: acceptable only if the owner holds it already
		// (confirmHeld checks, before the transaction), as nothing new comes from
		// there.
		return &pick{r: r, off: off, item: it, key: a.key(it), specific: true}, nil
	}
	return &pick{r: r, off: off, item: it, key: a.key(it), specific: true, pending: r.Reserve(off),
		guard: r.guard}, nil
}

// terminatingError is the *TerminatingError of an address in terminating ranges only.
func (a *Allocator) terminatingError(it Item) error {
	var in []*rng
	a.idx.tab.Load().each(it.Addr, func(r *rng, _ uint64) { in = append(in, r) })
	return &TerminatingError{Item: it, CIDRs: []string{rangeNamesOf(in)}}
}

// confirmHeld reads the keys of o's addresses that lie only in terminating ranges
// (picks with no guard): each must be held by o's owner, and becomes a held pick (a
// ModRevision compare, no put); otherwise o fails with a *TerminatingError.
func (a *Allocator) confirmHeld(ctx context.Context, owner Owner, picks []*pick) error {
	for _, p := range picks {
		if p.item.Kind != KindClusterIP || p.guard != nil || p.held {
			continue
		}
		resp, err := a.get(ctx, p.key)
		if err != nil {
			return call.Unapplied(fmt.Errorf("read %s: %w", p.item, err))
		}
		if len(resp.Kvs) == 0 {
			return a.terminatingError(p.item)
		}
		kv := resp.Kvs[0]
		holder, at, err := decodeItemValue(kv.Value)
		if err != nil || holder.UID != owner.UID {
			return a.terminatingError(p.item)
		}
		p.held, p.createRev, p.modRev, p.at = true, kv.CreateRevision, kv.ModRevision, at
	}
	return nil
}

// pickIP reserves a free address of family f: from the ready ranges in allocation
// order, the first that is not full. It fails with a *FullError naming the ready
// ranges, and saying how to add one, when every one is full.
func (a *Allocator) pickIP(t *table, f Family) (*pick, error) {
	fi := famIndex(f == IPv4)
	ready, cursor := t.ready[fi], &t.cursor[fi]
	from := int(cursor.Load())
	for n := range len(ready) {
		// From the cursor to the end, then the ranges before it (a reservation given
		// back may have left room there): every ready range before a FullError.
		i := (from + n) % len(ready)
		r := ready[i]
		if r.Full() {
			continue
		}
		if off, ok := r.Pick(); ok {
			if i > from {
				cursor.CompareAndSwap(int32(from), int32(i))
			}
			it := r.item(off)
			return &pick{r: r, off: off, item: it, key: a.key(it), pending: true, guard: r.guard}, nil
		}
	}
	if len(ready) == 0 {
		return nil, &FullError{Range: "no ready ServiceCIDR of " + f.String(), Hint: addRangeHint}
	}
	cidrs := make([]string, len(ready))
	for i, r := range ready {
		cidrs[i] = r.name
	}
	return nil, &FullError{Range: strings.Join(cidrs, ", "),
		Hint: "every ready ServiceCIDR of " + f.String() + " is full: " + rangeNamesOf(ready) + "; " +
			addRangeHint}
}

// addRangeHint is how a FullError of the ClusterIPs says to add a range.
const addRangeHint = "add a range with CreateServiceCIDR (e.g. grpcurl -d " +
	"'{\"name\":\"extra\",\"cidrs\":[\"<cidr>\"]}' <allocd> allocd.v1.AllocatorService/CreateServiceCIDR)"
