package allocator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/badrequest"
	"github.com/allocd/allocd/internal/etcd/call"
)

// maxWriteRetries bounds the read-then-compare loops of Release, ReleaseIf and
// Reassign.
const maxWriteRetries = 16

// Release frees items held by o, or every item o holds when items is empty (and then
// deletes o's record). Items already free are skipped. An item another owner holds
// fails the whole call with a *NotOwnerError unless force is set, in which case the
// holder's record is updated too. It returns what was freed and the revision of the
// write (0 when nothing had to be written).
func (a *Allocator) Release(ctx context.Context, o Owner, items []Item, force bool) ([]Item, int64, error) {
	if o.UID == "" && !force {
		return nil, 0, badrequest.New("owner.uid", "required unless force is set")
	}
	if o.UID == "" && len(items) == 0 {
		return nil, 0, badrequest.New("cluster_ips", "name what to release when no owner is given")
	}
	if o.UID != "" {
		if err := checkOwner("owner.uid", o); err != nil {
			return nil, 0, err
		}
	}
	if len(items) > MaxItems {
		return nil, 0, badrequest.New("node_ports",
			fmt.Sprintf("%d items; at most %d per request", len(items), MaxItems))
	}
	for i, it := range items {
		if _, _, err := a.idx.locate(it); err != nil {
			return nil, 0, err
		}
		if slices.Contains(items[:i], it) {
			return nil, 0, badrequest.New("cluster_ips", it.String()+" named twice")
		}
	}
	first := int64(-1) // the record's revision at the first attempt's read
	for range maxWriteRetries {
		res, done, err := a.releaseOnce(ctx, o, items, force, &first)
		if err == nil && res.rev != 0 && !res.sealed {
			a.logReleased(ctx, o, res.released, res.holders, res.rev, force)
		}
		if err != nil || done {
			return res.released, res.rev, err
		}
	}
	return nil, 0, fmt.Errorf("release for %s: %w", o.UID, ErrConflict)
}

// releaseResult is what one attempt of Release wrote: the items freed, the other owners
// that held some of them, the revision (0: nothing written).
type releaseResult struct {
	released []Item
	holders  []string
	rev      int64
	// sealed: nothing was held, the record was made a tombstone anew (not logged).
	sealed bool
}

// releaseTxn is the transaction one attempt of a write that frees or moves items
// builds: Release's, ReleaseIf's and Reassign's (conditional), Transfer's.
type releaseTxn struct {
	cmps   []clientv3.Cmp
	writes []clientv3.Op
	res    releaseResult
	// byHolder lists the released items of each holder (the owner's own record loses
	// every item named, held or already free).
	byHolder map[string][]Item
	// epoch is compared by the transaction once it makes a tombstone (withEpoch,
	// epoch.go); tombs are the keys of the records it makes tombstones.
	epoch     epoch
	withEpoch bool
	tombs     []string
}

// addTombstone adds the writes that make uid's record (rec, as read) a tombstone, and
// the epoch compares they need.
func (a *Allocator) addTombstone(t *releaseTxn, uid string, rec *ownerRecord) {
	t.writes = append(t.writes, a.epochs.tombstone(uid, rec, t.epoch)...)
	t.tombs = append(t.tombs, a.ownerKey(uid))
	if !t.withEpoch {
		t.cmps, t.withEpoch = append(t.cmps, a.epochs.cmps(t.epoch)...), true
	}
}

