package allocator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/badrequest"
	"github.com/allocd/allocd/internal/etcd/call"
)

// The transaction of one batch of the group committer (commit): its compares and puts,
// and when a compare fails, the read-back that settles each op (fail, replay, pick
// again, retry).

// maxConflicts bounds how often one request may find its own keys taken before it
// fails with ErrConflict; maxRounds bounds its transactions in all. Each conflict
// teaches the index one item another replica took, so a request conflicts at most
// about as often as other replicas allocate while it is in flight: near the end of a
// small range that is every one of their in-flight picks.
const (
	maxConflicts = 64
	maxRounds    = 128
)

// txnAttempt bounds a group-commit transaction. etcd commits in milliseconds; one
// that takes longer waits in a stalled member (a third of the calls, by the client's
// round robin) or for an election, and was left to etcd's own request timeout (5 s + 2
// election timeouts) while it held one of the committer's slots. Its callers get an
// error of unknown outcome.
const txnAttempt = 2 * time.Second

// commit runs one transaction for batch: if every new item key is absent, every
// held one unchanged and every owner record as expected, put them all; else read
// them all back, settle each op (fail, replay, or fix and retry) and return the ops
// to retry.
func (a *Allocator) commit(ctx context.Context, batch []*op) []*op {
	now := time.Now()
	live := a.prepare(batch)
	if len(live) == 0 {
		return nil
	}
	cmps, puts := a.txnOps(live, now)
	a.m.batch(len(live))
	var resp *clientv3.TxnResponse
	err := call.Write(ctx, txnAttempt, txnAttempt, func(ctx context.Context) (err error) {
		resp, err = a.cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
		return err
	})
	switch {
	case err != nil:
		// A transaction that etcd certainly did not apply (no member reached, no
		// leader) was tried again through the next member for up to txnAttempt; the
		// callers learn that it was not applied. Any other failure leaves the outcome
		// unknown (a timeout, a lost connection, a leader change): the transaction may
		// commit later, even after a retry of it committed and was released. The
		// callers learn it as such (a retry of the same request replays what
		// committed); it is not retried here, where an acknowledgement could follow
		// while it is still in flight.
		a.m.txn("error")
		for _, o := range live {
			o.fail(fmt.Errorf("allocation transaction: %w", err))
		}
		return nil
	case resp.Succeeded:
		a.m.txn("committed")
		a.committed(ctx, live, resp.Header.Revision, now)
		return nil
	}
	a.m.txn("conflict")
	return a.readBack(ctx, live, len(cmps))
}

// prepare computes the owner record each op of batch writes (o.next, o.putRecord)
// and returns the ops that can go into the transaction; the others fail.
func (a *Allocator) prepare(batch []*op) []*op {
	live := make([]*op, 0, len(batch))
	for _, o := range batch {
		if p := unguarded(o); p != nil {
			// Never reached through Allocate or Assign (confirmHeld): kept so that no
			// address is ever created without the compare that guards deletions.
			o.fail(a.terminatingError(p.item))
			continue
		}
		rec, err := a.nextRecord(o)
		if err != nil && o.hinted {
			// The hint may list items the owner no longer holds (released through
			// another replica, or by repair). Expect no record instead: the compare
			// fails and the read-back brings the real one for the next round.
			a.hints.del(o.owner.UID)
			o.ownerRev, o.record, o.hinted = 0, nil, false
			rec, err = a.nextRecord(o)
		}
		if err != nil {
			o.fail(err)
			continue
		}
		// A record that says it all already is compared, not written: an op whose
		// items are all held is then compares only.
		o.next, o.putRecord = rec, o.record == nil || recordChanged(o.record, rec)
		live = append(live, o)
	}
	return oneEpochKey(live)
}

// oneEpochKey keeps the ops of live begun under the epoch key of its first op: the
// transaction compares one epoch, and an op begun under another epoch key (the key was
// made anew, after a release while etcd was out of space, between the two ops' starts)
// must not commit under an epoch compare that is not its own. Those fail as a call
// that outlasted its epoch does, and are planned again.
func oneEpochKey(live []*op) []*op {
	if len(live) == 0 {
		return live
	}
	keep := live[:0]
	for _, o := range live {
		if o.epoch.create != live[0].epoch.create {
			o.fail(fmt.Errorf("owner %s: the epoch key changed since the call began: %w", o.owner.UID,
				ErrConflict))
			continue
		}
		keep = append(keep, o)
	}
	return keep
}

