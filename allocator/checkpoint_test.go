package allocator

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/bits-and-blooms/bitset"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// runWith runs a until the test ends or stop is called, after mutate changed it
// (before its watch starts).
func runWith(t *testing.T, a *Allocator, mutate func(*Allocator)) (stop func()) {
	t.Helper()
	if mutate != nil {
		mutate(a)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// writer starts an allocator that writes a checkpoint after every change, and waits
// until etcd holds one of the index as it is after a Sync; stop stops it.
func writer(t *testing.T, e *etcdtest.Server, cfg Config) (stop func()) {
	t.Helper()
	ctx := etcdtest.Context(t)
	w, err := New(ctx, e.NewClient(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop = runWith(t, w, func(a *Allocator) { a.cp.every, a.cp.minGap, a.cp.maxAge = 1, 0, time.Millisecond })
	// A change to checkpoint, then a checkpoint of the index after it.
	if _, err := w.Allocate(ctx, Request{Owner: owner(fmt.Sprint("w", time.Now().UnixNano()))}); err != nil {
		t.Fatal(err)
	}
	// Until Run's watch runs, Sync gives up at once.
	etcdtest.WaitFor(t, 10*time.Second, "the index to reach the Allocate",
		func() bool { return w.Sync(ctx) == nil })
	at := w.idx.progress.Rev()
	etcdtest.WaitFor(t, 10*time.Second, "a checkpoint", func() bool {
		r, err := w.cp.revision(ctx)
		return err == nil && r >= at
	})
	return stop
}

// listedSets lists every item key at rev and returns each range's used set, as reload
// would build it.
func listedSets(t *testing.T, a *Allocator, rev int64) map[string]*bitset.BitSet {
	t.Helper()
	tab := a.idx.tab.Load()
	out := map[string]*bitset.BitSet{}
	for _, r := range tab.all {
		out[r.name] = r.NewUsed()
	}
	err := a.listItems(etcdtest.Context(t), rev, func(it Item) {
		a.idx.eachRange(tab, it, func(r *rng, off uint64) { out[r.name].Set(uint(off)) })
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkEqualsList fails the test unless a's index is, range by range, what a full
// list of etcd at the revision it reflects says.
func checkEqualsList(t *testing.T, a *Allocator) {
	t.Helper()
	rev := a.idx.progress.Rev()
	want := listedSets(t, a, rev)
	tab := a.idx.tab.Load()
	if len(tab.all) != len(want) {
		t.Fatalf("index has %d ranges; the list %d", len(tab.all), len(want))
	}
	for _, r := range tab.all {
		if got := r.CopyUsed(); !got.Equal(want[r.name]) {
			t.Errorf("range %s at revision %d: index has %d used, the list %d (differ in %d offsets)",
				r.name, rev, got.Count(), want[r.name].Count(),
				got.SymmetricDifferenceCardinality(want[r.name]))
		}
	}
}

// churn allocates n owners of prefix (a ClusterIP and a node port each) and releases
// every third, and one item of every fifth.
func churn(t *testing.T, a *Allocator, prefix string, n int) {
	t.Helper()
	ctx := etcdtest.Context(t)
	for i := range n {
		o := owner(fmt.Sprint(prefix, i))
		res, err := a.Allocate(ctx, Request{Owner: o, Policy: PreferDualStack, NodePortCount: 1})
		if err != nil {
			t.Fatalf("Allocate(%v) = %v", o, err)
		}
		switch {
		case i%3 == 0:
			if _, _, err := a.Release(ctx, o, nil, false); err != nil {
				t.Fatal(err)
			}
		case i%5 == 0:
			if _, _, err := a.Release(ctx, o, []Item{IP(res.ClusterIPs[0])}, false); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestCheckpointEqualsList: an index loaded from a checkpoint and the events after it
// equals, range by range, the full list at the revision it reports; when the
// checkpoint's revision is compacted, or the checkpoint is damaged, or a ServiceCIDR
// came after it, New lists instead (or replays the change) and the index still equals
// the list.
func TestCheckpointEqualsList(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	cfg := testConfig("10.0.0.0/22", "fd00::/110")

	// Changes through a replica that writes no checkpoint.
	other, err := New(ctx, e.Client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if other.idx.loadedFrom != "list" {
		t.Fatalf("first start loaded from %q; want list (no checkpoint yet)", other.idx.loadedFrom)
	}
	runWith(t, other, func(a *Allocator) { a.cp.ch = nil })
	churn(t, other, "a", 60)
	writer(t, e, cfg)() // a checkpoint of that, and the writer stopped
	// Changes after the checkpoint, and a ServiceCIDR added after it.
	if _, err := other.CreateServiceCIDR(ctx, "extra", []string{"10.1.0.0/24"}); err != nil {
		t.Fatal(err)
	}
	churn(t, other, "b", 40)

	got, err := New(ctx, e.NewClient(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got.idx.loadedFrom != "checkpoint" {
		t.Fatalf("New loaded from %q; want checkpoint", got.idx.loadedFrom)
	}
	head, _ := got.cp.revision(ctx)
	if head >= got.idx.progress.Rev() {
		t.Fatalf("checkpoint at %d, index at %d: nothing was replayed", head, got.idx.progress.Rev())
	}
	checkEqualsList(t, got)
	if len(got.idx.tab.Load().ip) != 3 {
		t.Errorf("index has ClusterIP ranges %v; want the two of the flags and extra's", got.idx.rangeNames())
	}

	// Damaged: a part rewritten with other bits.
	hresp, err := e.Client.Get(ctx, other.cpDataPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil || len(hresp.Kvs) == 0 {
		t.Fatalf("checkpoint parts: %v, %v", hresp, err)
	}
	if _, err := e.Client.Put(ctx, string(hresp.Kvs[0].Key), "not flate"); err != nil {
		t.Fatal(err)
	}
	damaged, err := New(ctx, e.NewClient(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if damaged.idx.loadedFrom != "list" {
		t.Errorf("with a damaged checkpoint New loaded from %q; want list", damaged.idx.loadedFrom)
	}
	checkEqualsList(t, damaged)

	// Another format (a rolling upgrade's newer or older allocd wrote it): listed.
	writer(t, e, cfg)()
	hv, err := e.Client.Get(ctx, other.cpHeadKey)
	if err != nil || len(hv.Kvs) != 1 {
		t.Fatalf("checkpoint head: %v, %v", hv, err)
	}
	var h map[string]any
	if err := json.Unmarshal(hv.Kvs[0].Value, &h); err != nil {
		t.Fatal(err)
	}
	if h["format"] != float64(checkpointFormat) {
		t.Fatalf("checkpoint head's format %v; want %d", h["format"], checkpointFormat)
	}
	h["format"] = checkpointFormat + 1
	nb, _ := json.Marshal(h)
	if _, err := e.Client.Put(ctx, other.cpHeadKey, string(nb)); err != nil {
		t.Fatal(err)
	}
	otherFormat, err := New(ctx, e.NewClient(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if otherFormat.idx.loadedFrom != "list" {
		t.Errorf("with a checkpoint of format %d New loaded from %q; want list", checkpointFormat+1,
			otherFormat.idx.loadedFrom)
	}
	checkEqualsList(t, otherFormat)

	// Compacted: a fresh checkpoint, more changes, then etcd compacted past it.
	writer(t, e, cfg)()
	churn(t, other, "c", 10)
	resp, err := e.Client.Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	cp, _ := other.cp.revision(ctx)
	if cp >= resp.Header.Revision {
		t.Fatalf("checkpoint at %d, etcd at %d: want changes after it", cp, resp.Header.Revision)
	}
	if _, err := e.Client.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	compacted, err := New(ctx, e.NewClient(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if compacted.idx.loadedFrom != "list" {
		t.Errorf("with the checkpoint's revision compacted New loaded from %q; want list",
			compacted.idx.loadedFrom)
	}
	checkEqualsList(t, compacted)
}

// TestCheckpointAfterBurst: a burst of changes right after a checkpoint is
// checkpointed once the gap between checkpoints has passed. The writer left a snapshot
// taken inside the gap for the younger head, and its changes were forgotten: after a
// burst of releases the head stayed before the burst until checkpointMaxAge (30 s),
// and a restart in between replayed the whole burst (2.5 s after 73k releases in
// make scale's join at the empty store).
func TestCheckpointAfterBurst(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	a := idle(t, e.Client)
	runWith(t, a, func(a *Allocator) { a.cp.every, a.cp.minGap, a.cp.maxAge = 5, 2*time.Second, time.Hour })
	burst := func(name string, n int) int64 {
		t.Helper()
		for i := range n {
			if _, err := a.Allocate(ctx, Request{Owner: owner(fmt.Sprint(name, i))}); err != nil {
				t.Fatal(err)
			}
		}
		// Until Run's watch runs, Sync gives up at once.
		etcdtest.WaitFor(t, 10*time.Second, "the index to reach the burst",
			func() bool { return a.Sync(ctx) == nil })
		return a.idx.progress.Rev()
	}
	checkpointed := func(what string, at int64) {
		t.Helper()
		etcdtest.WaitFor(t, 10*time.Second, what, func() bool {
			r, err := a.cp.revision(ctx)
			return err == nil && r >= at
		})
	}
	checkpointed("a checkpoint of the first burst", burst("first", 6))
	// At once, inside the gap: the first snapshot after it is left for the young head.
	checkpointed("a checkpoint of the second burst", burst("second", 12))
}

// TestSyncWaitsAfterStarting: after Starting, a Sync that comes before Run's watch has
// started waits for it, instead of failing at once with ErrNotRunning (a daemon serves
// before Run's goroutine runs: a call at start failed with Unavailable).
func TestSyncWaitsAfterStarting(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	a := idle(t, e.Client)
	a.Starting()
	if _, err := a.Allocate(ctx, Request{Owner: owner("early")}); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	time.AfterFunc(200*time.Millisecond, func() { runWith(t, a, nil); close(started) })
	if err := a.Sync(ctx); err != nil {
		t.Errorf("Sync before Run's watch started = %v; want it to wait for the watch", err)
	}
	<-started
}

// TestCheckpointerMaybe: the watch's snapshot is taken once enough items changed, or
// some changed longer than maxAge ago, not within minGap of the last, and handed to the
// writer only when it is free (else the changes wait for the next tick); changes a
// write left for a younger head count again.
func TestCheckpointerMaybe(t *testing.T) {
	c := newCheckpointer(nil, nil, nil)
	c.every, c.maxAge, c.minGap = 3, time.Hour, 0
	taken := 0
	take := func() *indexSnapshot { taken++; return &indexSnapshot{rev: int64(10 * taken)} }
	c.count()
	c.count()
	if c.maybe(10, take); taken != 0 {
		t.Fatalf("2 changes of 3: a snapshot was taken")
	}
	c.count()
	c.maybe(10, take)
	snap := <-c.ch
	if taken != 1 || snap.changes != 3 || snap.prev != 0 || c.changes != 0 || c.rev != snap.rev {
		t.Fatalf("3 changes of 3: taken %d, handed %+v, %d changes left; want one with 3 changes", taken,
			snap, c.changes)
	}
	c.ch <- &indexSnapshot{} // the writer busy
	c.carry.Add(3)           // a write left for a younger head
	if c.maybe(20, take); taken != 2 || c.changes != 3 {
		t.Fatalf("writer busy: taken %d, %d changes; want the snapshot taken, its 3 changes kept", taken,
			c.changes)
	}
	<-c.ch
	c.minGap = time.Hour
	if c.maybe(20, take); taken != 2 {
		t.Errorf("within minGap of the last: a snapshot was taken")
	}
	c.minGap, c.maxAge = 0, 0
	c.changes = 1
	if c.maybe(20, take); taken != 3 {
		t.Errorf("one change older than maxAge: no snapshot taken")
	}
}