// releaseOnce makes one attempt of Release: it reports what it released, whether it
// is done (false: a compare failed, read again) and an error.
func (a *Allocator) releaseOnce(ctx context.Context, o Owner, items []Item,
	force bool, first *int64) (releaseResult, bool, error) {
	var mine recordState
	if o.UID != "" {
		recs, err := a.readRecords(ctx, []string{o.UID}, 0)
		if err != nil {
			return releaseResult{}, false, call.Unapplied(err) // every earlier attempt's compares failed
		}
		mine = recs[o.UID]
		if *first < 0 {
			*first = mine.rev
		}
	}
	t := &releaseTxn{byHolder: map[string][]Item{}, epoch: a.epochs.now()}
	if len(items) == 0 {
		if mine.rec == nil || mine.rec.items() == 0 {
			if mine.rec != nil && mine.rev > *first {
				// A tombstone written since this call's first read (another release of
				// the owner): every transaction built before the call fails on it.
				return releaseResult{}, true, nil
			}
			// Nothing held: the record is made a tombstone anew all the same, so that a
			// transaction of the owner built before (expecting the record as found)
			// fails its compare, as after any full release.
			a.addTombstone(t, o.UID, orOwner(mine.rec, o))
			t.cmps = append(t.cmps, mine.cmp(a.ownerKey(o.UID)))
			res, done, err := a.commitRelease(ctx, o, t)
			res.sealed = true
			return res, done, err
		}
		items = mine.rec.itemList()
	}
	if err := a.releaseItems(ctx, t, o, items, force); err != nil {
		return releaseResult{}, true, err
	}
	if err := a.releaseRecords(ctx, t, o, mine, items); err != nil {
		return releaseResult{}, false, err
	}
	if len(t.writes) == 0 {
		return releaseResult{}, true, nil
	}
	return a.commitRelease(ctx, o, t)
}

// orOwner is rec, or when nil an empty record of o.
func orOwner(rec *ownerRecord, o Owner) *ownerRecord {
	if rec == nil {
		return &ownerRecord{Namespace: o.Namespace, Name: o.Name, UID: o.UID}
	}
	return rec
}

// commitRelease commits the transaction t of a Release attempt of o: what it
// released, whether it is done (false: a compare failed, read again) and an error.
func (a *Allocator) commitRelease(ctx context.Context, o Owner, t *releaseTxn) (releaseResult, bool, error) {
	if len(t.cmps) > maxTxnOps || len(t.writes) > maxTxnOps {
		return releaseResult{}, true, badrequest.New("cluster_ips",
			"too many items and owners for one transaction")
	}
	resp, err := a.commitWrites(t, func(writes []clientv3.Op) (*clientv3.TxnResponse, error) {
		return a.releaseTxn(ctx, t.cmps, writes)
	})
	if err != nil {
		return releaseResult{}, false, fmt.Errorf("release: %w", err)
	}
	if !resp.Succeeded {
		a.epochs.seenKV(firstKV(resp.Responses[0].GetResponseRange().Kvs)) // the next attempt's epoch
		return releaseResult{}, false, nil
	}
	a.hints.del(o.UID)
	a.hints.del(t.res.holders...)
	t.res.rev = resp.Header.Revision
	return t.res, true, nil
}

