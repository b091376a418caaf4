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

// Transfer moves items from the owner from to the owner to in one etcd transaction,
// and returns what moved and the revision written (0 when nothing had to be). Each
// item's key is rewritten for to, compared at the revision at which it was read held
// by from, and both owners' records change in the same transaction (each compared at
// the revision read; to's created, CreateRevision 0, when to has none): there is no
// moment at which an item is free or held by two owners. With no items named,
// everything from holds moves. An item that to holds already is skipped, so that a
// retry of a transfer that committed moves nothing and succeeds. An item named that
// from does not hold (free, or another owner's) fails the whole call with a
// *NotOwnerError, and nothing moves. A record of from left holding nothing becomes a
// tombstone, as after a full release (epoch.go): an Allocate of from built before the
// transfer fails its compare and never lands after it; the transaction compares the
// epoch in any case. The index keeps the items' bits (nothing is freed or taken); the
// moved items' AllocateTime becomes the transfer's. Errors: *InvalidError (an owner's
// UID, from = to, too many items, to would hold more than MaxItems), ErrNoRange,
// *NotInRangeError, *NotOwnerError, ErrConflict (contention outlasted the retries),
// etcd's.
func (a *Allocator) Transfer(ctx context.Context, from, to Owner, items []Item) ([]Item, int64, error) {
	if err := a.checkTransfer(from, to, items); err != nil {
		return nil, 0, err
	}
	for range maxWriteRetries {
		res, done, err := a.transferOnce(ctx, from, to, items)
		if err == nil && res.rev != 0 {
			a.logTransferred(ctx, res.from, to, res.moved, res.rev)
		}
		if err != nil || done {
			return res.moved, res.rev, err
		}
	}
	return nil, 0, fmt.Errorf("transfer from %s to %s: %w", from.UID, to.UID, ErrConflict)
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

// transferResult is what one attempt of Transfer wrote: the items moved and the revision
// (0: nothing written), and from as its record names it (for the log line).
type transferResult struct {
	moved []Item
	rev   int64
	from  Owner
}

// transferOnce makes one attempt of Transfer: what it moved, whether it is done (false:
// a compare failed, read again) and an error.
func (a *Allocator) transferOnce(ctx context.Context, from, to Owner, items []Item) (transferResult, bool,
	error) {
	recs, err := a.readRecords(ctx, []string{from.UID, to.UID}, 0)
	if err != nil {
		return transferResult{}, false, call.Unapplied(err) // every earlier attempt's compares failed
	}
	mine := recs[from.UID]
	res := transferResult{from: from}
	if mine.rec != nil && from.Namespace == "" && from.Name == "" {
		res.from.Namespace, res.from.Name = mine.rec.Namespace, mine.rec.Name
	}
	all := len(items) == 0
	if all {
		if mine.rec == nil || mine.rec.items() == 0 {
			return res, true, nil // nothing held: nothing to move
		}
		items = mine.rec.itemList()
	}
	t := &releaseTxn{epoch: a.epochs.now()}
	moved, lose, err := a.transferItems(ctx, t, res.from, to, items, all)
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
	resp, err := a.commitWrites(t, func(writes []clientv3.Op) (*clientv3.TxnResponse, error) {
		return a.releaseTxn(ctx, t.cmps, writes)
	})
	if err != nil {
		return res, false, fmt.Errorf("transfer: %w", err)
	}
	if !resp.Succeeded {
		a.epochs.seenKV(firstKV(resp.Responses[0].GetResponseRange().Kvs)) // the next attempt's epoch
		return res, false, nil
	}
	a.hints.del(from.UID, to.UID)
	res.moved, res.rev = moved, resp.Header.Revision
	return res, true, nil
}

// transferItems reads items at one revision and adds to t, for each one from holds, a
// put that gives it to to, compared at the revision read. It returns the items moved,
// and what from's record loses: the items moved and, when all (the items are those
// from's record lists), the ones its key does not give to from. An item that to holds
// is skipped; one named that from does not hold is a *NotOwnerError.
func (a *Allocator) transferItems(ctx context.Context, t *releaseTxn, from, to Owner, items []Item,
	all bool) (moved, lose []Item, err error) {
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
