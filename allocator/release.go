package allocator

import (
	"context"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
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
		return nil, 0, &InvalidError{Field: "owner.uid", Reason: "required unless force is set"}
	}
	if o.UID == "" && len(items) == 0 {
		return nil, 0, &InvalidError{Field: "cluster_ips", Reason: "name what to release when no owner is given"}
	}
	if len(items) > MaxItems {
		return nil, 0, &InvalidError{Field: "node_ports", Reason: fmt.Sprintf("%d items; at most %d per request", len(items), MaxItems)}
	}
	for i, it := range items {
		if _, _, err := a.locate(it); err != nil {
			return nil, 0, err
		}
		if slices.Contains(items[:i], it) {
			return nil, 0, &InvalidError{Field: "cluster_ips", Reason: it.String() + " named twice"}
		}
	}
	for range maxWriteRetries {
		released, holders, rev, done, err := a.releaseOnce(ctx, o, items, force)
		if err == nil && rev != 0 {
			a.logReleased(ctx, o, released, holders, rev, force)
		}
		if err != nil || done {
			return released, rev, err
		}
	}
	return nil, 0, fmt.Errorf("release for %s: %w", o.UID, ErrConflict)
}

// releaseOnce makes one attempt of Release: it reports what it released, the other
// owners that held some of it, the revision, whether it is done and an error.
func (a *Allocator) releaseOnce(ctx context.Context, o Owner, items []Item, force bool) ([]Item, []string, int64, bool, error) {
	all := len(items) == 0
	var mine recordState
	if o.UID != "" {
		recs, err := a.readRecords(ctx, []string{o.UID}, 0)
		if err != nil {
			return nil, nil, 0, false, err
		}
		mine = recs[o.UID]
	}
	if all {
		if mine.rec == nil {
			return nil, nil, 0, true, nil
		}
		for _, ip := range mine.rec.ClusterIPs {
			items = append(items, IP(ip))
		}
		for _, p := range mine.rec.NodePorts {
			items = append(items, Port(p))
		}
	}
	// Read the items at one revision.
	gets := make([]clientv3.Op, len(items))
	for i, it := range items {
		gets[i] = clientv3.OpGet(a.key(it))
	}
	resp, err := a.cli.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return nil, nil, 0, false, fmt.Errorf("read allocations: %w", err)
	}
	var cmps []clientv3.Cmp
	var writes []clientv3.Op
	var released []Item
	holders := map[string][]Item{}
	var uids []string
	for i, r := range resp.Responses {
		kvs := r.GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue
		}
		holder, _, err := decodeItemValue(kvs[0].Value)
		if err != nil {
			a.log.Warn("undecodable allocation", "key", string(kvs[0].Key), "err", err)
		}
		if holder.UID != o.UID && !force {
			return nil, nil, 0, true, &NotOwnerError{Item: items[i], Holder: holder, Requester: o}
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(a.key(items[i])), "=", kvs[0].ModRevision))
		writes = append(writes, clientv3.OpDelete(a.key(items[i])))
		released = append(released, items[i])
		if _, ok := holders[holder.UID]; !ok && holder.UID != "" {
			uids = append(uids, holder.UID)
		}
		holders[holder.UID] = append(holders[holder.UID], items[i])
	}
	// The records of every holder lose the released items; the owner's own record
	// loses them too (it may list items that were already free).
	uids = slices.DeleteFunc(uids, func(u string) bool { return u == o.UID })
	recs, err := a.readRecords(ctx, uids, 0)
	if err != nil {
		return nil, nil, 0, false, err
	}
	if o.UID != "" {
		recs[o.UID] = mine
		holders[o.UID] = append(holders[o.UID], items...)
	}
	for uid, st := range recs {
		if st.rec == nil {
			continue
		}
		next := st.rec.clone()
		for _, it := range holders[uid] {
			next.remove(it)
		}
		switch {
		case next.items() == 0:
			writes = append(writes, clientv3.OpDelete(a.ownerKey(uid)))
		case recordChanged(st.rec, next):
			writes = append(writes, clientv3.OpPut(a.ownerKey(uid), string(appendOwnerRecord(nil, next))))
		default:
			continue
		}
		cmps = append(cmps, st.cmp(a.ownerKey(uid)))
	}
	if len(writes) == 0 {
		return nil, nil, 0, true, nil
	}
	if len(cmps) > maxTxnOps || len(writes) > maxTxnOps {
		return nil, nil, 0, true, &InvalidError{Field: "cluster_ips", Reason: "too many items and owners for one transaction"}
	}
	wresp, err := a.cli.Txn(ctx).If(cmps...).Then(writes...).Commit()
	if err != nil {
		return nil, nil, 0, false, fmt.Errorf("release: %w", err)
	}
	if !wresp.Succeeded {
		return nil, nil, 0, false, nil
	}
	a.hints.del(o.UID)
	a.hints.del(uids...)
	return released, uids, wresp.Header.Revision, true, nil
}