// commitWrites runs txn with t's writes and, when etcd is out of space and t makes
// tombstones, again with noSpaceWrites' (etcd refuses the tombstones' puts; deletions
// free space).
func (a *Allocator) commitWrites(t *releaseTxn,
	txn func(writes []clientv3.Op) (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
	resp, err := txn(t.writes)
	if isNoSpace(err) && len(t.tombs) > 0 {
		if w, ok := a.epochs.noSpaceWrites(t.writes, t.tombs); ok {
			resp, err = txn(w)
		}
	}
	return resp, err
}

// releaseTxn runs a release's transaction (reading the epoch key when a compare
// fails).
func (a *Allocator) releaseTxn(ctx context.Context, cmps []clientv3.Cmp,
	writes []clientv3.Op) (*clientv3.TxnResponse, error) {
	var resp *clientv3.TxnResponse
	err := call.Write(ctx, txnAttempt, txnAttempt, func(ctx context.Context) (err error) {
		resp, err = a.cli.Txn(ctx).If(cmps...).Then(writes...).Else(clientv3.OpGet(a.epochKey)).Commit()
		return err
	})
	return resp, err
}

// isNoSpace reports whether err is etcd's NOSPACE refusal.
func isNoSpace(err error) bool {
	return err != nil &&
		(errors.Is(err, rpctypes.ErrNoSpace) || errors.Is(rpctypes.Error(err), rpctypes.ErrNoSpace))
}

// releaseItems reads items at one revision and adds a delete, compared at the
// revision read, for each one allocated: to o, or to anyone with force (else a
// *NotOwnerError).
func (a *Allocator) releaseItems(ctx context.Context, t *releaseTxn, o Owner, items []Item,
	force bool) error {
	kvs, err := a.readItemKeys(ctx, items)
	if err != nil {
		return call.Unapplied(err)
	}
	for i, kv := range kvs {
		if kv == nil {
			continue
		}
		holder, _, err := decodeItemValue(kv.Value)
		if err != nil {
			a.log.Warn("undecodable allocation", "key", string(kv.Key), "err", err)
		}
		if holder.UID != o.UID && !force {
			return &NotOwnerError{Item: items[i], Holder: holder, Requester: o,
				Hint: "set force to release it anyway"}
		}
		t.cmps = append(t.cmps, modifiedAt(a.key(items[i]), kv.ModRevision))
		t.writes = append(t.writes, clientv3.OpDelete(a.key(items[i])))
		t.res.released = append(t.res.released, items[i])
		if _, ok := t.byHolder[holder.UID]; !ok && holder.UID != "" && holder.UID != o.UID {
			t.res.holders = append(t.res.holders, holder.UID)
		}
		t.byHolder[holder.UID] = append(t.byHolder[holder.UID], items[i])
	}
	return nil
}

// releaseRecords adds the writes of the owner records that lose the released items:
// every holder's, and o's own (which loses every item named: it may list items that
// were already free), each compared at the revision read.
func (a *Allocator) releaseRecords(ctx context.Context, t *releaseTxn, o Owner, mine recordState,
	items []Item) error {
	recs, err := a.readRecords(ctx, t.res.holders, 0)
	if err != nil {
		return call.Unapplied(err)
	}
	if o.UID != "" {
		recs[o.UID] = mine
		t.byHolder[o.UID] = append(t.byHolder[o.UID], items...)
	}
	for uid, st := range recs {
		if st.rec == nil {
			continue
		}
		next := st.rec.clone()
		for _, it := range t.byHolder[uid] {
			next.remove(it)
		}
		switch {
		case next.items() == 0 && st.rec.items() == 0:
			continue // a tombstone already
		case next.items() == 0:
			a.addTombstone(t, uid, st.rec)
		case recordChanged(st.rec, next):
			t.writes = append(t.writes, clientv3.OpPut(a.ownerKey(uid), string(appendOwnerRecord(nil, next))))
		default:
			continue
		}
		t.cmps = append(t.cmps, st.cmp(a.ownerKey(uid)))
	}
	return nil
}

// ReleaseIf deletes al if its key is still at al.ModRevision, and removes it from
// its holder's record, in one transaction. It reports false when al changed or is
// gone.
func (a *Allocator) ReleaseIf(ctx context.Context, al Allocation) (bool, error) {
	for range maxWriteRetries {
		rev, done, err := a.conditional(ctx, al, nil)
		if rev != 0 {
			a.logConditional(ctx, al, nil, rev)
		}
		if err != nil || done {
			return rev != 0, err
		}
	}
	return false, fmt.Errorf("release %s: %w", al.Item, ErrConflict)
}

// Reassign gives al to another owner if its key is still at al.ModRevision (else
// ErrConflict), updating both owners' records in the same transaction.
func (a *Allocator) Reassign(ctx context.Context, al Allocation, to Owner) (Allocation, error) {
	if err := checkOwner("owner.uid", to); err != nil {
		return Allocation{}, err
	}
	ra := &reassign{to: to, now: time.Now()}
	for range maxWriteRetries {
		rev, done, err := a.conditional(ctx, al, ra)
		switch {
		case err != nil:
			return Allocation{}, err
		case rev != 0:
			a.logConditional(ctx, al, &to, rev)
			r, _ := a.idx.rangeOf(al.Item)
			return Allocation{Item: al.Item, Range: r, Owner: to, AllocateTime: ra.now,
				CreateRevision: al.CreateRevision, ModRevision: rev}, nil
		case done:
			return Allocation{}, fmt.Errorf("reassign %s: %w", al.Item, ErrConflict)
		}
	}
	return Allocation{}, fmt.Errorf("reassign %s: %w", al.Item, ErrConflict)
}

type reassign struct {
	to  Owner
	now time.Time
}

// conditional runs one attempt of ReleaseIf (ra == nil) or Reassign: al's key, if
// still at al.ModRevision, is deleted or given to ra.to, and the records of al's
// owner (which loses it) and of ra.to (which gains it) follow in the same
// transaction. It returns the revision written (0: nothing), whether it is done (al
// changed or is gone, or written) and an error.
func (a *Allocator) conditional(ctx context.Context, al Allocation, ra *reassign) (int64, bool, error) {
	key := a.key(al.Item)
	var uids []string
	if al.Owner.UID != "" {
		uids = append(uids, al.Owner.UID)
	}
	var to *Owner
	if ra != nil {
		to = &ra.to
		if ra.to.UID != al.Owner.UID {
			uids = append(uids, ra.to.UID)
		}
	}
	recs, err := a.readRecords(ctx, uids, 0)
	if err != nil {
		return 0, false, err
	}
	t := &releaseTxn{epoch: a.epochs.now()}
	t.cmps = append(t.cmps, modifiedAt(key, al.ModRevision))
	if ra != nil {
		t.writes = append(t.writes, clientv3.OpPut(key, string(appendItemValue(nil, ra.to, ra.now))))
	} else {
		t.writes = append(t.writes, clientv3.OpDelete(key))
	}
	one := []Item{al.Item}
	for _, uid := range uids {
		var lose, gain []Item
		if uid == al.Owner.UID {
			lose = one
		}
		if to != nil && uid == to.UID {
			gain = one
		}
		if err := a.movedRecord(t, uid, recs[uid], lose, gain, to); err != nil {
			return 0, true, err
		}
	}
	resp, err := a.commitWrites(t, func(writes []clientv3.Op) (*clientv3.TxnResponse, error) {
		return a.cli.Txn(ctx).If(t.cmps...).Then(writes...).Else(clientv3.OpGet(key),
			clientv3.OpGet(a.epochKey)).Commit()
	})
	if err != nil {
		return 0, false, fmt.Errorf("write %s: %w", key, err)
	}
	if resp.Succeeded {
		a.hints.del(uids...)
		return resp.Header.Revision, true, nil
	}
	a.epochs.seenKV(firstKV(resp.Responses[1].GetResponseRange().Kvs)) // the next attempt's epoch
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 || kvs[0].ModRevision != al.ModRevision {
		return 0, true, nil
	}
	return 0, false, nil // an owner record moved: read again
}

// movedRecord adds to t the write of uid's record, as read in st, when the items of
// lose leave it and, for to's record, the items of gain join it (under to's namespace
// and name), with the compare that guards the write; nothing when the record stays as
// it was. A record left empty becomes a tombstone, as after a full release: its writes
// and epoch compares go into t. ReleaseIf and Reassign move one item, Transfer those
// of an owner. A record of to that would hold more than MaxItems is an *InvalidError.
func (a *Allocator) movedRecord(t *releaseTxn, uid string, st recordState, lose, gain []Item,
	to *Owner) error {
	var next *ownerRecord
	if st.rec != nil {
		next = st.rec.clone()
	} else {
		next = &ownerRecord{UID: uid}
	}
	for _, it := range lose {
		next.remove(it)
	}
	if to != nil && uid == to.UID {
		next.Namespace, next.Name = to.Namespace, to.Name
		for _, it := range gain {
			next.add(it)
		}
		if next.items() > MaxItems {
			return badrequest.New("to",
				fmt.Sprintf("owner %s would hold %d items; at most %d", uid, next.items(), MaxItems))
		}
	}
	switch {
	case next.items() == 0 && st.rec != nil && st.rec.items() > 0:
		a.addTombstone(t, uid, st.rec)
	case next.items() == 0:
		return nil
	case st.rec == nil || recordChanged(st.rec, next):
		t.writes = append(t.writes, clientv3.OpPut(a.ownerKey(uid), string(appendOwnerRecord(nil, next))))
	default:
		return nil
	}
	t.cmps = append(t.cmps, st.cmp(a.ownerKey(uid)))
	return nil
}
