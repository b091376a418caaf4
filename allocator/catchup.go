package allocator

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/etcd/watch"
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
// So the catch-up splits the revisions into parts of 1,000, each replayed by a watch of
// its own: each round of etcd's loop serves every unsynced watcher from one read, and a
// part comes in its first batch. At most catchUpAhead parts are open ahead of the one
// being applied, the next opened as that one is done, so that the events kept at once
// are those of a few parts, not of the whole replay. The parts' events are applied in
// order: those of the part being applied at once, those of later parts kept until the
// parts before them are done. A part is done when its watch delivers an event of the
// next part's revisions, or a progress notification at or past its end; its watch is
// then canceled, so that it leaves etcd's unsynced watchers. The last part is
// open-ended, the watch of a catch-up of one part.
//
// Every part's watch has a gRPC stream of its own (watch.OwnStream), and progress is
// asked for on each part's stream: etcd answers a progress request with one notice for
// the whole stream, and etcd's client hands it to every watch the stream holds when it
// arrives. On a shared stream, a watch re-created after the stream broke could get a
// notice computed before it was registered, and take it for the end of its part, its
// events unseen. On a stream of one watch, the watch's create request always precedes
// the progress requests, so a notice is about that watch. The streams belong to a
// watcher of the catch-up's own, closed when it returns: a progress request on a stream
// that just ended opens it anew, and only closing the watcher ends that one.

const (
	// catchUpSpan is how many revisions each watch of a catch-up replays: as many as
	// etcd sends an unsynced watcher in one batch.
	catchUpSpan = 1000
	// catchUpAhead bounds the parts of a catch-up open ahead of the one being applied:
	// catchUpAhead+1 parts are replayed in each round of etcd's loop, and at most their
	// events are kept.
	catchUpAhead = 8
)

// catchUpPart is one part of a catch-up: the events from start to end (exclusive; 0
// for the last part, open-ended).
type catchUpPart struct {
	start, end int64
	ctx        context.Context // its watch's, on a stream of its own; nil until opened
	cancel     context.CancelFunc
	evs        []*clientv3.Event // received before the part's turn
	done       bool              // every event before end received
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

// catchUpRun is one catch-up: its watcher, its parts, the part being applied (cur) and
// how many are opened.
type catchUpRun struct {
	ix     *rangeIndex
	from   int64
	w      clientv3.Watcher
	wctx   context.Context // every part's watch's parent
	out    chan catchUpResp
	wg     sync.WaitGroup // the parts' forwarders
	parts  []catchUpPart
	cur    int
	opened int
}

// catchUp applies the item keys' events after the index's revision until it reaches
// target, asking etcd for progress notifications to get past writes elsewhere.
func (ix *rangeIndex) catchUp(ctx context.Context, target int64) error {
	if ix.progress.Rev() >= target {
		return nil
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	c := &catchUpRun{ix: ix, from: ix.progress.Rev() + 1, w: clientv3.NewWatcher(ix.cli), wctx: wctx,
		out: make(chan catchUpResp)}
	defer func() {
		cancel()
		_ = c.w.Close() // every stream it opened; an error here says nothing of the catch-up
		c.wg.Wait()
	}()
	c.parts = catchUpParts(c.from, target, ix.catchUpSpan)
	c.open()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for ix.progress.Rev() < target {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			for k := c.cur; k < c.opened; k++ {
				if p := &c.parts[k]; !p.done {
					ix.requestProgressOn(p.ctx, c.w) // p's own stream
				}
			}
		case r := <-c.out:
			if err := c.response(ctx, r); err != nil {
				return err
			}
		}
	}
	return nil
}

// catchUpParts splits the revisions from from to target into parts of span revisions
// (0: catchUpSpan), the last open-ended. No part starts past target: etcd sends no
// progress notice to a watch that starts after its revision.
func catchUpParts(from, target, span int64) []catchUpPart {
	if span <= 0 {
		span = catchUpSpan
	}
	parts := make([]catchUpPart, (target-from+span)/span)
	for k := range parts {
		parts[k].start = from + int64(k)*span
		if k < len(parts)-1 {
			parts[k].end = parts[k].start + span
		}
	}
	return parts
}

// open starts the watches of the parts up to catchUpAhead past the current one, each
// on a stream of its own and forwarding its responses to out until c.wctx ends.
func (c *catchUpRun) open() {
	for ; c.opened < len(c.parts) && c.opened <= c.cur+catchUpAhead; c.opened++ {
		k, p := c.opened, &c.parts[c.opened]
		// A child of wctx: canceling it ends this watch, and with it its stream.
		p.ctx, p.cancel = context.WithCancel(watch.OwnStream(c.wctx, fmt.Sprint("catch-up part ", k)))
		wch := c.w.Watch(p.ctx, c.ix.watchStart, clientv3.WithRange(c.ix.watchEnd), clientv3.WithRev(p.start))
		c.wg.Go(func() {
			for resp := range wch {
				select {
				case c.out <- catchUpResp{k: k, resp: resp}:
				case <-c.wctx.Done():
					return
				}
			}
			select {
			case c.out <- catchUpResp{k: k, closed: true}:
			case <-c.wctx.Done():
			}
		})
	}
}

// response takes r, a response of part r.k: the current part's events are applied, a
// later part's kept; when the current part is done, the next parts' kept events are
// applied in turn, up to the first part not done, and as many parts opened.
func (c *catchUpRun) response(ctx context.Context, r catchUpResp) error {
	p := &c.parts[r.k]
	if p.done {
		return nil // the rest of a canceled watch
	}
	resp := r.resp
	switch {
	case r.closed:
		return fmt.Errorf("catch up from %d: watch closed", c.from)
	case resp.CompactRevision != 0:
		return fmt.Errorf("%w: revision %d compacted (at %d)", errNoCheckpoint, c.from, resp.CompactRevision)
	case resp.Err() != nil:
		return fmt.Errorf("catch up from %d: %w", c.from, resp.Err())
	case resp.IsProgressNotify():
		switch {
		case p.end != 0 && resp.Header.Revision >= p.end-1:
			p.done = true
		case r.k == c.cur:
			c.ix.advance(resp.Header.Revision)
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
		if r.k != c.cur {
			p.evs = append(p.evs, evs...)
		} else if err := c.ix.apply(ctx, evs); err != nil {
			return err
		}
	}
	if p.done {
		p.cancel()
	}
	return c.next(ctx)
}

// next moves past the parts done from the current one on, applying each next part's
// kept events, and opens the parts that then come within catchUpAhead.
func (c *catchUpRun) next(ctx context.Context) error {
	for c.cur < len(c.parts)-1 && c.parts[c.cur].done {
		c.ix.advance(c.parts[c.cur].end - 1)
		c.cur++
		next := &c.parts[c.cur]
		if err := c.ix.apply(ctx, next.evs); err != nil {
			return err
		}
		if next.end == 0 && next.notified > 0 {
			c.ix.advance(next.notified) // the last part: its events up to there are applied
		}
		next.evs = nil
	}
	c.open()
	return nil
}