// ReleaseIf deletes al if its key is still at al.ModRevision, and removes it from
// its holder's record, in one transaction. It reports false when al changed or is
// gone.
func (a *Allocator) ReleaseIf(ctx context.Context, al Allocation) (bool, error) {
	key := a.key(al.Item)
	for range maxWriteRetries {
		var rev int64
		ok, done, err := a.conditional(ctx, al, key, nil, &rev, func(rec *ownerRecord) { rec.remove(al.Item) })
		if ok {
			a.logConditional(ctx, al, nil, rev)
		}
		if err != nil || done {
			return ok, err
		}
	}
	return false, fmt.Errorf("release %s: %w", al.Item, ErrConflict)
}

// Reassign gives al to another owner if its key is still at al.ModRevision (else
// ErrConflict), updating both owners' records in the same transaction.
func (a *Allocator) Reassign(ctx context.Context, al Allocation, to Owner) (Allocation, error) {
	if to.UID == "" {
		return Allocation{}, &InvalidError{Field: "owner.uid", Reason: "required"}
	}
	key := a.key(al.Item)
	now := time.Now()
	for range maxWriteRetries {
		var rev int64
		ok, done, err := a.conditional(ctx, al, key, &reassign{to: to, now: now}, &rev,
			func(rec *ownerRecord) { rec.remove(al.Item) })
		switch {
		case err != nil:
			return Allocation{}, err
		case done && !ok:
			return Allocation{}, fmt.Errorf("reassign %s: %w", al.Item, ErrConflict)
		case done:
			a.logConditional(ctx, al, &to, rev)
			r, _ := a.RangeOf(al.Item)
			return Allocation{Item: al.Item, Range: r, Owner: to, AllocateTime: now,
				CreateRevision: al.CreateRevision, ModRevision: rev}, nil
		}
	}
	return Allocation{}, fmt.Errorf("reassign %s: %w", al.Item, ErrConflict)
}

type reassign struct {
	to  Owner
	now time.Time
}

// conditional runs one attempt of ReleaseIf (ra == nil) or Reassign: it reports
// ok (written, at *rev), done (no retry needed) and an error.
func (a *Allocator) conditional(ctx context.Context, al Allocation, key string, ra *reassign, rev *int64, drop func(*ownerRecord)) (ok, done bool, err error) {
	var uids []string
	if al.Owner.UID != "" {
		uids = append(uids, al.Owner.UID)
	}
	if ra != nil && ra.to.UID != al.Owner.UID {
		uids = append(uids, ra.to.UID)
	}
	recs, err := a.readRecords(ctx, uids, 0)
	if err != nil {
		return false, false, err
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", al.ModRevision)}
	var writes []clientv3.Op
	if ra == nil {
		writes = append(writes, clientv3.OpDelete(key))
	} else {
		writes = append(writes, clientv3.OpPut(key, string(appendItemValue(nil, ra.to, ra.now))))
	}
	for _, uid := range uids {
		st := recs[uid]
		var next *ownerRecord
		if st.rec != nil {
			next = st.rec.clone()
		} else {
			next = &ownerRecord{UID: uid}
		}
		if uid == al.Owner.UID {
			drop(next)
		}
		if ra != nil && uid == ra.to.UID {
			next.Namespace, next.Name = ra.to.Namespace, ra.to.Name
			next.add(al.Item)
			if next.items() > MaxItems {
				return false, true, &InvalidError{Field: "owner", Reason: fmt.Sprintf("owner %s would hold more than %d items", uid, MaxItems)}
			}
		}
		switch {
		case next.items() == 0 && st.rec != nil:
			writes = append(writes, clientv3.OpDelete(a.ownerKey(uid)))
		case next.items() == 0:
			continue
		case st.rec == nil || recordChanged(st.rec, next):
			writes = append(writes, clientv3.OpPut(a.ownerKey(uid), string(appendOwnerRecord(nil, next))))
		default:
			continue
		}
		cmps = append(cmps, st.cmp(a.ownerKey(uid)))
	}
	resp, err := a.cli.Txn(ctx).If(cmps...).Then(writes...).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return false, false, fmt.Errorf("write %s: %w", key, err)
	}
	if resp.Succeeded {
		*rev = resp.Header.Revision
		a.hints.del(uids...)
		return true, true, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 || kvs[0].ModRevision != al.ModRevision {
		return false, true, nil
	}
	return false, false, nil // an owner record moved: read again
}
