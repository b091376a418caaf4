package allocator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// claimSet calls ListExcept with one claim per item of uids, and records what it
// marked held.
type claimSet struct {
	uid  map[Item]string
	held map[Item]bool
}

func newClaims(uids map[Item]string) *claimSet { return &claimSet{uid: uids, held: map[Item]bool{}} }

func (c *claimSet) listExcept(ctx context.Context, a *Allocator) (int64, []Allocation, error) {
	var claims []Claim
	var items []Item
	for it, uid := range c.uid {
		claims = append(claims, Claim{Key: it.Key(), Holder: HolderHash(uid)})
		items = append(items, it)
	}
	held := make([]bool, len(claims))
	rev, all, err := a.ListExcept(ctx, claims, held)
	for i, h := range held {
		if h {
			c.held[items[i]] = true
		}
	}
	return rev, all, err
}

// checkListExcept calls ListExcept with claimants uids and fails the test unless
// what it read and what it skipped make up a List read right after it (nothing
// writes meanwhile): every allocation read is listed as read; every skipped item is
// listed, held by its claimant; every listed allocation is one or the other. It
// returns how many were read.
func checkListExcept(t *testing.T, a *Allocator, uids map[Item]string) int {
	t.Helper()
	ctx := etcdtest.Context(t)
	c := newClaims(uids)
	_, read, err := c.listExcept(ctx, a)
	if err != nil {
		t.Fatalf("ListExcept = %v", err)
	}
	_, all, err := a.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[Item]Allocation{}
	for _, al := range all {
		listed[al.Item] = al
	}
	for _, al := range read {
		if l, ok := listed[al.Item]; !ok || l != al {
			t.Errorf("ListExcept read %+v; List has %+v", al, l)
		}
		if c.held[al.Item] {
			t.Errorf("ListExcept read %v and called it held", al.Item)
		}
		delete(listed, al.Item)
	}
	for it := range c.held {
		l, ok := listed[it]
		switch {
		case !ok:
			t.Errorf("ListExcept skipped %v as held by %s; List has no allocation of it", it, uids[it])
		case l.Owner.UID != uids[it]:
			t.Errorf("ListExcept skipped %v as held by %s; List says %s holds it", it, uids[it], l.Owner.UID)
		}
		delete(listed, it)
	}
	byName := func(x, y Item) int { return strings.Compare(x.String(), y.String()) }
	for _, it := range slices.SortedFunc(maps.Keys(listed), byName) {
		t.Errorf("ListExcept neither read nor skipped %v (held by %s)", it, listed[it].Owner.UID)
	}
	return len(read)
}

func ips(n int) []Item {
	out := make([]Item, n)
	a := netip.MustParseAddr("10.0.0.10")
	for i := range out {
		out[i], a = IP(a), a.Next()
	}
	return out
}

// held starts an allocator on a new etcd and assigns it n addresses from 10.0.0.10,
// the i-th to owner "s<i>": the addresses, and each one's owner UID.
func held(t *testing.T, n int) (*etcdtest.Server, *Allocator, []Item, map[Item]string) {
	t.Helper()
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/24"))
	items := ips(n)
	uids := map[Item]string{}
	for i, it := range items {
		uids[it] = fmt.Sprint("s", i)
		if _, err := a.Assign(etcdtest.Context(t), owner(uids[it]), it); err != nil {
			t.Fatal(err)
		}
	}
	return e, a, items, uids
}

