package allocator

import (
	"context"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/badrequest"
	"github.com/allocd/allocd/internal/etcd/call"
)

// Transfer moves items from the owner from to the owner to in one etcd transaction, and
// returns what it did: what moved, what to held already, the revision written. Each
// item's key is rewritten for to, compared at the revision at which it was read held by
// from, and both owners' records change in the same transaction (each compared at the
// revision read; to's created, CreateRevision 0, when to has none): there is no moment
// at which an item is free or held by two owners. With no items named, everything from
// holds moves. An item that to holds already is skipped (Held), so that a retry of a
// transfer that committed moves nothing and succeeds. An item named that from does not
// hold (free, or another owner's) fails the whole call with a *NotOwnerError, and
// nothing moves. A record of from left holding nothing becomes a tombstone, as after a
// full release (epoch.go): an Allocate of from built before the transfer fails its
// compare and never lands after it; the transaction compares the epoch in any case. The
// items and to's record take to's namespace and name; to given by its UID alone
// (neither a namespace nor a name) keeps those its record has (an owner new to allocd
// then has none). A transfer of everything from an owner that holds nothing (no record,
// or a tombstone) writes a tombstone anew, as a full Release does, and reports nothing
// moved and revision 0: from held nothing when the call read it (released, or
// transferred by another call or by an earlier try of this one, which a retry cannot
// tell apart). The index keeps the items' bits (nothing is freed or taken); the moved
// items' AllocateTime becomes the transfer's. Errors: *InvalidError (an owner's UID,
// from = to, too many items, to would hold more than MaxItems), ErrNoRange,
// *NotInRangeError, *NotOwnerError, ErrConflict (contention outlasted the retries),
// etcd's.
func (a *Allocator) Transfer(ctx context.Context, from, to Owner, items []Item) (Transferred, error) {
	if err := a.checkTransfer(from, to, items); err != nil {
		return Transferred{}, err
	}
	first := int64(-1) // from's record's revision at the first attempt's read
	for range maxWriteRetries {
		res, done, err := a.transferOnce(ctx, from, to, items, &first)
		if err == nil && res.Revision != 0 {
			a.logTransferred(ctx, res.from, res.to, res.Moved, res.Revision)
		}
		if err != nil {
			return Transferred{}, err
		}
		if done {
			return res.Transferred, nil
		}
	}
	return Transferred{}, fmt.Errorf("transfer from %s to %s: %w", from.UID, to.UID, ErrConflict)
}

// Transferred is what a Transfer did.
type Transferred struct {
	// Moved were from's and are to's now.
	Moved []Item
	// Held were asked for (named, or listed in from's record when everything was) and
	// were to's already: left as they were. A retry of a transfer that committed finds
	// its items here, not in Moved.
	Held []Item
	// Revision is the revision of the write (0 when nothing had to be written).
	Revision int64
}

// checkTransfer validates a Transfer's request, every bad field at once.
func (a *Allocator) checkTransfer(from, to Owner, items []Item) error {
	inv := &InvalidError{}
	if why := CheckUID(from.UID); why != "" {
		inv.Add("from.uid", why)
	}
	if why := CheckUID(to.UID); why != "" {
		inv.Add("to.uid", why)
	}
	if from.UID != "" && from.UID == to.UID {
		inv.Add("to.uid", "the same as from.uid: nothing to move")
	}
	if len(items) > MaxItems {
		inv.Add("cluster_ips", fmt.Sprintf("%d items; at most %d per request", len(items), MaxItems))
	}
	if err := inv.OrNil(); err != nil {
		return err
	}
	for i, it := range items {
		if _, _, err := a.idx.locate(it); err != nil {
			return err
		}
		if slices.Contains(items[:i], it) {
			return badrequest.New(itemField(it), it.String()+" named twice")
		}
	}
	return nil
}

// itemField is the request field that names items of it's kind.
func itemField(it Item) string {
	if it.Kind == KindNodePort {
		return "node_ports"
	}
	return "cluster_ips"
}

// transferResult is what one attempt of Transfer did, and from and to as their records
// name them when the call gave their UIDs alone (for the log line).
type transferResult struct {
	Transferred
	from, to Owner
}

