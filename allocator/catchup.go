package allocator

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The catch-up after a checkpoint replays the item keys' events from the checkpoint's
// revision to the one the start read. A watch that starts behind is an unsynced watcher
// in etcd, and etcd paces those: every 100 ms (watchResyncPeriod, in etcd's
// mvcc/watchable_store.go, syncWatchersLoop) it reads every event from the oldest
// unsynced watcher's revision on and sends each unsynced watcher the events of at most
// 1,000 revisions (watchBatchMaxRevs, watcher_group.go). One watch replays 10,000
// revisions a second, whatever the machine: a checkpoint 36,000 revisions behind (a
// burst of Releases, each a revision of its own) took 3.6 s to replay at a million
// allocations, and every round read the whole rest of the history again.
//
// So the catch-up splits the revisions into parts, each replayed by a watch of its own
// on one stream, all started at once: each round of etcd's loop serves every unsynced
// watcher from one read, and a part of 1,000 revisions comes in its first batch. The
// parts' events are applied in order: those of the part being applied at once, those
// of later parts kept until the parts before them are done. A part is done when its
// watch delivers an event of the next part's revisions, or a progress notification at
// or past its end (etcd sends one only when every watch of the stream is synced); its
// watch is then canceled, so that it leaves etcd's unsynced watchers. The last part is
// open-ended, the watch of a catch-up of one part.

const (
	// catchUpSpan is how many revisions each watch of a catch-up replays: as many as
	// etcd sends an unsynced watcher in one batch.
	catchUpSpan = 1000
	// catchUpWatches bounds the watches of a catch-up: past catchUpWatches ×
	// catchUpSpan revisions, each part replays more, in as many rounds of etcd's loop.
	catchUpWatches = 64
)

// catchUpPart is one part of a catch-up: the events from its watch's start revision
// to end (exclusive; 0 for the last part, open-ended).
type catchUpPart struct {
	end    int64
	cancel context.CancelFunc
	evs    []*clientv3.Event // received before the part's turn
	done   bool              // every event before end received
	// notified is the revision of the last progress notification received before the
	// part's turn: its events up to there are in evs.
	notified int64
}

// catchUpResp is a response of part k's watch; closed: its channel closed.
type catchUpResp struct {
	k      int
	resp   clientv3.WatchResponse
	closed bool
}

// catchUp applies the item keys' events after the index's revision until it reaches
// target, asking etcd for progress notifications to get past writes elsewhere.
func (ix *rangeIndex) catchUp(ctx context.Context, target int64) error {
	if ix.progress.Rev() >= target {
		return nil
	}
	from := ix.progress.Rev() + 1
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	out := make(chan catchUpResp)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	parts := ix.catchUpParts(wctx, from, target, out, &wg)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	cur := 0
	for ix.progress.Rev() < target {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			ix.requestProgress(wctx)
		case r := <-out:
			if err := ix.catchUpResponse(ctx, parts, &cur, r, from); err != nil {
				return err
			}
		}
	}
	return nil
}

// catchUpParts starts the watches of the parts of a catch-up from from to target, on
// one stream (wctx's), each forwarding its responses to out until wctx ends.
func (ix *rangeIndex) catchUpParts(wctx context.Context, from, target int64, out chan<- catchUpResp,
	wg *sync.WaitGroup) []catchUpPart {
	span := ix.catchUpSpan
	if span <= 0 {
		span = catchUpSpan
	}
	revs := target - from + 1
	n := min(catchUpWatches, (revs+span-1)/span)
	span = (revs + n - 1) / n
	n = (revs + span - 1) / span // no part starts past target (etcd sends it no progress notice)
	parts := make([]catchUpPart, n)
	for k := range parts {
		start := from + int64(k)*span
		if k < len(parts)-1 {
			parts[k].end = start + span
		}
		// A child of wctx: the same metadata, so the same stream; canceling it ends this
		// watch alone.
		pctx, pcancel := context.WithCancel(wctx)
		parts[k].cancel = pcancel
		wch := ix.cli.Watch(pctx, ix.watchStart, clientv3.WithRange(ix.watchEnd), clientv3.WithRev(start))
		wg.Go(func() {
			for resp := range wch {
				select {
				case out <- catchUpResp{k: k, resp: resp}:
				case <-wctx.Done():
					return
				}
			}
			select {
			case out <- catchUpResp{k: k, closed: true}:
			case <-wctx.Done():
			}
		})
	}
	return parts
}

// catchUpResponse takes r, a response of part r.k: the current part's events are
// applied, a later part's kept; when the current part is done, the next parts' kept
// events are applied in turn, up to the first part not done.
func (ix *rangeIndex) catchUpResponse(ctx context.Context, parts []catchUpPart, cur *int, r catchUpResp,
	from int64) error {
	p := &parts[r.k]
	if p.done {
		return nil // the rest of a canceled watch
	}
	resp := r.resp
	switch {
	case r.closed:
		return fmt.Errorf("catch up from %d: watch closed", from)
	case resp.CompactRevision != 0:
		return fmt.Errorf("%w: revision %d compacted (at %d)", errNoCheckpoint, from, resp.CompactRevision)
	case resp.Err() != nil:
		return fmt.Errorf("catch up from %d: %w", from, resp.Err())
	case resp.IsProgressNotify():
		switch {
		case p.end != 0 && resp.Header.Revision >= p.end-1:
			p.done = true
		case r.k == *cur:
			ix.advance(resp.Header.Revision)
		default:
			p.notified = resp.Header.Revision
		}
	default:
		evs := resp.Events
		if p.end != 0 {
			for i, ev := range evs {
				if ev.Kv.ModRevision >= p.end {
					evs, p.done = evs[:i], true
					break
				}
			}
		}
		if r.k != *cur {
			p.evs = append(p.evs, evs...)
		} else if err := ix.apply(ctx, evs); err != nil {
			return err
		}
	}
	if p.done {
		p.cancel()
	}
	for *cur < len(parts)-1 && parts[*cur].done {
		ix.advance(parts[*cur].end - 1)
		*cur++
		next := &parts[*cur]
		if err := ix.apply(ctx, next.evs); err != nil {
			return err
		}
		if next.end == 0 && next.notified > 0 {
			ix.advance(next.notified) // the last part: its events up to there are applied
		}
		next.evs = nil
	}
	return nil
}
