package allocator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bits-and-blooms/bitset"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/badrequest"
	"github.com/allocd/allocd/internal/etcd/watch"
)

// rangeIndex is the index of the ranges, in memory: the range table (each range a
// bitmap of offsets, and the ServiceCIDRs that list it), kept current by a watch of the
// item keys and the ServiceCIDRs, and the revision it reflects (progress), which Sync
// waits for.
// Its watch feeds the parts that follow etcd's events besides it: the epoch (its key's
// changes), the holders (who holds each item), the checkpointer (how many items changed
// since the last checkpoint, and when to write the next). New loads it (load: from a
// checkpoint and the events since, or by listing every allocation); run keeps it
// current. Only run's goroutine (or New, before Run) changes the bitmaps' used bits;
// callers reserve and release pending bits under each bitmap's own lock.
type rangeIndex struct {
	*store
	log   *slog.Logger
	m     *metrics
	fails *failures

	// tab is the ranges: the ServiceCIDRs' ClusterIP ranges and the node port range
	// (table.go), replaced whole when the watch sees a ServiceCIDR change.
	tab       atomic.Pointer[table]
	portRange *rng

	// progress is the revision the index reflects; settle holds the pending bits that
	// clear once it reaches their revision (settleMu guards settle, and orders it
	// with progress); Sync waits at most syncTimeout.
	progress    watch.Progress
	settleMu    sync.Mutex
	settle      []settleEntry
	syncTimeout time.Duration
	// loadedFrom says how load built the index: "checkpoint" or "list".
	loadedFrom string
	// catchUpSpan is how many revisions each watch of a catch-up replays (catchup.go;
	// 0: catchUpSpan, smaller in tests).
	catchUpSpan int64

	// What the watch feeds.
	epochs *epochs
	hold   *holders
	cp     *checkpointer
}

// newIndex returns the index of the node port range ports, its ClusterIP ranges to be
// loaded (load).
func newIndex(st *store, log *slog.Logger, m *metrics, fails *failures, ports PortRange, e *epochs,
	hold *holders, cp *checkpointer) *rangeIndex {
	ix := &rangeIndex{store: st, log: log, m: m, fails: fails, portRange: newPortRange(ports),
		syncTimeout: defaultSyncTimeout, epochs: e, hold: hold, cp: cp}
	ix.tab.Store(&table{byPrefix: map[netip.Prefix]*rng{}, port: ix.portRange, all: []*rng{ix.portRange}})
	m.counters(ix.portRange)
	return ix
}

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
func (ix *rangeIndex) reload(ctx context.Context) error {
	resp, err := ix.cli.Get(ctx, ix.cidrPrefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("load ServiceCIDRs: %w", err)
	}
	rev := resp.Header.Revision
	t, _ := ix.buildTable(ix.decodeCIDRs(resp.Kvs))
	used := make(map[*rng]*bitset.BitSet, len(t.all))
	for _, r := range t.all {
		used[r] = r.NewUsed()
	}
	err = ix.listItems(ctx, rev, func(it Item) {
		n := 0
		ix.eachRange(t, it, func(r *rng, off uint64) { used[r].Set(uint(off)); n++ }) // off < size
		if n == 0 {
			ix.log.Warn("allocation outside every range", "item", it.String())
		}
	})
	if err != nil {
		return err
	}
	for _, r := range t.all {
		r.Replace(used[r])
	}
	ix.tab.Store(t)
	// The watch may have lost events: the holders are listed again when next asked.
	ix.hold.drop()
	ix.advance(rev)
	return nil
}

// buildTable builds the table of cidrs on the current one (sharing the bitmaps of
// the prefixes it has), and returns the ranges whose bitmaps are new.
func (ix *rangeIndex) buildTable(cidrs []ServiceCIDR) (*table, []*rng) {
	slices.SortStableFunc(cidrs, func(x, y ServiceCIDR) int {
		return compareRefs(cidrRef{name: x.Name, createRev: x.CreateRevision},
			cidrRef{name: y.Name, createRev: y.CreateRevision})
	})
	t, fresh := buildTable(ix.tab.Load(), ix.portRange, cidrs, ix.newIPRange)
	for _, r := range t.ip {
		for i := range r.refs {
			ref := &r.refs[i]
			ref.key = ix.cidrKey(ref.name)
			ref.id = ref.key + "@" + strconv.FormatInt(ref.rev, 10)
		}
	}
	return t, fresh
}