// TestListExcept: after the first call (a full list that seeds the holders), what
// changes later (a release, a move to another owner, a new allocation, an allocation
// in a ServiceCIDR added later) is read, and what is held by its claimant is skipped.
func TestListExcept(t *testing.T) {
	_, a, items, uids := held(t, 40)
	ctx := etcdtest.Context(t)
	if n := checkListExcept(t, a, uids); n != len(items)+1 {
		t.Errorf("first ListExcept read %d; want all %d (and the kubernetes address)", n, len(items)+1)
	}
	if n := checkListExcept(t, a, uids); n != 1 {
		t.Errorf("second ListExcept read %d; want only the unclaimed kubernetes address", n)
	}

	// Changes after the seeding, through the watch.
	al, err := a.Get(ctx, items[0])
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := a.ReleaseIf(ctx, al); !ok || err != nil {
		t.Fatalf("ReleaseIf = %v, %v", ok, err)
	}
	if al, err = a.Get(ctx, items[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Reassign(ctx, al, owner("other")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Assign(ctx, owner("new"), IP(netip.MustParseAddr("10.0.0.200"))); err != nil {
		t.Fatal(err)
	}
	// items[1] (moved) is read: its claimant no longer holds it; 10.0.0.200 and the
	// kubernetes address have no claimant; items[0] (released) is neither read nor held.
	if n := checkListExcept(t, a, uids); n != 3 {
		t.Errorf("ListExcept after changes read %d; want 3", n)
	}

	// A new range: the holders are listed again, then kept with its items.
	if _, err := a.CreateServiceCIDR(ctx, "extra", []string{"10.1.0.0/24"}); err != nil {
		t.Fatal(err)
	}
	extra := IP(netip.MustParseAddr("10.1.0.9"))
	if _, err := a.Assign(ctx, owner("x"), extra); err != nil {
		t.Fatal(err)
	}
	uids[extra] = "x"
	if n := checkListExcept(t, a, uids); n != len(items)+2 {
		t.Errorf("ListExcept after a new range read %d; want all %d", n, len(items)+2)
	}
	if n := checkListExcept(t, a, uids); n != 3 {
		t.Errorf("ListExcept after that read %d; want 3", n)
	}
}

// TestListExceptSeedingRace: a release while the first ListExcept lists (after the
// listing read the item) is not undone by the seeding: the item is read afterwards.
func TestListExceptSeedingRace(t *testing.T) {
	_, a, items, uids := held(t, 3)
	ctx := etcdtest.Context(t)
	a.afterPageRead = func() {
		a.afterPageRead = nil
		al, err := a.Get(context.Background(), items[0])
		if err != nil {
			t.Error(err)
			return
		}
		if ok, err := a.ReleaseIf(context.Background(), al); !ok || err != nil {
			t.Errorf("ReleaseIf = %v, %v", ok, err)
		}
		// The watch applies the release before the listing seeds the holders.
		if err := a.Sync(context.Background()); err != nil {
			t.Error(err)
		}
	}
	if _, _, err := newClaims(uids).listExcept(ctx, a); err != nil {
		t.Fatal(err)
	}
	if a.afterPageRead != nil {
		t.Fatal("the first ListExcept did not list")
	}
	if n := checkListExcept(t, a, uids); n != 1 {
		t.Errorf("ListExcept after the seeding read %d; want the kubernetes address only", n)
	}
}

// TestListExceptAfterCompaction: when the allocation watch is compacted (events
// lost), the holders are dropped and the next ListExcept lists and seeds again.
func TestListExceptAfterCompaction(t *testing.T) {
	_, a, items, uids := held(t, 3)
	ctx := etcdtest.Context(t)
	checkListExcept(t, a, uids)
	if !a.hold.kept() {
		t.Fatal("holders not kept after the first ListExcept")
	}
	a.hold.mu.Lock()
	a.hold.set(items[2].Key(), HolderHash("stale")) // what a lost event would leave
	a.hold.mu.Unlock()
	if err := a.idx.reload(ctx); err != nil { // what the watch does after a compaction
		t.Fatal(err)
	}
	if a.hold.kept() {
		t.Fatal("holders kept after a re-list")
	}
	uids[items[2]] = "stale"
	if n := checkListExcept(t, a, uids); n != len(items)+1 {
		t.Errorf("ListExcept after a re-list read %d; want all %d", n, len(items)+1)
	}
}

// TestListExceptItemOutsideRanges: an item key outside every range when the holders
// are seeded (List leaves it out) and inside one later (a ServiceCIDR created over it)
// is read: the range change drops the holders.
func TestListExceptItemOutsideRanges(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	a := start(t, e.Client, testConfig("10.0.0.0/24"))
	stray := IP(netip.MustParseAddr("10.1.0.9"))
	v := appendItemValue(nil, owner("x"), time.Now())
	if _, err := e.Client.Put(ctx, a.key(stray), string(v)); err != nil {
		t.Fatal(err)
	}
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	checkListExcept(t, a, map[Item]string{}) // seeds, without the stray key
	if _, err := a.CreateServiceCIDR(ctx, "extra", []string{"10.1.0.0/24"}); err != nil {
		t.Fatal(err)
	}
	checkListExcept(t, a, map[Item]string{})
	checkListExcept(t, a, map[Item]string{stray: "x"})
}

// TestListExceptSeedingOfAnEarlierStart: two ListExcept calls. A seeds (start, List);
// the holders are dropped while A lists (a ServiceCIDR event, a compaction); a release
// commits while they are not kept; B starts a new seeding, and A's listing ends while
// B lists: A's fill must not land in B's holders (with A's older listing, the released
// item would stay held by its former owner).
func TestListExceptSeedingOfAnEarlierStart(t *testing.T) {
	_, a, items, uids := held(t, 3)
	ctx := etcdtest.Context(t)
	// A: ListExcept's seeding, its listing paused after the first page.
	paused, resume := make(chan struct{}), make(chan struct{})
	a.afterPageRead = func() { a.afterPageRead = nil; close(paused); <-resume }
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, _, err := newClaims(uids).listExcept(ctx, a); err != nil {
			t.Error(err)
		}
	}()
	<-paused
	a.hold.drop() // what cidrChanged or reload does
	al, err := a.Get(ctx, items[0])
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := a.ReleaseIf(ctx, al); !ok || err != nil {
		t.Fatalf("ReleaseIf = %v, %v", ok, err)
	}
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	// B: a new seeding starts; A's listing finishes (and fills) while B lists.
	a.afterPageRead = func() {
		a.afterPageRead = nil
		close(resume)
		wg.Wait()
	}
	if _, _, err := newClaims(uids).listExcept(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	checkListExcept(t, a, uids)
}

// TestKeepHolders: a replica that keeps the holders (Config.KeepHolders) seeds them
// shortly after it starts, from a listing of the allocations made before, and again
// after they are dropped (a compaction of its watch): its first ListExcept reads only
// what no claimant holds, where without it the first lists everything.
func TestKeepHolders(t *testing.T) {
	e, _, _, uids := held(t, 40) // made by another replica, before this one starts
	ctx := etcdtest.Context(t)
	cfg := testConfig("10.0.0.0/24")
	cfg.KeepHolders = true
	a := startWith(t, e.Client, cfg, func(a *Allocator) { a.holdersWait = 20 * time.Millisecond })
	seeded := func() bool { _, s := holdersState(a); return s != 0 && a.Sync(ctx) == nil }
	etcdtest.WaitFor(t, 10*time.Second, "the holders to be seeded", seeded)
	if n := checkListExcept(t, a, uids); n != 1 {
		t.Errorf("first ListExcept of a replica keeping the holders read %d; want only the unclaimed "+
			"kubernetes address", n)
	}
	if _, err := a.Assign(ctx, owner("late"), IP(netip.MustParseAddr("10.0.0.250"))); err != nil {
		t.Fatal(err)
	}
	uids[IP(netip.MustParseAddr("10.0.0.250"))] = "late"
	if err := a.idx.reload(ctx); err != nil { // what the watch does after a compaction
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, "the holders to be seeded again", seeded)
	if n := checkListExcept(t, a, uids); n != 1 {
		t.Errorf("ListExcept after the holders were dropped and seeded again read %d; want 1", n)
	}
}

// slowKeysKV delays, while armed, the keys-only reads at a revision: listItems, which
// cidrChanged runs to fill the bitmap of a new range (between its drop of the holders
// and its store of the new table).
type slowKeysKV struct {
	clientv3.KV
	armed atomic.Bool
	delay time.Duration
}

func (k *slowKeysKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (
	*clientv3.GetResponse, error) {
	if op := clientv3.OpGet(key, opts...); k.armed.Load() && op.IsKeysOnly() && op.Rev() != 0 {
		time.Sleep(k.delay)
	}
	return k.KV.Get(ctx, key, opts...)
}

// holdersState returns the holders' generation and the revision they were seeded at.
func holdersState(a *Allocator) (gen uint64, seeded int64) {
	a.hold.mu.Lock()
	defer a.hold.mu.Unlock()
	return a.hold.gen, a.hold.seeded
}

// TestHoldersRangeAdded: an allocation that predates its range (a stray key, a restore)
// and that no Service claims. A ServiceCIDR holding it is created; a background
// seeding that followed the drop in cidrChanged listed while the old table was still
// installed (cidrChanged drops, fills the new range's bitmap, then stores the table),
// so the holders never got the item, and no later ListExcept read it: the leak was
// invisible to every pass until the holders were dropped again. (Found by a review;
// apply drops them again once the table is stored.)
func TestHoldersRangeAdded(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprint("keep=", keep), func(t *testing.T) {
			e := etcdtest.New(t)
			ctx := etcdtest.Context(t)
			v := `{"namespace":"ns","name":"stray","uid":"uid-stray","time":"2024-01-01T00:00:00Z"}`
			if _, err := e.Client.Put(ctx, "/allocd/clusterips/10.1.0.5", v); err != nil {
				t.Fatal(err)
			}
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint},
				DialTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cli.Close() })
			slow := &slowKeysKV{KV: cli.KV, delay: time.Second}
			cli.KV = slow
			cfg := testConfig("10.0.0.0/24")
			cfg.KeepHolders = keep
			a := startWith(t, cli, cfg, func(a *Allocator) { a.holdersWait = 10 * time.Millisecond })
			uids := map[Item]string{} // no Service claims anything but what checkListExcept needs
			if !keep {
				checkListExcept(t, a, uids) // seeds, as the first pass would
			}
			etcdtest.WaitFor(t, 10*time.Second, "seeded", func() bool {
				_, s := holdersState(a)
				return s != 0
			})
			gen0, _ := holdersState(a)
			slow.armed.Store(true)
			if _, err := a.CreateServiceCIDR(ctx, "extra", []string{"10.1.0.0/24"}); err != nil {
				t.Fatal(err)
			}
			slow.armed.Store(false)
			if err := a.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			if !keep {
				checkListExcept(t, a, uids) // the first pass after the drop lists and seeds
			}
			etcdtest.WaitFor(t, 10*time.Second, "seeded again", func() bool {
				g, s := holdersState(a)
				return g != gen0 && s != 0 && a.Sync(ctx) == nil
			})
			checkListExcept(t, a, uids) // must read 10.1.0.5: listed, claimed by nobody
		})
	}
}

