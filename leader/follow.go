package leader

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/etcd/watch"
)

// followBackoff caps the pause between two sessions of the election's watch.
const followBackoff = 2 * time.Second

// candidates is the election as a watch of its prefix sees it: every campaigning key,
// its CreateRevision and its value (a replica's identity), as of revision rev. The
// leader is the key with the lowest CreateRevision, as concurrency.Election.Leader
// defines it. The view is known only from a listing until the watch that follows it
// fails: a listing that no watch keeps current would go stale unseen.
type candidates struct {
	mu     sync.Mutex
	synced bool // a listing was taken and the watch after it has not failed
	rev    int64
	keys   map[string]candidate
	// first is the leader's identity while synced with at least one candidate, nil
	// otherwise: what Elector.Leader reads without taking mu.
	first atomic.Pointer[string]
}

// candidate is one campaigning key of the election.
type candidate struct {
	create int64
	value  string
}

// leader returns the identity of the leader in the view; ok is false when the view is
// not known or names no candidate.
func (c *candidates) leader() (identity string, ok bool) {
	if p := c.first.Load(); p != nil {
		return *p, true
	}
	return "", false
}

// reset replaces the view with a listing of the whole prefix and marks it known: the
// watch that the caller starts from the revision after resp keeps it current.
func (c *candidates) reset(resp *clientv3.GetResponse) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.synced = true
	c.replace(resp)
}

// merge replaces the view with a listing of the whole prefix read outside the watch,
// if the view is known and the listing newer: a leader read after a refusal is then
// followed at once, even while the watch lags. The events of the watch that the
// listing already holds are skipped by apply (their revisions are not above rev).
// Linearizable reads make this safe: a later read never sees an older revision.
func (c *candidates) merge(resp *clientv3.GetResponse) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.synced && resp.Header.Revision > c.rev {
		c.replace(resp)
	}
}

// replace sets the view to resp's keys at resp's revision; mu is held.
func (c *candidates) replace(resp *clientv3.GetResponse) {
	c.rev = resp.Header.Revision
	c.keys = make(map[string]candidate, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		c.keys[string(kv.Key)] = candidate{create: kv.CreateRevision, value: string(kv.Value)}
	}
	c.publish()
}

// apply applies the events of one watch response. Events at or below the view's
// revision are skipped (a merged listing holds them already); the events of one
// transaction share a revision, so the bound is the revision before the response.
func (c *candidates) apply(evs []*clientv3.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.synced {
		return
	}
	base := c.rev
	for _, ev := range evs {
		rev := ev.Kv.ModRevision
		if rev <= base {
			continue
		}
		switch ev.Type {
		case mvccpb.PUT:
			c.keys[string(ev.Kv.Key)] = candidate{create: ev.Kv.CreateRevision, value: string(ev.Kv.Value)}
		case mvccpb.DELETE:
			delete(c.keys, string(ev.Kv.Key))
		}
		c.rev = max(c.rev, rev)
	}
	c.publish()
}

// forget marks the view unknown: its watch failed, and until the next listing
// Elector.Leader reads etcd.
func (c *candidates) forget() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.synced, c.rev, c.keys = false, 0, nil
	c.publish()
}

// publish sets first from keys; mu is held.
func (c *candidates) publish() {
	if !c.synced {
		c.first.Store(nil)
		return
	}
	id, ok := lowestCreate(c.keys)
	if !ok {
		c.first.Store(nil)
		return
	}
	c.first.Store(&id)
}

// lowestCreate returns the value of the candidate with the lowest CreateRevision.
func lowestCreate(keys map[string]candidate) (string, bool) {
	var best candidate
	for _, k := range keys {
		if best.create == 0 || k.create < best.create {
			best = k
		}
	}
	return best.value, best.create != 0
}

// firstCreated returns the value of the key of kvs with the lowest CreateRevision, ""
// when kvs is empty.
func firstCreated(kvs []*mvccpb.KeyValue) string {
	keys := make(map[string]candidate, len(kvs))
	for _, kv := range kvs {
		keys[string(kv.Key)] = candidate{create: kv.CreateRevision, value: string(kv.Value)}
	}
	id, _ := lowestCreate(keys)
	return id
}

// follow keeps e's view of the election current until ctx ends: one session after
// another of a listing of the prefix and a watch from the revision after it (package
// watch's Loop pauses between sessions, and starts one anew when an etcd member is left
// out). A session ends when its watch fails: the history it would resume from was
// compacted, the member it watches lost its leader or cannot be reached, the channel
// closed. The view is then forgotten, and Leader reads etcd until the next listing.
func (e *Elector) follow(ctx context.Context) {
	watch.Loop(ctx, e.log, "election watch", followBackoff, e.followOnce)
}

// followOnce is one session of follow.
func (e *Elector) followOnce(ctx context.Context) error {
	defer e.view.forget()
	// WithRequireLeader: a member cut off from its leader ends the watch rather than
	// leaving it silent. Its own stream: a watch that starts after the revision it
	// listed must not hold up the progress notifications of watches on a shared one.
	wctx, cancel := context.WithCancel(
		clientv3.WithRequireLeader(watch.OwnStream(ctx, "leader "+e.cfg.Prefix)))
	defer cancel()
	resp, err := e.cli.Get(wctx, e.keyPrefix(), clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("list the election %s: %w", e.cfg.Prefix, err)
	}
	e.lists.Add(1)
	e.view.reset(resp)
	wch := e.cli.Watch(wctx, e.keyPrefix(), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch the election %s: %w", e.cfg.Prefix, err)
		}
		if wr.Canceled {
			return errors.New("election watch canceled")
		}
		e.view.apply(wr.Events)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("election watch closed")
}

// keyPrefix is the prefix of the election's keys (concurrency.NewElection adds "/").
func (e *Elector) keyPrefix() string { return e.cfg.Prefix + "/" }