// eachRange calls fn with every range of t that holds it, and its offset there.
func (ix *rangeIndex) eachRange(t *table, it Item, fn func(r *rng, off uint64)) {
	if it.Kind == KindClusterIP {
		t.each(it.Addr, fn)
		return
	}
	if off, ok := t.port.offset(it); ok {
		fn(t.port, off)
	}
}

// advance records that the index reflects rev and clears the pending bits settled
// by then.
func (ix *rangeIndex) advance(rev int64) {
	ix.settleMu.Lock()
	ix.progress.Advance(rev)
	now := ix.progress.Rev()
	var done []settleEntry
	keep := ix.settle[:0]
	for _, e := range ix.settle {
		if e.rev <= now {
			done = append(done, e)
		} else {
			keep = append(keep, e)
		}
	}
	clear(ix.settle[len(keep):])
	ix.settle = keep
	ix.settleMu.Unlock()
	for _, e := range done {
		e.r.Unpend(e.off)
	}
}

// settleAt clears the pending bit of off once the index reflects rev, when the
// watch has recorded the key written at rev.
func (ix *rangeIndex) settleAt(rev int64, r *rng, off uint64) {
	ix.settleMu.Lock()
	if ix.progress.Rev() >= rev {
		ix.settleMu.Unlock()
		r.Unpend(off)
		return
	}
	ix.settle = append(ix.settle, settleEntry{rev: rev, r: r, off: off})
	ix.progress.Expect(rev)
	ix.settleMu.Unlock()
}

// sync waits until the index reflects every write etcd committed before the call: it
// reads etcd's revision (a linearizable read), then waits for Run's watch to reach
// it, for at most 5 seconds. What Free and Ranges report next is then at least as new
// as any allocation or release acknowledged before Sync was called. It returns
// ErrNotRunning when the watch is behind and Run is not running, ErrNotSynced when
// the watch stays behind for too long, and etcd's and ctx's errors.
func (ix *rangeIndex) sync(ctx context.Context) error {
	err := ix.progress.Sync(ctx, ix.cli, ix.configKey, ix.syncTimeout)
	var be *watch.BehindError
	switch {
	case !errors.As(err, &be):
		return err
	case be.Running:
		return fmt.Errorf("allocation index: %w: %w", err, ErrNotSynced)
	}
	return fmt.Errorf("allocation index: %w: %w", err, ErrNotRunning)
}

// run applies the item keys' changes to the index from the revision it reflects on,
// re-listing after a compaction. Progress notifications (which Sync
// asks for) move the index past writes outside the watched keys. It returns when ctx
// ends.
func (ix *rangeIndex) run(ctx context.Context) error {
	ix.progress.SetRunning(true)
	defer ix.progress.SetRunning(false)
	watch.Loop(ctx, ix.log, "allocation watch", 2*time.Second, ix.session)
	return nil
}

// session is one session of the watch for watch.Loop: watchOnce, whose end while its
// ctx lives (not the allocator stopping, nor a restart of the session) is counted as a
// failure of step watch; watch.Loop logs it.
func (ix *rangeIndex) session(ctx context.Context) error {
	err := ix.watchOnce(ctx)
	if ctx.Err() == nil {
		ix.fails.count(stepWatch)
	}
	return err
}

