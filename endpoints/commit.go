package endpoints

import (
	"context"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/leader"
)

// Limits of one group commit: etcd's default --max-txn-ops is 128 (the compares count
// too: one per write plus the fence), and a request must stay under its 1.5 MiB limit.
const (
	maxBatchWrites = 64
	maxBatchBytes  = 1 << 20
	// maxInFlight transactions at once: etcd commits concurrent transactions with one
	// fsync, so a few in flight keep its pipeline full.
	maxInFlight = 4
)

// write is one Endpoints write a worker hands to the committer: put ep (or delete when
// ep is nil) at key, if etcd still holds what cur says. done runs once with the
// revision or the error (leader.ErrFenceLost, errConflict, or etcd's).
type write struct {
	key  string
	cur  storedObj
	ep   *Endpoints
	val  []byte
	done func(rev int64, err error)
}

// committer groups the writes of the workers into transactions, so that the initial
// sync of thousands of Services costs tens of fsyncs, not thousands, while each write
// keeps its own compare: a batch whose compares fail is split and retried, never
// applied in part.
type committer struct {
	t  *term
	in chan *write
}

func newCommitter(t *term) *committer {
	return &committer{t: t, in: make(chan *write, maxBatchWrites*maxInFlight)}
}

// submit queues w; it blocks while the committer is saturated, and fails w when ctx
// ends first.
func (cm *committer) submit(ctx context.Context, w *write) {
	select {
	case cm.in <- w:
	case <-ctx.Done():
		w.done(0, ctx.Err())
	}
}

// run commits batches until ctx ends; writes still queued then fail with ctx's error.
func (cm *committer) run(ctx context.Context) {
	sem := make(chan struct{}, maxInFlight)
	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		for {
			select {
			case w := <-cm.in:
				w.done(0, ctx.Err())
			default:
				return
			}
		}
	}()
	for {
		var first *write
		select {
		case <-ctx.Done():
			return
		case first = <-cm.in:
		}
		batch, size := []*write{first}, len(first.val)
	fill:
		for len(batch) < maxBatchWrites && size < maxBatchBytes {
			select {
			case w := <-cm.in:
				batch = append(batch, w)
				size += len(w.val)
			default:
				break fill
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			for _, w := range batch {
				w.done(0, ctx.Err())
			}
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			cm.commit(ctx, batch)
		}()
	}
}

// commit writes batch in one transaction that holds only if the term still leads and
// every object is what its write expects. When a compare fails, the writes whose
// objects changed get errConflict (after the term's view learnt the new state) and the
// others are committed again without them.
func (cm *committer) commit(ctx context.Context, batch []*write) {
	t := cm.t
	for len(batch) > 0 {
		cmps := make([]clientv3.Cmp, 0, len(batch)+1)
		cmps = append(cmps, t.fence.Cmp())
		ops := make([]clientv3.Op, 0, len(batch))
		gets := make([]clientv3.Op, 0, len(batch)+1)
		gets = append(gets, t.fence.Get())
		for _, w := range batch {
			k := t.c.etcdKey(w.key)
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", w.cur.modRev()))
			if w.ep == nil {
				ops = append(ops, clientv3.OpDelete(k))
			} else {
				ops = append(ops, clientv3.OpPut(k, string(w.val)))
			}
			gets = append(gets, clientv3.OpGet(k))
		}
		resp, err := t.c.cli.Txn(ctx).If(cmps...).Then(ops...).Else(gets...).Commit()
		if err != nil {
			for _, w := range batch {
				w.done(0, fmt.Errorf("write endpoints %s: %w", w.key, err))
			}
			return
		}
		rev := resp.Header.Revision
		if resp.Succeeded {
			for _, w := range batch {
				t.see(w.key, w.committed(rev), rev)
				w.done(rev, nil)
			}
			return
		}
		if !t.fence.Held(resp, 0) {
			for _, w := range batch {
				w.done(0, leader.ErrFenceLost)
			}
			return
		}
		var again []*write
		for i, w := range batch {
			kvs := resp.Responses[i+1].GetResponseRange().GetKvs()
			switch {
			case len(kvs) == 0 && w.cur.modRev() == 0, len(kvs) == 1 && kvs[0].ModRevision == w.cur.modRev():
				again = append(again, w)
			case len(kvs) == 0:
				t.see(w.key, nil, rev)
				w.done(0, errConflict)
			default:
				e, err := decode(kvs[0].Value, kvs[0].ModRevision, kvs[0].CreateRevision)
				if err != nil {
					w.done(0, fmt.Errorf("endpoints %s: %w", w.key, err))
					continue
				}
				t.see(w.key, e, kvs[0].ModRevision)
				w.done(0, errConflict)
			}
		}
		batch = again
	}
}

// modRev is the ModRevision etcd must still have for the object (0: absent).
func (s storedObj) modRev() int64 {
	if s.ep == nil {
		return 0
	}
	return s.ep.Revision
}

// committed is the object as etcd holds it after the write committed at rev (nil for
// a delete).
func (w *write) committed(rev int64) *Endpoints {
	if w.ep == nil {
		return nil
	}
	cp := *w.ep
	cp.Revision, cp.CreateRevision = rev, rev
	if w.cur.ep != nil {
		cp.CreateRevision = w.cur.ep.CreateRevision
	}
	return &cp
}