// unguarded returns a pick of o that would create an address without comparing a
// ready ServiceCIDR, or nil.
func unguarded(o *op) *pick {
	for _, p := range o.picks {
		if p.item.Kind == KindClusterIP && p.guard == nil && !p.held {
			return p
		}
	}
	return nil
}

// txnOps returns the compares and puts of the transaction of live: a new item key
// must be absent, a held one unchanged, the owner record as expected.
func (a *Allocator) txnOps(live []*op, now time.Time) ([]clientv3.Cmp, []clientv3.Op) {
	n := 0
	for _, o := range live {
		n += o.keys()
	}
	// The values of the batch go into one string: an item value per op (shared by its
	// items) and the owner record, at these offsets. Each is encoded into scratch (on
	// the stack) and copied into the builder, whose String does not copy it again.
	spans := make([][3]int, 0, len(live))
	var sb strings.Builder
	sb.Grow(len(live) * 320)
	var scratch [512]byte
	for _, o := range live {
		var sp [3]int
		sp[0] = sb.Len()
		sb.Write(appendItemValue(scratch[:0], o.owner, now))
		sp[1] = sb.Len()
		sb.Write(appendOwnerRecord(scratch[:0], o.next))
		sp[2] = sb.Len()
		spans = append(spans, sp)
	}
	all := sb.String()
	cmps := make([]clientv3.Cmp, 0, n+2)
	puts := make([]clientv3.Op, 0, n)
	// The oldest epoch of the batch (every op of it began under one epoch key:
	// oneEpochKey).
	ep := live[0].epoch
	for _, o := range live {
		if o.epoch.version < ep.version {
			ep = o.epoch
		}
	}
	cmps = append(cmps, a.epochs.cmps(ep)...)
	var guards []string // ids
	for i, o := range live {
		val := all[spans[i][0]:spans[i][1]]
		for _, p := range o.picks {
			if p.held {
				cmps = append(cmps, modifiedAt(p.key, p.modRev))
				continue
			}
			if p.guard != nil && !slices.Contains(guards, p.guard.id) {
				guards = append(guards, p.guard.id)
				cmps = append(cmps, modifiedAt(p.guard.key, p.guard.rev))
			}
			cmps = append(cmps, createdAt(p.key, 0))
			puts = append(puts, clientv3.OpPut(p.key, val))
		}
		if o.ownerRev == 0 {
			cmps = append(cmps, createdAt(o.ownerKey, 0))
		} else {
			cmps = append(cmps, modifiedAt(o.ownerKey, o.ownerRev))
		}
		if o.putRecord {
			puts = append(puts, clientv3.OpPut(o.ownerKey, all[spans[i][1]:spans[i][2]]))
		}
	}
	return cmps, puts
}

// committed answers the ops of a transaction that committed at rev.
func (a *Allocator) committed(ctx context.Context, live []*op, rev int64, now time.Time) {
	for _, o := range live {
		for _, p := range o.picks {
			if p.pending {
				a.idx.settleAt(rev, p.r, p.off)
				p.pending = false
			}
			if !p.held {
				p.createRev, p.modRev, p.at = rev, rev, now
				a.m.allocated(p.r, p.specific)
			}
		}
		if o.putRecord {
			a.hints.put(o.owner.UID, rev, o.next)
		}
		o.res <- a.result(o, rev, false)
	}
	// The log lines go out after the replies, from this goroutine: formatting them at
	// the bottom of each caller's deep gRPC stack made each caller's goroutine grow
	// its stack, which cost more than the formatting.
	for _, o := range live {
		a.logWrite(ctx, o, rev)
	}
}