// watchOnce watches from the index's revision + 1 until the watch fails.
func (ix *rangeIndex) watchOnce(ctx context.Context) error {
	from := ix.progress.Rev() + 1
	// Its own watch stream: Sync waits for progress notifications (see package watch).
	wctx, cancel := context.WithCancel(
		clientv3.WithRequireLeader(watch.OwnStream(ctx, "allocator "+ix.watchStart)))
	defer cancel()
	wch := ix.cli.Watch(wctx, ix.watchStart, clientv3.WithRange(ix.watchEnd), clientv3.WithRev(from))
	tick := time.NewTicker(watchStall)
	defer tick.Stop()
	lagged := false // the watch lagged at the last tick, and was asked for progress
	for {
		select {
		case <-tick.C:
			ix.cp.maybe(ix.progress.Rev(), ix.snapshot)
			switch {
			case !ix.progress.Lagging(watchStall):
				lagged = false
			case lagged:
				return fmt.Errorf("allocation watch from %d: no progress for %v past a committed revision",
					from, 2*watchStall)
			default:
				lagged = true
				ix.requestProgress(wctx)
			}
		case <-ix.progress.Asked():
			// wctx: the request goes on the watch's stream (same metadata).
			ix.requestProgress(wctx)
		case resp, ok := <-wch:
			switch {
			case !ok:
				return errors.New("watch channel closed")
			case resp.CompactRevision != 0:
				ix.log.Warn("allocation watch compacted; re-listing", "from", from)
				if err := ix.reload(ctx); err != nil {
					return fmt.Errorf("re-list allocations: %w", err)
				}
				ix.cp.due()
				return fmt.Errorf("watch from %d: compacted at %d", from, resp.CompactRevision)
			case resp.Err() != nil:
				return resp.Err()
			case resp.IsProgressNotify():
				ix.advance(resp.Header.Revision)
				continue
			}
			if err := ix.apply(ctx, resp.Events); err != nil {
				return err
			}
		}
	}
}

// requestProgress asks etcd for a progress notification on the watch of wctx; a
// failure is recorded (a watch that gets none stays behind writes elsewhere, and Sync
// waits for it in vain). A request that fails because wctx ended (the watch is being
// opened anew, or the allocator stops) is neither: it says nothing of etcd.
func (ix *rangeIndex) requestProgress(wctx context.Context) {
	ix.requestProgressOn(wctx, ix.cli)
}

// requestProgressOn is requestProgress on a watch of w.
func (ix *rangeIndex) requestProgressOn(wctx context.Context, w clientv3.Watcher) {
	switch err := w.RequestProgress(wctx); {
	case err == nil:
		ix.fails.ok(stepWatchProgress)
	case wctx.Err() == nil:
		ix.fails.fail(stepWatchProgress, "allocation watch progress request failed", err)
	}
}