// transferOnce makes one attempt of Transfer: what it moved, whether it is done (false:
// a compare failed, read again) and an error. first is from's record's revision at the
// first attempt's read (-1 before it).
func (a *Allocator) transferOnce(ctx context.Context, from, to Owner, items []Item,
	first *int64) (transferResult, bool, error) {
	recs, err := a.readRecords(ctx, []string{from.UID, to.UID}, 0)
	if err != nil {
		return transferResult{}, false, call.Unapplied(err) // every earlier attempt's compares failed
	}
	mine := recs[from.UID]
	if *first < 0 {
		*first = mine.rev
	}
	res := transferResult{from: namedAs(from, mine.rec)}
	to = namedAs(to, recs[to.UID].rec)
	res.to = to
	t := &releaseTxn{epoch: a.epochs.now()}
	all := len(items) == 0
	if all {
		if mine.rec == nil || mine.rec.items() == 0 {
			done, err := a.sealEmpty(ctx, t, from, mine, *first)
			return res, done, err
		}
		items = mine.rec.itemList()
	}
	ep, err := a.epochs.begin(ctx) // to gains items: never under the epoch key's absence
	if err != nil {
		return res, true, call.Unapplied(err)
	}
	t.epoch = ep
	moved, lose, err := a.transferItems(ctx, t, res.from, to, items, all, &res.Held)
	if err != nil || len(lose) == 0 {
		return res, true, err
	}
	if err := a.movedRecord(t, from.UID, mine, lose, nil, nil); err != nil {
		return res, true, err
	}
	if len(moved) > 0 {
		if err := a.movedRecord(t, to.UID, recs[to.UID], nil, moved, &to); err != nil {
			return res, true, err
		}
	}
	if !t.withEpoch {
		t.cmps, t.withEpoch = append(t.cmps, a.epochs.cmps(t.epoch)...), true
	}
	rev, err := a.commitTransfer(ctx, t)
	if err != nil || rev == 0 {
		return res, false, err
	}
	a.hints.del(from.UID, to.UID)
	res.Moved, res.Revision = moved, rev
	return res, true, nil
}

// namedAs is o or, when o names neither a namespace nor a name (an owner given by its
// UID alone), o under the namespace and name of its record rec (nil: none).
func namedAs(o Owner, rec *ownerRecord) Owner {
	if rec != nil && o.Namespace == "" && o.Name == "" {
		o.Namespace, o.Name = rec.Namespace, rec.Name
	}
	return o
}

// sealEmpty is a Transfer of everything from holds when from holds nothing (mine, as
// read; first, its revision at the call's first read): as a full Release, it makes
// from's record a tombstone anew (compared at the revision read), so that a
// transaction of from built before the call (expecting the record as found) fails its
// compare and never lands after the answer. A tombstone written since the call's first
// read (another full release or transfer of from) does as much: done, nothing written.
// It reports whether it is done (false: a compare failed, read again).
func (a *Allocator) sealEmpty(ctx context.Context, t *releaseTxn, from Owner, mine recordState,
	first int64) (bool, error) {
	if mine.rec != nil && mine.rev > first {
		return true, nil
	}
	a.addTombstone(t, from.UID, orOwner(mine.rec, from))
	t.cmps = append(t.cmps, mine.cmp(a.ownerKey(from.UID)))
	rev, err := a.commitTransfer(ctx, t)
	if rev != 0 {
		a.hints.del(from.UID)
	}
	return rev != 0, err
}

// commitTransfer commits t, the transaction of a Transfer attempt, and returns its
// revision: 0 when a compare failed (read again).
func (a *Allocator) commitTransfer(ctx context.Context, t *releaseTxn) (int64, error) {
	resp, err := a.commitWrites(t, func(writes []clientv3.Op) (*clientv3.TxnResponse, error) {
		return a.releaseTxn(ctx, t.cmps, writes)
	})
	if err != nil {
		return 0, fmt.Errorf("transfer: %w", err)
	}
	if !resp.Succeeded {
		a.epochs.seenKV(firstKV(resp.Responses[0].GetResponseRange().Kvs)) // the next attempt's epoch
		return 0, nil
	}
	return resp.Header.Revision, nil
}

// transferItems reads items at one revision and adds to t, for each one from holds, a
// put that gives it to to, compared at the revision read. It returns the items moved,
// and what from's record loses: the items moved and, when all (the items are those
// from's record lists), the ones its key does not give to from. An item that to holds
// is skipped and added to held; one named that from does not hold is a *NotOwnerError.
func (a *Allocator) transferItems(ctx context.Context, t *releaseTxn, from, to Owner, items []Item,
	all bool, held *[]Item) (moved, lose []Item, err error) {
	kvs, err := a.readItemKeys(ctx, items)
	if err != nil {
		return nil, nil, call.Unapplied(err)
	}
	var val string // to's item value, shared by every put
	for i, it := range items {
		kv := kvs[i]
		var holder Owner
		if kv != nil {
			if holder, _, err = decodeItemValue(kv.Value); err != nil {
				a.log.Warn("undecodable allocation", "key", string(kv.Key), "err", err)
			}
		}
		switch {
		case kv != nil && holder.UID == to.UID:
			// to holds it already: a retry of a transfer that committed.
			*held = append(*held, it)
			if all {
				lose = append(lose, it) // a stale entry of from's record
			}
		case kv != nil && holder.UID == from.UID:
			if val == "" {
				val = string(appendItemValue(nil, to, time.Now()))
			}
			t.cmps = append(t.cmps, modifiedAt(a.key(it), kv.ModRevision))
			t.writes = append(t.writes, clientv3.OpPut(a.key(it), val))
			moved, lose = append(moved, it), append(lose, it)
		case all:
			// from's record lists an item its key does not give to from (allocd writes
			// both in one transaction; something else wrote the key): the record lets it go.
			lose = append(lose, it)
		default:
			return nil, nil, &NotOwnerError{Item: it, Holder: holder, Requester: from, Free: kv == nil}
		}
	}
	return moved, lose, nil
}