// readBack reads the n keys of a transaction whose compares failed (not in an Else
// branch: that would triple the size of every transaction in etcd's log, for the
// rare conflict), resolves each op and returns those to retry.
func (a *Allocator) readBack(ctx context.Context, live []*op, n int) []*op {
	gets := make([]clientv3.Op, 0, n)
	var guards []string
	for _, o := range live {
		for _, p := range o.picks {
			gets = append(gets, clientv3.OpGet(p.key))
			if p.guard != nil && !p.held && !slices.Contains(guards, p.guard.key) {
				guards = append(guards, p.guard.key)
				gets = append(gets, clientv3.OpGet(p.guard.key))
			}
		}
		gets = append(gets, clientv3.OpGet(o.ownerKey))
	}
	gets = append(gets, clientv3.OpGet(a.epochKey))
	var read *clientv3.TxnResponse
	err := retryRead(ctx, func(ctx context.Context) (err error) {
		read, err = a.cli.Txn(ctx).Then(gets...).Commit()
		return err
	})
	if err != nil {
		for _, o := range live {
			// The transaction's compares failed: nothing of the op was written.
			o.fail(call.Unapplied(fmt.Errorf("read back the allocations of a transaction: %w", err)))
		}
		return nil
	}
	kvs := make(map[string]*mvccpb.KeyValue, len(gets))
	for _, r := range read.Responses {
		if rr := r.GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
			kvs[string(rr.Kvs[0].Key)] = rr.Kvs[0]
		}
	}
	var retry []*op
	for _, o := range live {
		if a.epochs.outlived(kvs[a.epochKey], o.epoch) {
			// Begun more than epochSlack epochs ago: a release since may count on its
			// transactions failing. Nothing of it was written.
			o.fail(fmt.Errorf("owner %s: the call outlasted its epoch: %w", o.owner.UID, ErrConflict))
			continue
		}
		if a.guardChanged(o, kvs) {
			o.fail(&rangesChangedError{rev: read.Header.Revision})
			continue
		}
		if a.resolve(o, kvs) {
			retry = append(retry, o)
		}
	}
	return retry
}

// guardChanged reports whether a ServiceCIDR o draws from changed since the index
// saw it: o must be planned again from the index that has seen the change.
func (a *Allocator) guardChanged(o *op, kvs map[string]*mvccpb.KeyValue) bool {
	for _, p := range o.picks {
		if p.guard == nil || p.held {
			continue
		}
		if kv := kvs[p.guard.key]; kv == nil || kv.ModRevision != p.guard.rev {
			return true
		}
	}
	return false
}

// nextRecord is the owner record o writes: the current one plus o's items, with o's
// request as the last one (Allocate) or the last one kept (Assign).
func (a *Allocator) nextRecord(o *op) (*ownerRecord, error) {
	var rec *ownerRecord
	if o.record != nil {
		rec = o.record.clone()
	} else {
		rec = &ownerRecord{}
	}
	rec.Namespace, rec.Name, rec.UID = o.owner.Namespace, o.owner.Name, o.owner.UID
	var last *lastRequest
	if !o.assign {
		last = &lastRequest{Hash: o.hash}
	}
	for _, p := range o.picks {
		rec.add(p.item)
		if last != nil {
			if p.item.Kind == KindClusterIP {
				last.ClusterIPs = append(last.ClusterIPs, p.item.Addr)
			} else {
				last.NodePorts = append(last.NodePorts, p.item.Port)
			}
		}
	}
	if last != nil {
		rec.Last = last
	}
	if rec.items() > MaxItems {
		return nil, badrequest.New("owner",
			fmt.Sprintf("owner %s would hold %d items; at most %d", o.owner.UID, rec.items(), MaxItems))
	}
	return rec, nil
}

func recordChanged(old, next *ownerRecord) bool {
	return string(appendOwnerRecord(nil, old)) != string(appendOwnerRecord(nil, next))
}

// resolve learns from the read-back of the batch's keys why the transaction failed,
// as far as o is concerned, and reports whether o should be retried. It fails o for a
// specific item another owner holds, replays o when its owner's last request was the
// same, follows a changed owner record, re-picks dynamic items that were taken, and
// asks again for a held item that was released since it was read.
func (a *Allocator) resolve(o *op, kvs map[string]*mvccpb.KeyValue) bool {
	o.rounds++
	o.hinted = false // what follows is what etcd says
	problem, done := a.resolveOwner(o, kvs[o.ownerKey])
	if done {
		return false
	}
	for _, p := range o.picks {
		changed, err := a.resolvePick(o, p, kvs[p.key])
		if err != nil {
			o.fail(err)
			return false
		}
		problem = problem || changed
	}
	if problem {
		o.conflicts++
	}
	if o.conflicts > maxConflicts || o.rounds > maxRounds {
		o.fail(fmt.Errorf("owner %s: %d conflicting transactions: %w", o.owner.UID, o.conflicts, ErrConflict))
		return false
	}
	select {
	case <-o.cancel:
		o.fail(context.Canceled)
		return false
	default:
	}
	return true
}