// apply applies a watch response's events in order: an item key sets or clears its
// bit in every range that holds it; a ServiceCIDR key changes the table.
func (ix *rangeIndex) apply(ctx context.Context, evs []*clientv3.Event) error {
	if len(evs) == 0 {
		return nil
	}
	var hc []holderChange // for the holders, when kept
	keep := ix.hold.kept()
	ranges := false // the batch changed the ranges
	for _, ev := range evs {
		if bytes.HasPrefix(ev.Kv.Key, []byte(ix.cidrPrefix)) {
			changed, err := ix.cidrChanged(ctx, ev)
			if err != nil {
				return err
			}
			ranges = ranges || changed
			continue
		}
		it, ok := ix.parseKey(ev.Kv.Key)
		if !ok {
			switch {
			case string(ev.Kv.Key) != ix.epochKey:
			case ev.Type == mvccpb.PUT:
				ix.epochs.seen(ev.Kv.Version, ev.Kv.CreateRevision)
			default:
				ix.epochs.seenKV(nil)
			}
			continue
		}
		put := ev.Type == mvccpb.PUT
		ix.cp.count()
		t := ix.tab.Load()
		in := 0
		ix.eachRange(t, it, func(r *rng, off uint64) {
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
		if keep && in > 0 && ix.ownKey(it, ev.Kv.Key) {
			hc = append(hc, holderChange{it: it, put: put, uid: itemUID(ev.Kv.Value, put)})
		}
	}
	ix.hold.apply(hc)
	if ranges {
		// An item outside every range, left out of the holders' listing, may be in a
		// new one, and one of a range removed is in no range now: the holders are listed
		// again. Dropped here, once the new table is stored and the batch's changes
		// (some taken under the old one) are in: a seeding that began while cidrChanged
		// filled the new range's bitmap listed under the old table.
		ix.hold.drop()
	}
	ix.advance(evs[len(evs)-1].Kv.ModRevision)
	return nil
}

// cidrChanged installs the table with ev's ServiceCIDR change, and reports whether its
// ranges (the set of prefixes) changed. The bitmaps of new prefixes are filled from
// the item keys at ev's revision; the events after it apply on top.
func (ix *rangeIndex) cidrChanged(ctx context.Context, ev *clientv3.Event) (bool, error) {
	old := ix.tab.Load()
	name := strings.TrimPrefix(string(ev.Kv.Key), ix.cidrPrefix)
	cidrs := make([]ServiceCIDR, 0, len(old.cidrs)+1)
	for n, c := range old.cidrs {
		if n != name {
			cidrs = append(cidrs, c)
		}
	}
	if ev.Type == mvccpb.PUT {
		c, err := decodeCIDR(ev.Kv.Value, ev.Kv.CreateRevision, ev.Kv.ModRevision)
		if err != nil {
			ix.log.Warn("undecodable ServiceCIDR; ignored", "key", string(ev.Kv.Key), "err", err)
			return false, nil
		}
		cidrs = append(cidrs, c)
		ix.log.Info("ServiceCIDR seen", "name", name, "cidrs", prefixes(c.CIDRs), "state", c.State.String(),
			"revision", ev.Kv.ModRevision)
	} else {
		ix.log.Info("ServiceCIDR removed", "name", name, "revision", ev.Kv.ModRevision)
	}
	t, fresh := ix.buildTable(cidrs)
	// A change of state alone (to terminating, say) leaves every item where it was.
	changed := !maps.EqualFunc(old.byPrefix, t.byPrefix, func(*rng, *rng) bool { return true })
	if len(fresh) > 0 {
		used := make(map[*rng]*bitset.BitSet, len(fresh))
		for _, r := range fresh {
			used[r] = r.NewUsed()
		}
		err := ix.listItems(ctx, ev.Kv.ModRevision, func(it Item) {
			ix.eachRange(t, it, func(r *rng, off uint64) {
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
	ix.tab.Store(t)
	return changed, nil
}

// snapshot copies the used sets of every range. Only the goroutine that applies the
// watch's events (or New, before Run) calls it: the copy is then the index at
// ix.progress.Rev().
func (ix *rangeIndex) snapshot() *indexSnapshot {
	t := ix.tab.Load()
	snap := &indexSnapshot{rev: ix.progress.Rev()}
	for _, r := range t.all {
		snap.ranges = append(snap.ranges, snapRange{name: r.name, size: r.Size(), used: r.CopyUsed()})
	}
	return snap
}

// load builds the index: from the checkpoint when one can be used, else by listing
// every allocation; it says which in the log.
func (ix *rangeIndex) load(ctx context.Context) error {
	start := time.Now()
	err := ix.loadCheckpoint(ctx)
	if err == nil {
		ix.loadedFrom = "checkpoint"
		ix.log.Info("index loaded", "from", "checkpoint", "took", time.Since(start).Round(time.Millisecond))
		return nil
	}
	if !errors.Is(err, errNoCheckpoint) {
		return err
	}
	ix.log.Info("listing every allocation", "reason", err.Error())
	if err := ix.reload(ctx); err != nil {
		return err
	}
	// As many changes as items listed: a large store writes a checkpoint at once, a
	// small one after its first changes.
	for _, r := range ix.tab.Load().all {
		used, _ := r.Counts()
		ix.cp.changes += int(used)
	}
	ix.loadedFrom = "list"
	ix.log.Info("index loaded", "from", "list", "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// loadCheckpoint builds the index from the checkpoint etcd holds and the events
// since, up to the revision of its first read. It fails with errNoCheckpoint (wrapped)
// when there is none, it does not match the ranges, or its revision is compacted.
func (ix *rangeIndex) loadCheckpoint(ctx context.Context) error {
	head, used, now, err := ix.cp.read(ctx, ix.progress.Rev())
	if err != nil {
		return err
	}
	cresp, err := ix.cli.Get(ctx, ix.cidrPrefix, clientv3.WithPrefix(), clientv3.WithRev(head.Rev))
	if err != nil {
		if errors.Is(err, rpctypes.ErrCompacted) {
			return fmt.Errorf("%w: revision %d compacted", errNoCheckpoint, head.Rev)
		}
		return fmt.Errorf("load ServiceCIDRs at %d: %w", head.Rev, err)
	}
	t, _ := ix.buildTable(ix.decodeCIDRs(cresp.Kvs))
	for _, r := range t.all {
		u, ok := used[r.name]
		if !ok || u.Len() != uint(r.Size()) {
			return fmt.Errorf("%w: range %s not in the checkpoint at %d", errNoCheckpoint, r.name, head.Rev)
		}
		r.Replace(u)
	}
	ix.tab.Store(t)
	ix.advance(head.Rev)
	if err := ix.catchUp(ctx, now); err != nil {
		return err
	}
	ix.log.Info("index loaded from a checkpoint", "checkpoint_revision", head.Rev, "revision",
		ix.progress.Rev())
	return nil
}

// newIPRange returns a new range of p with its own bitmap and counters.
func (ix *rangeIndex) newIPRange(p netip.Prefix) *rng {
	r := newIPRangeFor(p)
	ix.m.counters(r)
	return r
}

// locate returns the range an allocation of it draws from and its offset there: for
// an address, the first ready range that holds it, else the first terminating one.
// Errors: ErrNoRange when no range has its IP family, a *NotInRangeError when none
// holds it (or it is a network or broadcast address).
func (ix *rangeIndex) locate(it Item) (*rng, uint64, error) {
	switch it.Kind {
	case KindClusterIP:
		if !it.Addr.IsValid() {
			return nil, 0, badrequest.New("cluster_ip", "not an IP address")
		}
		t := ix.tab.Load()
		if r, off := t.home(it.Addr); r != nil {
			return r, off, nil
		}
		var family []string
		for _, r := range t.ip {
			if r.span.is4 == it.Addr.Is4() {
				family = append(family, r.name)
			}
		}
		if len(family) == 0 {
			return nil, 0, fmt.Errorf("%s: %w", it, ErrNoRange)
		}
		return nil, 0, &NotInRangeError{Item: it, Range: strings.Join(family, ", ")}
	case KindNodePort:
		off, ok := ix.portRange.offset(it)
		if !ok {
			return nil, 0, &NotInRangeError{Item: it, Range: ix.portRange.name}
		}
		return ix.portRange, off, nil
	}
	return nil, 0, badrequest.New("kind", "unknown item kind")
}

// rangeOf returns the name of it's range: ErrNoRange when no range has its IP
// family, a *NotInRangeError when it lies outside (or is the network or broadcast
// address of) every range.
func (ix *rangeIndex) rangeOf(it Item) (string, error) {
	r, _, err := ix.locate(it)
	if err != nil {
		return "", err
	}
	return r.name, nil
}

// rangeNames returns the ClusterIP ranges (in allocation order), then the NodePort
// range.
func (ix *rangeIndex) rangeNames() []string {
	t := ix.tab.Load()
	names := make([]string, len(t.all))
	for i, r := range t.all {
		names[i] = r.name
	}
	return names
}

// freeItems returns how many items of the named range the index sees free; 0 for an
// unknown name.
func (ix *rangeIndex) freeItems(rangeName string) uint64 {
	for _, r := range ix.tab.Load().all {
		if r.name == rangeName {
			used, _ := r.Counts()
			return r.Size() - used
		}
	}
	return 0
}