// TestHoldersNonCanonicalKey: List took nodeports/030000 as port 30000, so a seeding
// recorded its owner for 30000; the watch leaves the key out of the holders (not in
// its own form), so its delete never reached them: the claim stayed held although
// nothing was allocated under 30000. List now leaves such keys out too.
func TestHoldersNonCanonicalKey(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	v := `{"namespace":"ns","name":"b","uid":"uid-b","time":"2024-01-01T00:00:00Z"}`
	if _, err := e.Client.Put(ctx, "/allocd/nodeports/030000", v); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("10.0.0.0/24")
	cfg.KeepHolders = true
	a := startWith(t, e.Client, cfg, func(a *Allocator) { a.holdersWait = 10 * time.Millisecond })
	etcdtest.WaitFor(t, 10*time.Second, "seeded", func() bool { _, s := holdersState(a); return s != 0 })
	if _, err := e.Client.Delete(ctx, "/allocd/nodeports/030000"); err != nil {
		t.Fatal(err)
	}
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	checkListExcept(t, a, map[Item]string{Port(30000): "uid-b"})
}

// TestHoldersRun: the keeping loop seeds the holders after its interval, tries again a
// seeding that failed (recorded: counted, logged at warning once in the run), waiting
// twice as long each time; once seeded they are kept (the loop's start finds them).
func TestHoldersRun(t *testing.T) {
	h := &recordHandler{}
	reg := prometheus.NewRegistry()
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_failures_total"}, []string{"step"})
	reg.MustRegister(vec)
	hs := &holders{log: slog.New(h), fails: newFailures(slog.New(h), vec)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var calls []time.Time
	seeded := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		hs.run(ctx, 10*time.Millisecond, func(_ context.Context, gen uint64) (int64, int, error) {
			calls = append(calls, time.Now())
			if len(calls) < 3 {
				hs.dropSeeding(gen)
				return 0, 0, errors.New("listing failed")
			}
			hs.fill(gen, 7, nil)
			close(seeded)
			return 7, 0, nil
		})
	}()
	<-seeded
	etcdtest.WaitFor(t, 5*time.Second, "the seeding's line", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.recs) >= 3
	})
	cancel()
	<-done
	if len(calls) != 3 || calls[2].Sub(calls[1]) < calls[1].Sub(calls[0]) {
		t.Errorf("seedings at %v; want 3, the waits growing", calls)
	}
	if n := counter(t, reg, "test_failures_total", stepHoldersSeed); n != 2 {
		t.Errorf("failed seedings counted = %v; want 2", n)
	}
	var msgs []string
	for _, l := range h.take() {
		msgs = append(msgs, l["msg"])
	}
	want := []string{"holders not seeded; trying again", "step works again", "holders seeded"}
	if !slices.Equal(msgs, want) {
		t.Errorf("logged %q; want %q", msgs, want)
	}
	if _, ok := hs.check(7, nil, nil); !ok {
		t.Errorf("holders not kept and seeded after the run")
	}
	if _, started := hs.start(); started {
		t.Errorf("holders could be started again while kept: the loop would seed them again")
	}
}
