package endpoints

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/leader"
)

// Limits of one group commit: a request must stay under etcd's 1.5 MiB limit (its
// --max-request-bytes: maxTxnBytes of values leaves room for the keys, compares and
// the request's framing), and the compares of a transaction (one per op plus the
// fence) under its --max-txn-ops (Config.MaxTxnOps, etcd's default 128).
const (
	maxBatchOps   = 64
	maxBatchBytes = 1 << 20
	maxTxnBytes   = 1 << 20
	// maxInFlight transactions at once: etcd commits concurrent transactions with one
	// fsync, so a few in flight keep its pipeline full.
	maxInFlight = 4
)

// writeOp is one key of a write: put val at key (delete when val is nil), if etcd
// still holds the ModRevision modRev there (0: nothing). view is the term's view of
// the key's kind; obj the object written (nil for a delete), createRev its
// CreateRevision when it exists already.
type writeOp struct {
	key       string
	modRev    int64
	val       []byte
	view      storedView
	obj       any
	createRev int64
}

// storedView is the term's view of one kind of stored object, kept current by the
// committer: committed records a write of obj (nil: a delete) at key that committed at
// rev, over an object created at createRev (0: none); refresh records what etcd holds
// for a key after a conflict (kv nil: nothing, at rev); unknown marks a key whose write
// may or may not have committed (the transaction failed without an answer): the view
// reads it again from etcd before it is used.
type storedView interface {
	committed(key string, obj any, createRev, rev int64)
	refresh(key string, kv *mvccpb.KeyValue, rev int64)
	unknown(key string)
}

// write is what a sync hands to the committer: ops that commit in one transaction
// (one revision) or not at all, so that a watcher never sees half of a Service's
// change. done runs once with the revision or the error (leader.ErrFenceLost,
// errConflict, or etcd's). A write larger than one transaction takes (more ops than
// --max-txn-ops, more bytes than a request) is committed in several, in order: the
// sync puts creates first, then updates, then deletes, so that a watcher sees an
// endpoint of a group leave its old slice only after it is in its new one, never in
// two slices of its group (endpoints do not move within a group).
type write struct {
	ops  []writeOp
	done func(rev int64, err error)
}

func (w *write) bytes() int {
	n := 0
	for _, op := range w.ops {
		n += len(op.val)
	}
	return n
}

// committer groups the writes of the workers into transactions, so that the initial
// sync of thousands of Services costs tens of fsyncs, not thousands, while each write
// keeps its own compares: a batch whose compares fail is split and retried, never
// applied in part.
//
// The allocator has a group committer too (allocator/committer.go, batch.go): both
// queue writes, pack them under etcd's limits and keep a few transactions in flight,
// but what a transaction is differs. Here one leader writes objects its syncs computed,
// fenced by the election key; a write whose keys changed goes back to its sync whole
// (errConflict: the views learn the new state from the Else's reads), the others are
// committed again without it, and a write larger than a transaction is split in order.
// There every replica commits at once, each request is a plan that a failed compare
// changes (an address picked again, an owner's earlier result replayed), read back
// outside the transaction. A shared committer would share the queue alone.
type committer struct {
	cli     *clientv3.Client
	fence   leader.Fence // of the term: every transaction compares it
	in      chan *write
	maxOps  int           // ops of one transaction: MaxTxnOps minus the fence
	stopped chan struct{} // closed once run has failed every write it will not commit
}

func newCommitter(cli *clientv3.Client, fence leader.Fence, maxTxnOps int) *committer {
	return &committer{cli: cli, fence: fence, in: make(chan *write, maxBatchOps*maxInFlight),
		maxOps: maxTxnOps - 1, stopped: make(chan struct{})}
}

// errConflict: a stored object changed since it was read (the views know its new
// state): the sync runs again on the fresh state.
var errConflict = errors.New("endpoints: stored object changed under the write")

// errCommitterStopped fails a write submitted after the term's committer stopped.
var errCommitterStopped = errors.New("endpoints: the term is over: nothing more is written")

// submit queues w; it blocks while the committer is saturated, and fails w when ctx
// ends first or the committer has stopped.
func (cm *committer) submit(ctx context.Context, w *write) {
	select {
	case <-cm.stopped:
		w.done(0, errCommitterStopped)
		return
	default:
	}
	select {
	case cm.in <- w:
	case <-ctx.Done():
		w.done(0, ctx.Err())
	case <-cm.stopped:
		w.done(0, errCommitterStopped)
	}
}

// fits reports whether a write of ops ops and size bytes fits in one transaction.
func (cm *committer) fits(ops, size int) bool { return ops <= cm.maxOps && size <= maxTxnBytes }

