package allocator

import (
	"context"
	"slices"
	"sync"
	"time"
)

// committer is the group committer: Allocate and Assign calls (ops) queue for it
// while Run runs, and it packs as many as fit in maxTxnOps keys, none twice, into one
// transaction (commit: batch.go), with up to conc transactions in flight. Ops wait in
// the queue while every slot is busy, which is what groups them. Without Run, ops
// commit one by one in their caller's goroutine.
type committer struct {
	conc int
	// commit runs one transaction for a batch and returns the ops to retry.
	commit func(ctx context.Context, batch []*op) []*op

	qmu     sync.Mutex
	queue   []*op
	seen    map[string]struct{} // take's set of a batch's keys, reused
	running bool
	stopped bool
	notify  chan struct{}
}

// groupWait is how long a transaction in flight may hold back the next one while
// the queue fills: etcd commits in milliseconds, and one that takes longer is stuck.
const groupWait = 100 * time.Millisecond

// deleteTime removes one at from ts.
func deleteTime(ts []time.Time, at time.Time) []time.Time {
	if i := slices.IndexFunc(ts, at.Equal); i >= 0 {
		return slices.Delete(ts, i, i+1)
	}
	return ts
}

// txnTimeout bounds one group-commit transaction.
const txnTimeout = 30 * time.Second

func newCommitter(conc int, commit func(ctx context.Context, batch []*op) []*op) *committer {
	return &committer{conc: conc, commit: commit, notify: make(chan struct{}, 1)}
}

// submit commits o through the group committer when Run is running, else alone.
func (c *committer) submit(ctx context.Context, o *op) opResult {
	o.cancel = ctx.Done()
	o.res = make(chan opResult, 1)
	c.qmu.Lock()
	if !c.running {
		c.qmu.Unlock()
		c.commitAlone(ctx, o)
	} else {
		c.queue = append(c.queue, o)
		c.qmu.Unlock()
		select {
		case c.notify <- struct{}{}:
		default:
		}
	}
	select {
	case r := <-o.res:
		return r
	case <-ctx.Done():
		// The op may still commit; a retry with the same owner replays it.
		return opResult{err: ctx.Err()}
	}
}

// commitAlone runs o's transactions synchronously.
func (c *committer) commitAlone(ctx context.Context, o *op) {
	batch := []*op{o}
	for len(batch) > 0 && ctx.Err() == nil {
		batch = c.commit(ctx, batch)
	}
	if len(batch) > 0 {
		o.fail(ctx.Err())
	}
}

// run is the group committer's loop, until ctx ends: it packs queued ops into transactions of at
// most maxTxnOps keys, with up to c.conc transactions in flight. Ops wait in the
// queue while every slot is busy, which is what groups them.
func (c *committer) run(ctx context.Context) error {
	c.qmu.Lock()
	c.running = true
	c.qmu.Unlock()
	slots := make(chan struct{}, c.conc)
	done := make(chan time.Time, c.conc) // each finished transaction's start
	inflight := 0
	var started []time.Time           // of the transactions in flight
	stuck := time.NewTimer(time.Hour) // when the oldest of them passes groupWait
	defer stuck.Stop()
	defer func() {
		for ; inflight > 0; inflight-- {
			<-done
		}
		c.qmu.Lock()
		c.running, c.stopped = false, true
		q := c.queue
		c.queue = nil
		c.qmu.Unlock()
		for _, o := range q {
			o.fail(ErrNotRunning)
		}
	}()
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		var batch []*op
		for batch == nil {
			// With a transaction in flight, wait for half a transaction's worth of
			// keys (or for it to finish): big batches cost etcd less per request. Not
			// behind a transaction that has taken longer than groupWait, though: it
			// waits in a stalled member or for an election, and the calls queued
			// behind it would wait as long.
			minKeys, wake := 1, (<-chan time.Time)(nil)
			if inflight > 0 {
				if young := groupWait - time.Since(slices.MinFunc(started, time.Time.Compare)); young > 0 {
					minKeys = maxTxnOps / 2
					stuck.Reset(young)
					wake = stuck.C
				}
			}
			if batch = c.take(minKeys); batch != nil {
				break
			}
			select {
			case <-c.notify:
			case at := <-done:
				inflight--
				started = deleteTime(started, at)
			case <-wake:
			case <-ctx.Done():
				<-slots
				return nil
			}
		}
		inflight++
		at := time.Now()
		started = append(started, at)
		go c.commitBatch(ctx, batch, slots, done, at)
		// Collect finished transactions without blocking.
		for more := true; more; {
			select {
			case at := <-done:
				inflight--
				started = deleteTime(started, at)
			default:
				more = false
			}
		}
	}
}

// commitBatch commits batch (started at at), requeues what is to be retried, and
// gives its slot back, then reports on done. A transaction still in flight after
// groupWait gives its slot back early: it waits in a stalled member or for an
// election, and the slots are for transactions that etcd is committing.
func (c *committer) commitBatch(ctx context.Context, batch []*op, slots <-chan struct{},
	done chan<- time.Time, at time.Time) {
	var once sync.Once
	free := func() { once.Do(func() { <-slots }) }
	stalled := time.AfterFunc(groupWait, free)
	defer func() { stalled.Stop(); free(); done <- at }()
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), txnTimeout)
	retry := c.commit(tctx, batch)
	cancel()
	c.requeue(retry)
}

// take removes from the queue the ops of the next transaction: as many as fit in
// maxTxnOps keys (the compares of the ServiceCIDRs they draw from counted once each)
// without touching a key twice, if they have minKeys keys in all.
// Ops whose caller gave up are dropped.
func (c *committer) take(minKeys int) []*op {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if len(c.queue) == 0 {
		return nil
	}
	if minKeys > 1 {
		n := 0
		for _, o := range c.queue {
			if n += o.keys(); n >= minKeys {
				break
			}
		}
		if n < minKeys {
			return nil
		}
	}
	var batch []*op
	seen := c.seen
	clear(seen)
	n := epochOps // every transaction's compares of the epoch key
	keep := c.queue[:0]
	for i, o := range c.queue {
		if n >= maxTxnOps {
			keep = append(keep, c.queue[i:]...)
			break
		}
		select {
		case <-o.cancel:
			o.fail(context.Canceled)
			continue
		default:
		}
		k := o.keys() + o.newGuards(seen)
		if n+k > maxTxnOps || dup(seen, o) {
			keep = append(keep, o)
			continue
		}
		if seen == nil {
			seen = make(map[string]struct{}, 2*maxTxnOps)
			c.seen = seen
		}
		seen[o.ownerKey] = struct{}{}
		for _, p := range o.picks {
			seen[p.key] = struct{}{}
			if p.guard != nil {
				seen[p.guard.id] = struct{}{} // compared once per transaction
			}
		}
		n += k
		batch = append(batch, o)
	}
	clear(c.queue[len(keep):])
	c.queue = keep
	return batch
}

func dup(seen map[string]struct{}, o *op) bool {
	if _, ok := seen[o.ownerKey]; ok {
		return true
	}
	for _, p := range o.picks {
		if _, ok := seen[p.key]; ok {
			return true
		}
	}
	return false
}

// requeue puts ops to retry at the head of the queue.
func (c *committer) requeue(ops []*op) {
	if len(ops) == 0 {
		return
	}
	c.qmu.Lock()
	if c.stopped {
		c.qmu.Unlock()
		for _, o := range ops {
			o.fail(ErrNotRunning)
		}
		return
	}
	c.queue = append(ops, c.queue...)
	c.qmu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}