// resolveOwner follows o's owner record as read back (kv, nil when absent): it
// reports whether it differed from what o expected, and whether o is done (replayed:
// the owner's last request was o's and the owner still holds its result).
func (a *Allocator) resolveOwner(o *op, kv *mvccpb.KeyValue) (changed, done bool) {
	switch {
	case kv == nil && o.ownerRev != 0:
		o.ownerRev, o.record = 0, nil
		a.hints.del(o.owner.UID)
		return true, false
	case kv == nil || kv.ModRevision == o.ownerRev:
		return false, false
	}
	rec, err := decodeOwnerRecord(kv.Value)
	if err != nil {
		a.log.Warn("undecodable owner record; rewriting it", "key", o.ownerKey, "err", err)
		rec = &ownerRecord{}
	} else {
		a.hints.put(o.owner.UID, kv.ModRevision, rec)
	}
	o.ownerRev, o.record = kv.ModRevision, rec
	if !o.assign && rec.Last != nil && rec.Last.Hash == o.hash && rec.holdsLast() {
		o.release()
		o.res <- opResult{rev: kv.ModRevision, replayed: true,
			ips: rec.Last.ClusterIPs, ports: rec.Last.NodePorts}
		return true, true
	}
	return true, false
}

// resolvePick follows p's key as read back (kv, nil when absent): a held item
// released since is asked for again; a specific item of the owner is held; a
// specific item of another owner fails o (*AllocatedError); a dynamic pick somebody
// took is picked again (*FullError when the range has no other). It reports whether
// p changed.
func (a *Allocator) resolvePick(o *op, p *pick, kv *mvccpb.KeyValue) (bool, error) {
	if kv == nil {
		if !p.held {
			return false, nil
		}
		// Released since it was read: ask for it again, as at first; unless it lies
		// only in terminating ranges (no guard), where nothing new is allocated.
		if p.item.Kind == KindClusterIP && p.guard == nil {
			return true, a.terminatingError(p.item)
		}
		p.held, p.pending = false, p.r.Reserve(p.off)
		p.createRev, p.modRev, p.at = 0, 0, time.Time{}
		return true, nil
	}
	if p.held && kv.ModRevision == p.modRev {
		return false, nil
	}
	holder, at, err := decodeItemValue(kv.Value)
	if err != nil {
		a.log.Warn("undecodable allocation", "key", p.key, "err", err)
	}
	if p.specific {
		if holder.UID != o.owner.UID || err != nil {
			return true, &AllocatedError{Item: p.item, Holder: holder}
		}
		p.held = true
		p.createRev, p.modRev, p.at = kv.CreateRevision, kv.ModRevision, at
		if p.pending {
			a.idx.settleAt(kv.ModRevision, p.r, p.off)
			p.pending = false
		}
		return true, nil
	}
	// A dynamic pick somebody took: keep its bit busy until the watch has seen the
	// key, and pick again.
	if p.pending {
		a.idx.settleAt(kv.ModRevision, p.r, p.off)
		p.pending = false
	}
	off, ok := p.r.Pick()
	if !ok && p.item.Kind == KindClusterIP {
		// Its range filled up: the next ready one of the family, if any.
		np, err := a.pickIP(a.idx.tab.Load(), familyOf(p.item.Addr))
		if err != nil {
			return true, err
		}
		*p = *np
		return true, nil
	}
	if !ok {
		return true, &FullError{Range: p.r.name}
	}
	p.off, p.item, p.pending = off, p.r.item(off), true
	p.key = a.key(p.item)
	return true, nil
}

func (a *Allocator) result(o *op, rev int64, replayed bool) opResult {
	r := opResult{rev: rev, replayed: replayed}
	for _, p := range o.picks {
		if p.item.Kind == KindClusterIP {
			r.ips = append(r.ips, p.item.Addr)
		} else {
			r.ports = append(r.ports, p.item.Port)
		}
	}
	return r
}