// run commits batches until ctx ends; writes still queued then fail with ctx's error.
func (cm *committer) run(ctx context.Context) {
	sem := make(chan struct{}, maxInFlight)
	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		close(cm.stopped)
		for {
			select {
			case w := <-cm.in:
				w.done(0, errCommitterStopped)
			default:
				return
			}
		}
	}()
	var next *write // taken from the queue but left for the next batch
	for {
		first := next
		next = nil
		if first == nil {
			select {
			case <-ctx.Done():
				return
			case first = <-cm.in:
			}
		}
		batch, ops, size := []*write{first}, len(first.ops), first.bytes()
	fill:
		for ops < maxBatchOps && size < maxBatchBytes {
			select {
			case w := <-cm.in:
				if !cm.fits(ops+len(w.ops), size+w.bytes()) {
					next = w
					break fill
				}
				batch, ops, size = append(batch, w), ops+len(w.ops), size+w.bytes()
			default:
				break fill
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			for _, w := range append(batch, next) {
				if w != nil {
					w.done(0, ctx.Err())
				}
			}
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if len(batch) == 1 && !cm.fits(len(batch[0].ops), batch[0].bytes()) {
				cm.commitLarge(ctx, batch[0])
				return
			}
			cm.commit(ctx, batch)
		})
	}
}

// commit writes batch in one transaction that holds only if the term still leads and
// every key is what its op expects. When a compare fails, the writes whose keys
// changed get errConflict (after the term's views learnt the new state) and the others
// are committed again without them.
func (cm *committer) commit(ctx context.Context, batch []*write) {
	for len(batch) > 0 {
		resp, err := cm.txn(ctx, batch)
		if err != nil {
			// The transaction may have committed: the views read those keys again
			// before they are used, so that a retry never builds on a state that
			// lacks what it wrote.
			for _, w := range batch {
				for _, op := range w.ops {
					op.view.unknown(op.key)
				}
				w.done(0, err)
			}
			return
		}
		rev := resp.Header.Revision
		if resp.Succeeded {
			for _, w := range batch {
				for _, op := range w.ops {
					op.view.committed(op.key, op.obj, op.createRev, rev)
				}
				w.done(rev, nil)
			}
			return
		}
		if !cm.fence.Held(resp, 0) {
			for _, w := range batch {
				w.done(0, leader.ErrFenceLost)
			}
			return
		}
		var again []*write
		at := 1 // the response of the first op's get
		for _, w := range batch {
			if cm.conflicts(w, resp, at, rev) {
				w.done(0, errConflict)
			} else {
				again = append(again, w)
			}
			at += len(w.ops)
		}
		batch = again
	}
}

// conflicts reports whether an op of w found its key changed, by the gets of a failed
// transaction (from response at), and then refreshes the views of w's keys.
func (cm *committer) conflicts(w *write, resp *clientv3.TxnResponse, at int, rev int64) bool {
	changed := false
	for i, op := range w.ops {
		kvs := resp.Responses[at+i].GetResponseRange().GetKvs()
		held := len(kvs) == 0 && op.modRev == 0 || len(kvs) == 1 && kvs[0].ModRevision == op.modRev
		changed = changed || !held
	}
	if !changed {
		return false
	}
	for i, op := range w.ops {
		var kv *mvccpb.KeyValue
		if kvs := resp.Responses[at+i].GetResponseRange().GetKvs(); len(kvs) == 1 {
			kv = kvs[0]
		}
		op.view.refresh(op.key, kv, rev)
	}
	return true
}

// txn runs the fenced transaction of batch's ops, with a get of the fence and of every
// key in Else.
func (cm *committer) txn(ctx context.Context, batch []*write) (*clientv3.TxnResponse, error) {
	n := 0
	for _, w := range batch {
		n += len(w.ops)
	}
	cmps := make([]clientv3.Cmp, 0, n+1)
	ops := make([]clientv3.Op, 0, n)
	gets := make([]clientv3.Op, 0, n+1)
	cmps = append(cmps, cm.fence.Cmp())
	gets = append(gets, cm.fence.Get())
	for _, w := range batch {
		for _, op := range w.ops {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(op.key), "=", op.modRev))
			if op.val == nil {
				ops = append(ops, clientv3.OpDelete(op.key))
			} else {
				ops = append(ops, clientv3.OpPut(op.key, string(op.val)))
			}
			gets = append(gets, clientv3.OpGet(op.key))
		}
	}
	resp, err := cm.cli.Txn(ctx).If(cmps...).Then(ops...).Else(gets...).Commit()
	if err != nil {
		return nil, fmt.Errorf("write %d keys (%s, ...): %w", n, batch[0].ops[0].key, err)
	}
	return resp, nil
}

// commitLarge commits a write larger than one transaction takes, in transactions
// that each take as many of its ops, in order, as fit; a conflict or an error stops
// it (what committed before stays, and the views know it).
func (cm *committer) commitLarge(ctx context.Context, w *write) {
	var rev int64
	for start := 0; start < len(w.ops); {
		end, size := start, 0
		for end < len(w.ops) && (end == start || cm.fits(end-start+1, size+len(w.ops[end].val))) {
			size += len(w.ops[end].val)
			end++
		}
		part := &write{ops: w.ops[start:end]}
		var err error
		part.done = func(r int64, e error) { rev, err = r, e }
		cm.commit(ctx, []*write{part})
		if err != nil {
			w.done(0, err)
			return
		}
		start = end
	}
	w.done(rev, nil)
}
