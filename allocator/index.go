package allocator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bits-and-blooms/bitset"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/etcdwatch"
)

// The index: each range's bitmap, kept current by a watch of the item keys, and the
// revision it reflects (a.progress), which Sync waits for.

// defaultSyncTimeout bounds how long Sync waits for the watch.
const defaultSyncTimeout = 5 * time.Second

type settleEntry struct {
	rev int64
	r   *rng
	off uint64
}

// reload lists every item key at one revision and rebuilds the used bitsets, keeping
// the pending reservations; the index then reflects that revision.
func (a *Allocator) reload(ctx context.Context) error {
	used := make(map[*rng]*bitset.BitSet, len(a.ranges))
	for _, r := range a.ranges {
		used[r] = r.NewUsed()
	}
	var rev int64
	key := a.watchStart
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(a.watchEnd), clientv3.WithKeysOnly(),
			clientv3.WithLimit(10000), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := a.cli.Get(ctx, key, opts...)
		if err != nil {
			return fmt.Errorf("load allocations: %w", err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			it, ok := a.parseKey(kv.Key)
			if !ok {
				continue
			}
			r, off, err := a.locate(it)
			if err != nil {
				a.log.Warn("allocation outside the configured ranges", "key", string(kv.Key))
				continue
			}
			used[r].Set(uint(off)) // off < size: locate checked it
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	for _, r := range a.ranges {
		r.Replace(used[r])
	}
	a.advance(rev)
	return nil
}

// advance records that the index reflects rev and clears the pending bits settled
// by then.
func (a *Allocator) advance(rev int64) {
	a.settleMu.Lock()
	a.progress.Advance(rev)
	now := a.progress.Rev()
	var done []settleEntry
	keep := a.settle[:0]
	for _, e := range a.settle {
		if e.rev <= now {
			done = append(done, e)
		} else {
			keep = append(keep, e)
		}
	}
	clear(a.settle[len(keep):])
	a.settle = keep
	a.settleMu.Unlock()
	for _, e := range done {
		e.r.Unpend(e.off)
	}
}

// settleAt clears the pending bit of off once the index reflects rev, when the
// watch has recorded the key written at rev.
func (a *Allocator) settleAt(rev int64, r *rng, off uint64) {
	a.settleMu.Lock()
	if a.progress.Rev() >= rev {
		a.settleMu.Unlock()
		r.Unpend(off)
		return
	}
	a.settle = append(a.settle, settleEntry{rev: rev, r: r, off: off})
	a.settleMu.Unlock()
}

// Sync waits until the index reflects every write etcd committed before the call: it
// reads etcd's revision (a linearizable read), then waits for Run's watch to reach
// it, for at most 5 seconds. What Free and Ranges report next is then at least as new
// as any allocation or release acknowledged before Sync was called. It returns
// ErrNotRunning when the watch is behind and Run is not running, ErrNotSynced when
// the watch stays behind for too long, and etcd's and ctx's errors.
func (a *Allocator) Sync(ctx context.Context) error {
	err := a.progress.Sync(ctx, a.cli, a.configKey, a.syncTimeout)
	var be *etcdwatch.BehindError
	switch {
	case !errors.As(err, &be):
		return err
	case be.Running:
		return fmt.Errorf("allocation index: %w: %w", err, ErrNotSynced)
	}
	return fmt.Errorf("allocation index: %w: %w", err, ErrNotRunning)
}

// watchLoop applies the item keys' changes to the index from the revision it
// reflects on, re-listing after a compaction. Progress notifications (which Sync
// asks for) move the index past writes outside the watched keys. It returns when ctx
// ends.
func (a *Allocator) watchLoop(ctx context.Context) error {
	a.progress.SetRunning(true)
	defer a.progress.SetRunning(false)
	etcdwatch.Loop(ctx, a.log, "allocation watch", 2*time.Second, a.watchOnce)
	return nil
}

// watchOnce watches from the index's revision + 1 until the watch fails.
func (a *Allocator) watchOnce(ctx context.Context) error {
	from := a.progress.Rev() + 1
	// Its own watch stream: Sync waits for progress notifications (see etcdwatch).
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(etcdwatch.OwnStream(ctx, "allocator "+a.watchStart)))
	defer cancel()
	wch := a.cli.Watch(wctx, a.watchStart, clientv3.WithRange(a.watchEnd), clientv3.WithRev(from))
	for {
		select {
		case <-a.progress.Asked():
			// wctx: the request goes on the watch's stream (same metadata).
			if err := a.cli.RequestProgress(wctx); err != nil {
				a.log.Debug("allocation watch progress request failed", "err", err)
			}
		case resp, ok := <-wch:
			switch {
			case !ok:
				return errors.New("watch channel closed")
			case resp.CompactRevision != 0:
				a.log.Warn("allocation watch compacted; re-listing", "from", from)
				if err := a.reload(ctx); err != nil {
					return fmt.Errorf("re-list allocations: %w", err)
				}
				return fmt.Errorf("watch from %d: compacted at %d", from, resp.CompactRevision)
			case resp.Err() != nil:
				return resp.Err()
			case resp.IsProgressNotify():
				a.advance(resp.Header.Revision)
				continue
			}
			a.apply(resp.Events)
		}
	}
}

func (a *Allocator) apply(evs []*clientv3.Event) {
	if len(evs) == 0 {
		return
	}
	for _, ev := range evs {
		it, ok := a.parseKey(ev.Kv.Key)
		if !ok {
			continue
		}
		r, off, err := a.locate(it)
		if err != nil {
			continue
		}
		r.SetUsed(off, ev.Type == mvccpb.PUT)
	}
	a.advance(evs[len(evs)-1].Kv.ModRevision)
}
