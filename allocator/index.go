package allocator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bits-and-blooms/bitset"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/etcd/watch"
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

// watchStall is how long the watch may stay behind a revision this replica committed
// without moving before it is asked for progress, and as long again before its
// session is opened anew (watch.Progress.Lagging): the pending reservations a
// stalled watch would settle make the ranges look full.
const watchStall = 500 * time.Millisecond

// reload reads the ServiceCIDRs and lists every item key at one revision, builds the
// range table and the used bitsets anew (keeping the pending reservations); the
// index then reflects that revision.
func (a *Allocator) reload(ctx context.Context) error {
	resp, err := a.cli.Get(ctx, a.cidrPrefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("load ServiceCIDRs: %w", err)
	}
	rev := resp.Header.Revision
	t, _ := a.buildTable(a.decodeCIDRs(resp.Kvs))
	used := make(map[*rng]*bitset.BitSet, len(t.all))
	for _, r := range t.all {
		used[r] = r.NewUsed()
	}
	err = a.listItems(ctx, rev, func(it Item) {
		n := 0
		a.eachRange(t, it, func(r *rng, off uint64) { used[r].Set(uint(off)); n++ }) // off < size
		if n == 0 {
			a.log.Warn("allocation outside every range", "item", it.String())
		}
	})
	if err != nil {
		return err
	}
	for _, r := range t.all {
		r.Replace(used[r])
	}
	a.tab.Store(t)
	// The watch may have lost events: the holders are listed again when next asked.
	a.hold.drop()
	a.advance(rev)
	return nil
}

// buildTable builds the table of cidrs on the current one (sharing the bitmaps of
// the prefixes it has), and returns the ranges whose bitmaps are new.
func (a *Allocator) buildTable(cidrs []ServiceCIDR) (*table, []*rng) {
	slices.SortStableFunc(cidrs, func(x, y ServiceCIDR) int {
		return compareRefs(cidrRef{name: x.Name, createRev: x.CreateRevision},
			cidrRef{name: y.Name, createRev: y.CreateRevision})
	})
	t, fresh := buildTable(a.tab.Load(), a.portRange, cidrs, a.newIPRange)
	for _, r := range t.ip {
		for i := range r.refs {
			ref := &r.refs[i]
			ref.key = a.cidrKey(ref.name)
			ref.id = ref.key + "@" + strconv.FormatInt(ref.rev, 10)
		}
	}
	return t, fresh
}

// eachRange calls fn with every range of t that holds it, and its offset there.
func (a *Allocator) eachRange(t *table, it Item, fn func(r *rng, off uint64)) {
	if it.Kind == KindClusterIP {
		t.each(it.Addr, fn)
		return
	}
	if off, ok := t.port.offset(it); ok {
		fn(t.port, off)
	}
}

// listItems calls fn with every item key's item at rev, reading keys only, in
// pages.
func (a *Allocator) listItems(ctx context.Context, rev int64, fn func(Item)) error {
	key := a.watchStart
	for {
		resp, err := a.cli.Get(ctx, key, clientv3.WithRange(a.watchEnd), clientv3.WithKeysOnly(),
			clientv3.WithLimit(10000), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend),
			clientv3.WithRev(rev))
		if err != nil {
			return fmt.Errorf("load allocations: %w", err)
		}
		for _, kv := range resp.Kvs {
			if it, ok := a.parseKey(kv.Key); ok {
				fn(it)
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
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
	a.progress.Expect(rev)
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
	var be *watch.BehindError
	switch {
	case !errors.As(err, &be):
		return err
	case be.Running:
		return fmt.Errorf("allocation index: %w: %w", err, ErrNotSynced)
	}
	return fmt.Errorf("allocation index: %w: %w", err, ErrNotRunning)
}

// Starting marks the index's watch as running before Run's goroutine starts it, so
// that a call that comes meanwhile waits for the watch (Sync) instead of failing at once
// with ErrNotRunning: a server calls it before it serves, then runs Run.
func (a *Allocator) Starting() { a.progress.SetRunning(true) }

// watchLoop applies the item keys' changes to the index from the revision it
// reflects on, re-listing after a compaction. Progress notifications (which Sync
// asks for) move the index past writes outside the watched keys. It returns when ctx
// ends.
func (a *Allocator) watchLoop(ctx context.Context) error {
	a.progress.SetRunning(true)
	defer a.progress.SetRunning(false)
	watch.Loop(ctx, a.log, "allocation watch", 2*time.Second, a.watchOnce)
	return nil
}

// watchOnce watches from the index's revision + 1 until the watch fails.
func (a *Allocator) watchOnce(ctx context.Context) error {
	from := a.progress.Rev() + 1
	// Its own watch stream: Sync waits for progress notifications (see package watch).
	wctx, cancel := context.WithCancel(
		clientv3.WithRequireLeader(watch.OwnStream(ctx, "allocator "+a.watchStart)))
	defer cancel()
	wch := a.cli.Watch(wctx, a.watchStart, clientv3.WithRange(a.watchEnd), clientv3.WithRev(from))
	tick := time.NewTicker(watchStall)
	defer tick.Stop()
	lagged := false // the watch lagged at the last tick, and was asked for progress
	for {
		select {
		case <-tick.C:
			a.maybeCheckpoint()
			switch {
			case !a.progress.Lagging(watchStall):
				lagged = false
			case lagged:
				return fmt.Errorf("allocation watch from %d: no progress for %v past a committed revision",
					from, 2*watchStall)
			default:
				lagged = true
				if err := a.cli.RequestProgress(wctx); err != nil {
					a.log.Debug("allocation watch progress request failed", "err", err)
				}
			}
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
				a.cpChanges = a.cpEvery
				return fmt.Errorf("watch from %d: compacted at %d", from, resp.CompactRevision)
			case resp.Err() != nil:
				return resp.Err()
			case resp.IsProgressNotify():
				a.advance(resp.Header.Revision)
				continue
			}
			if err := a.apply(ctx, resp.Events); err != nil {
				return err
			}
		}
	}
}

// apply applies a watch response's events in order: an item key sets or clears its
// bit in every range that holds it; a ServiceCIDR key changes the table.
func (a *Allocator) apply(ctx context.Context, evs []*clientv3.Event) error {
	if len(evs) == 0 {
		return nil
	}
	var hc []holderChange // for the holders, when kept
	keep := a.hold.kept()
	ranges := false // the batch changed the ranges
	for _, ev := range evs {
		if bytes.HasPrefix(ev.Kv.Key, []byte(a.cidrPrefix)) {
			changed, err := a.cidrChanged(ctx, ev)
			if err != nil {
				return err
			}
			ranges = ranges || changed
			continue
		}
		it, ok := a.parseKey(ev.Kv.Key)
		if !ok {
			switch {
			case string(ev.Kv.Key) != a.epochKey:
			case ev.Type == mvccpb.PUT:
				a.epochSeen(ev.Kv.Version, ev.Kv.CreateRevision)
			default:
				a.epochRead(nil)
			}
			continue
		}
		put := ev.Type == mvccpb.PUT
		a.cpChanges++
		t := a.tab.Load()
		in := 0
		a.eachRange(t, it, func(r *rng, off uint64) {
			if !put {
				// The cursor first: a pick that sees the bit clear also starts at r (one
				// in between finds r full and moves on).
				t.freed(r)
			}
			r.SetUsed(off, put)
			in++
		})
		// The holders take what List takes: an item of a range, under its own key (not
		// 030000 for 30000, nor an address with a zone).
		if keep && in > 0 && a.ownKey(it, ev.Kv.Key) {
			hc = append(hc, holderChange{it: it, put: put, uid: itemUID(ev.Kv.Value, put)})
		}
	}
	a.hold.apply(hc)
	if ranges {
		// An item outside every range, left out of the holders' listing, may be in a
		// new one, and one of a range removed is in no range now: the holders are listed
		// again. Dropped here, once the new table is stored and the batch's changes
		// (some taken under the old one) are in: a seeding that began while cidrChanged
		// filled the new range's bitmap listed under the old table.
		a.hold.drop()
	}
	a.advance(evs[len(evs)-1].Kv.ModRevision)
	return nil
}

// cidrChanged installs the table with ev's ServiceCIDR change, and reports whether its
// ranges (the set of prefixes) changed. The bitmaps of new prefixes are filled from
// the item keys at ev's revision; the events after it apply on top.
func (a *Allocator) cidrChanged(ctx context.Context, ev *clientv3.Event) (bool, error) {
	old := a.tab.Load()
	name := strings.TrimPrefix(string(ev.Kv.Key), a.cidrPrefix)
	cidrs := make([]ServiceCIDR, 0, len(old.cidrs)+1)
	for n, c := range old.cidrs {
		if n != name {
			cidrs = append(cidrs, c)
		}
	}
	if ev.Type == mvccpb.PUT {
		c, err := decodeCIDR(ev.Kv.Value, ev.Kv.CreateRevision, ev.Kv.ModRevision)
		if err != nil {
			a.log.Warn("undecodable ServiceCIDR; ignored", "key", string(ev.Kv.Key), "err", err)
			return false, nil
		}
		cidrs = append(cidrs, c)
		a.log.Info("ServiceCIDR seen", "name", name, "cidrs", prefixes(c.CIDRs), "state", c.State.String(),
			"revision", ev.Kv.ModRevision)
	} else {
		a.log.Info("ServiceCIDR removed", "name", name, "revision", ev.Kv.ModRevision)
	}
	t, fresh := a.buildTable(cidrs)
	// A change of state alone (to terminating, say) leaves every item where it was.
	changed := !maps.EqualFunc(old.byPrefix, t.byPrefix, func(*rng, *rng) bool { return true })
	if len(fresh) > 0 {
		used := make(map[*rng]*bitset.BitSet, len(fresh))
		for _, r := range fresh {
			used[r] = r.NewUsed()
		}
		err := a.listItems(ctx, ev.Kv.ModRevision, func(it Item) {
			a.eachRange(t, it, func(r *rng, off uint64) {
				if u := used[r]; u != nil {
					u.Set(uint(off))
				}
			})
		})
		if err != nil {
			return false, fmt.Errorf("fill the ranges of ServiceCIDR %s: %w", name, err)
		}
		for _, r := range fresh {
			r.Replace(used[r])
		}
	}
	a.tab.Store(t)
	return changed, nil
}
