package allocator

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// TestServiceCIDRBadInput: every bad create or delete is refused with the field it
// names, and writes nothing.
func TestServiceCIDRBadInput(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/28"))
	ctx := etcdtest.Context(t)
	before, err := e.Client.Get(ctx, "/allocd/config/servicecidrs/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		cidrs []string
		field string
	}{
		{"", []string{"10.1.0.0/24"}, "name"},
		{"Upper", []string{"10.1.0.0/24"}, "name"},
		{"ok", nil, "cidrs"},
		{"ok", []string{"10.1.0.0/24", "fd00::/120", "10.2.0.0/24"}, "cidrs"},
		{"ok", []string{"10.1.0.0"}, "cidrs[0]"},
		{"ok", []string{"10.1.0.1/24"}, "cidrs[0]"},
		{"ok", []string{"10.1.0.0/24", "10.2.0.0/24"}, "cidrs[1]"},
		{"ok", []string{"10.0.0.0/7"}, "cidrs[0]"},
		{"ok", []string{"10.1.0.0/30"}, "cidrs[0]"},
		{"ok", []string{"::ffff:10.1.0.0/120"}, "cidrs[0]"},
	} {
		_, err := a.CreateServiceCIDR(ctx, tc.name, tc.cidrs)
		var ie *InvalidError
		if !errors.As(err, &ie) || len(ie.Violations) == 0 || ie.Violations[0].Field != tc.field {
			t.Errorf("CreateServiceCIDR(%q, %v) = %v; want an *InvalidError on %s", tc.name, tc.cidrs, err,
				tc.field)
		}
	}
	if _, err := a.CreateServiceCIDR(ctx, KubernetesCIDR, []string{"10.1.0.0/24"}); !errors.Is(err,
		ErrCIDRExists) {
		t.Errorf("CreateServiceCIDR(kubernetes) = %v; want ErrCIDRExists", err)
	}
	if _, err := a.DeleteServiceCIDR(ctx, "nope"); !errors.Is(err, ErrCIDRNotFound) {
		t.Errorf("DeleteServiceCIDR(nope) = %v; want ErrCIDRNotFound", err)
	}
	if _, err := a.GetServiceCIDR(ctx, "nope"); !errors.Is(err, ErrCIDRNotFound) {
		t.Errorf("GetServiceCIDR(nope) = %v; want ErrCIDRNotFound", err)
	}
	after, err := e.Client.Get(ctx, "/allocd/config/servicecidrs/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Kvs) != len(before.Kvs) || after.Kvs[0].ModRevision != before.Kvs[0].ModRevision {
		t.Errorf("bad input changed the ServiceCIDRs: %d keys before, %d after", len(before.Kvs),
			len(after.Kvs))
	}
}

// TestServiceCIDRLifecycle is the walkthrough an operator does: fill a /28, see the
// error that says how to add a range, add a /24, allocate from it, delete the /28,
// see it terminating with its blockers, release them, see it gone.
func TestServiceCIDRLifecycle(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/28"))
	ctx := etcdtest.Context(t)
	var held []netip.Addr
	for i := range 14 { // 14 usable addresses, one of them the kubernetes one
		res, err := a.Allocate(ctx, Request{Owner: owner(fmt.Sprint("f", i))})
		if err != nil {
			if i != 13 {
				t.Fatalf("Allocate %d = %v", i, err)
			}
			var fe *FullError
			if !errors.As(err, &fe) || fe.Range != "10.0.0.0/28" ||
				!strings.HasSuffix(fe.Hint, addRangeHint) {
				t.Fatalf("Allocate on a full /28 = %v; want a *FullError on 10.0.0.0/28 that says to "+
					"CreateServiceCIDR", err)
			}
			break
		}
		held = append(held, res.ClusterIPs[0])
	}
	if _, err := a.CreateServiceCIDR(ctx, "extra", []string{"10.0.1.0/24"}); err != nil {
		t.Fatalf("CreateServiceCIDR(extra) = %v", err)
	}
	res, err := a.Allocate(ctx, Request{Owner: owner("after")})
	if err != nil || !netip.MustParsePrefix("10.0.1.0/24").Contains(res.ClusterIPs[0]) {
		t.Fatalf("Allocate after adding 10.0.1.0/24 = %+v, %v; want an address of it", res, err)
	}
	c, err := a.DeleteServiceCIDR(ctx, KubernetesCIDR)
	if err != nil || c.State != CIDRTerminating {
		t.Fatalf("DeleteServiceCIDR(kubernetes) = %+v, %v; want terminating", c, err)
	}
	// Nothing new comes from it, even an address named.
	named := Request{Owner: owner("named"), ClusterIPs: []netip.Addr{netip.MustParseAddr("10.0.0.14")}}
	if _, err := a.Allocate(ctx, named); !errors.Is(err, ErrTerminating) && !errors.Is(err, ErrAllocated) {
		t.Errorf("Allocate(10.0.0.14) from a terminating CIDR = %v; want ErrTerminating", err)
	}
	c, err = a.GetServiceCIDR(ctx, KubernetesCIDR)
	if err != nil || c.State != CIDRTerminating || c.Blockers != len(held)+1 ||
		len(c.Sample) != BlockerSample {
		t.Fatalf("GetServiceCIDR(kubernetes) = %+v, %v; want terminating, blocked by %d with a sample of %d",
			c, err, len(held)+1, BlockerSample)
	}
	for i, addr := range held {
		if _, _, err := a.Release(ctx, owner(fmt.Sprint("f", i)), []Item{IP(addr)}, false); err != nil {
			t.Fatalf("Release(%s) = %v", addr, err)
		}
	}
	// The kubernetes Service's address blocks it like any other: a look of the drain
	// loop, with the releases in the index, leaves it.
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	a.drain(ctx)
	if c, err := a.GetServiceCIDR(ctx, KubernetesCIDR); err != nil || c.Blockers != 1 ||
		c.Sample[0].Owner != KubernetesOwner {
		t.Fatalf("GetServiceCIDR(kubernetes) after the releases = %+v, %v; want blocked by the kubernetes "+
			"address only", c, err)
	}
	if _, _, err := a.Release(ctx, KubernetesOwner, []Item{IP(a.kubernetesIP())}, false); err != nil {
		t.Fatalf("Release(kubernetes address) = %v", err)
	}
	etcdtest.WaitFor(t, 10*time.Second, "the drained ServiceCIDR to be removed", func() bool {
		_, err := a.GetServiceCIDR(ctx, KubernetesCIDR)
		return errors.Is(err, ErrCIDRNotFound)
	})
	list, err := a.ListServiceCIDRs(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "extra" {
		t.Errorf("ListServiceCIDRs() = %+v, %v; want extra only", list, err)
	}
	if got := strings.Join(a.idx.rangeNames(), " "); got != "10.0.1.0/24 30000-32767" {
		t.Errorf("rangeNames() = %s; want 10.0.1.0/24 30000-32767", got)
	}
}

// TestServiceCIDRAcrossReplicas: a ServiceCIDR created through one replica is
// allocated from by the other within a second, and deleting it stops both.
func TestServiceCIDRAcrossReplicas(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/29"))
	b := start(t, e.NewClient(), testConfig("10.0.0.0/29"))
	ctx := etcdtest.Context(t)
	if _, err := a.CreateServiceCIDR(ctx, "extra", []string{"10.9.0.0/24"}); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	etcdtest.WaitFor(t, time.Second, "the other replica to see the new CIDR", func() bool {
		return strings.Contains(strings.Join(b.idx.rangeNames(), " "), "10.9.0.0/24")
	})
	t.Logf("seen by the other replica after %v", time.Since(created))
	res, err := b.Allocate(ctx,
		Request{Owner: owner("b"), ClusterIPs: []netip.Addr{netip.MustParseAddr("10.9.0.77")}})
	if err != nil {
		t.Fatalf("Allocate(10.9.0.77) on the other replica = %+v, %v", res, err)
	}
}

// TestServiceCIDRDeleteRace deletes a ServiceCIDR while two replicas allocate from
// it as fast as they can, many times: no allocation committed after the delete lies
// only in the deleted CIDR, and once it is removed no address lies in it alone.
func TestServiceCIDRDeleteRace(t *testing.T) {
	if testing.Short() {
		t.Skip("eight rounds of a race on two replicas: seconds")
	}
	e := etcdtest.New(t)
	// A /29 that fills at once: the allocations then come from the CIDR of the round.
	a := start(t, e.Client, testConfig("10.0.0.0/29"))
	b := start(t, e.NewClient(), testConfig("10.0.0.0/29"))
	ctx := etcdtest.Context(t)
	for round := range 8 {
		name := fmt.Sprint("race", round)
		cidr := netip.MustParsePrefix(fmt.Sprintf("10.%d.0.0/22", 10+round))
		if _, err := a.CreateServiceCIDR(ctx, name, []string{cidr.String()}); err != nil {
			t.Fatal(err)
		}
		etcdtest.WaitFor(t, 5*time.Second, "both replicas to see "+name, func() bool {
			return b.Free(cidr.String()) > 0
		})
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		type commit struct {
			addr netip.Addr
			rev  int64
		}
		var commits []commit
		var tries atomic.Int64 // Allocate calls returned
		for w := range 8 {
			al := []*Allocator{a, b}[w%2]
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					res, err := al.Allocate(ctx, Request{Owner: owner(fmt.Sprintf("r%d-%d-%d", round, w, i))})
					tries.Add(1)
					if err != nil {
						continue
					}
					mu.Lock()
					commits = append(commits, commit{res.ClusterIPs[0], res.Revision})
					mu.Unlock()
				}
			})
		}
		// The delete lands among allocations in flight, and they go on after it.
		etcdtest.WaitFor(t, 10*time.Second, "allocations under way", func() bool { return tries.Load() >= 8 })
		del, err := []*Allocator{a, b}[round%2].DeleteServiceCIDR(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		after := tries.Load()
		etcdtest.WaitFor(t, 10*time.Second, "allocations after the delete",
			func() bool { return tries.Load() >= after+16 })
		close(stop)
		wg.Wait()
		for _, c := range commits {
			if c.rev > del.Revision && cidr.Contains(c.addr) {
				t.Errorf("round %d: %s allocated from %s at revision %d, after its deletion at %d", round,
					c.addr, name, c.rev, del.Revision)
			}
		}
		// Release everything of the round; the CIDR must then be removed.
		for _, c := range commits {
			if _, _, err := a.Release(ctx, Owner{}, []Item{IP(c.addr)}, true); err != nil {
				t.Fatalf("Release(%s) = %v", c.addr, err)
			}
		}
		etcdtest.WaitFor(t, 10*time.Second, name+" to be removed", func() bool {
			_, err := a.GetServiceCIDR(ctx, name)
			return errors.Is(err, ErrCIDRNotFound)
		})
		resp, err := e.Client.Get(ctx, "/allocd/clusterips/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			addr := netip.MustParseAddr(strings.TrimPrefix(string(kv.Key), "/allocd/clusterips/"))
			if cidr.Contains(addr) {
				t.Errorf("round %d: %s is allocated in the removed %s", round, addr, cidr)
			}
		}
		t.Logf("round %d: %d allocations, deleted at revision %d", round, len(commits), del.Revision)
	}
}

// TestServiceCIDRRestartWithOldFlags: a replica started again with the first flags
// after ServiceCIDRs changed at runtime keeps every allocation and every CIDR.
func TestServiceCIDRRestartWithOldFlags(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	cctx, cancel := context.WithCancel(ctx)
	a, err := New(cctx, e.Client, testConfig("10.0.0.0/28"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(cctx) }()
	if _, err := a.CreateServiceCIDR(ctx, "extra", []string{"10.0.1.0/24"}); err != nil {
		t.Fatal(err)
	}
	want := map[netip.Addr]string{}
	for i := range 30 {
		res, err := a.Allocate(ctx, Request{Owner: owner(fmt.Sprint("k", i))})
		if err != nil {
			t.Fatal(err)
		}
		want[res.ClusterIPs[0]] = owner(fmt.Sprint("k", i)).UID
	}
	if _, err := a.DeleteServiceCIDR(ctx, KubernetesCIDR); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	b := start(t, e.NewClient(), testConfig("10.0.0.0/28"))
	for addr, uid := range want {
		al, err := b.Get(ctx, IP(addr))
		if err != nil || al.Owner.UID != uid {
			t.Errorf("after restart Get(%s) = %+v, %v; want held by %s", addr, al, err, uid)
		}
	}
	c, err := b.GetServiceCIDR(ctx, KubernetesCIDR)
	if err != nil || c.State != CIDRTerminating {
		t.Errorf("after restart GetServiceCIDR(kubernetes) = %+v, %v; want still terminating", c, err)
	}
	if _, err := b.Allocate(ctx, Request{Owner: owner("new")}); err != nil {
		t.Errorf("Allocate after restart = %v; want an address of extra", err)
	}
}

// TestGuardComparedOncePerRevision: picks that draw from one ServiceCIDR (copies of its
// reference, from two ranges or two tables) compare its key once per revision seen, so
// that a group commit counted at 128 operations holds 128; two revisions of one key
// are both compared.
func TestGuardComparedOncePerRevision(t *testing.T) {
	st := newStore(nil, nil, "/t")
	a := &Allocator{store: st, epochs: newEpochs(st, nil, nil)}
	ref := func(rev int64) *cidrRef {
		key := a.cidrKey(KubernetesCIDR)
		return &cidrRef{name: KubernetesCIDR, key: key, rev: rev, ready: true,
			id: fmt.Sprintf("%s@%d", key, rev)}
	}
	r := newIPRangeFor(netip.MustParsePrefix("10.0.0.0/24"))
	mk := func(uid string, off uint64, g *cidrRef) *op {
		it := r.item(off)
		return &op{owner: owner(uid), ownerKey: a.ownerKey(uid), next: &ownerRecord{},
			picks: []*pick{{r: r, off: off, item: it, key: a.key(it), guard: g}}}
	}
	count := func(ops []*op) int {
		cmps, _ := a.txnOps(ops, time.Now())
		n := 0
		for _, c := range cmps {
			if strings.HasPrefix(string(c.KeyBytes()), a.cidrPrefix) {
				n++
			}
		}
		return n
	}
	same := []*op{mk("x", 1, ref(5)), mk("y", 2, ref(5)), mk("z", 3, ref(5))}
	if n := count(same); n != 1 {
		t.Errorf("three picks from copies of one ServiceCIDR reference: %d compares of it; want 1", n)
	}
	seen := map[string]struct{}{}
	total := 0
	for _, o := range same {
		total += o.newGuards(seen)
		seen[o.picks[0].guard.id] = struct{}{}
	}
	if total != 1 {
		t.Errorf("newGuards counted %d compares for them; want 1", total)
	}
	if n := count([]*op{mk("x", 1, ref(5)), mk("y", 2, ref(9))}); n != 2 {
		t.Errorf("picks from two revisions of one ServiceCIDR: %d compares; want 2", n)
	}
}

// TestTerminatingFamilies: PreferDualStack falls back to one family when the other
// has only terminating ranges; an owner asks again for an address it holds in a
// terminating range (with more), and gets it; another owner does not.
func TestTerminatingFamilies(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/24"))
	ctx := etcdtest.Context(t)
	if _, err := a.CreateServiceCIDR(ctx, "v6", []string{"fd00::/120"}); err != nil {
		t.Fatal(err)
	}
	held, err := a.Allocate(ctx, Request{Owner: owner("six"), Families: []Family{IPv6}, Policy: SingleStack})
	if err != nil {
		t.Fatal(err)
	}
	v6 := held.ClusterIPs[0]
	if _, err := a.DeleteServiceCIDR(ctx, "v6"); err != nil {
		t.Fatal(err)
	}
	res, err := a.Allocate(ctx, Request{Owner: owner("prefer"), Policy: PreferDualStack})
	if err != nil || len(res.ClusterIPs) != 1 || !res.ClusterIPs[0].Is4() {
		t.Errorf("Allocate(PreferDualStack) with IPv6 terminating = %+v, %v; want one IPv4 address", res, err)
	}
	res, err = a.Allocate(ctx, Request{Owner: owner("six"), ClusterIPs: []netip.Addr{v6}, NodePortCount: 1})
	if err != nil || len(res.NodePorts) != 1 || res.ClusterIPs[0] != v6 {
		t.Errorf("Allocate(%s it holds, and a node port) = %+v, %v; want both", v6, res, err)
	}
	if _, err := a.Allocate(ctx,
		Request{Owner: owner("other"), ClusterIPs: []netip.Addr{v6}}); !errors.Is(err, ErrTerminating) {
		t.Errorf("Allocate(%s held by another, terminating) = %v; want ErrTerminating", v6, err)
	}
	free := netip.MustParseAddr("fd00::77")
	if _, err := a.Allocate(ctx,
		Request{Owner: owner("six"), ClusterIPs: []netip.Addr{free}}); !errors.Is(err, ErrTerminating) {
		t.Errorf("Allocate(%s, free, terminating) = %v; want ErrTerminating", free, err)
	}
}

// TestOverlappingCIDRs: a /23 added over the kubernetes /24 widens it: the addresses
// of both are one set of keys (no address handed out twice, every one of the /23
// handed out once, the full error naming both), and the /24 can be
// deleted and removed at once although allocations lie in it, since the ready /23
// holds them all.
func TestOverlappingCIDRs(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/24"))
	b := start(t, e.NewClient(), testConfig("10.0.0.0/24"))
	ctx := etcdtest.Context(t)
	if _, err := a.CreateServiceCIDR(ctx, "wider", []string{"10.0.0.0/23"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 5*time.Second, "the other replica to see the /23",
		func() bool { return b.Free("10.0.0.0/23") > 0 })
	seen := map[netip.Addr]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range 8 {
		al := []*Allocator{a, b}[w%2]
		wg.Go(func() {
			for i := range 64 {
				uid := fmt.Sprintf("o%d-%d", w, i)
				res, err := al.Allocate(ctx, Request{Owner: owner(uid)})
				var fe *FullError
				if errors.As(err, &fe) && fe.Range == "10.0.0.0/24, 10.0.0.0/23" {
					continue // the last 3 of 512 calls
				}
				if err != nil {
					t.Errorf("Allocate(%s) = %v", uid, err)
					return
				}
				mu.Lock()
				if prev, ok := seen[res.ClusterIPs[0]]; ok {
					t.Errorf("%s handed to %s and %s", res.ClusterIPs[0], prev, uid)
				}
				seen[res.ClusterIPs[0]] = uid
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// The /23's 510 usable addresses (10.0.0.255, the /24's broadcast address, is one
	// of them), less the kubernetes one.
	if len(seen) != 509 {
		t.Errorf("%d allocations; want 509", len(seen))
	}
	if _, err := a.DeleteServiceCIDR(ctx, KubernetesCIDR); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, "the /24, held by the /23, to be removed", func() bool {
		_, err := a.GetServiceCIDR(ctx, KubernetesCIDR)
		return errors.Is(err, ErrCIDRNotFound)
	})
	for addr, uid := range seen {
		if al, err := b.Get(ctx, IP(addr)); err != nil || al.Owner.UID != uid {
			t.Fatalf("Get(%s) after the /24 was removed = %+v, %v; want held by %s", addr, al, err, uid)
		}
	}
}

// TestAllocationOrder: the ranges fill in creation order, and an address released in
// an earlier range is handed out before the later range's (the pick's cursor goes
// back when the watch sees a release).
func TestAllocationOrder(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/29"))
	ctx := etcdtest.Context(t)
	if _, err := a.CreateServiceCIDR(ctx, "later", []string{"10.1.0.0/24"}); err != nil {
		t.Fatal(err)
	}
	var first netip.Addr
	for i := range 7 { // the /29's 5 free addresses, then the /24's
		res, err := a.Allocate(ctx, Request{Owner: owner(fmt.Sprint("o", i))})
		if err != nil {
			t.Fatal(err)
		}
		got, want := res.ClusterIPs[0], netip.MustParsePrefix("10.0.0.0/29")
		if i >= 5 {
			want = netip.MustParsePrefix("10.1.0.0/24")
		}
		if !want.Contains(got) {
			t.Fatalf("Allocate %d = %s; want an address of %s", i, got, want)
		}
		if i == 0 {
			first = got
		}
	}
	if _, _, err := a.Release(ctx, owner("o0"), []Item{IP(first)}, false); err != nil {
		t.Fatal(err)
	}
	// Sync, not a wait for the free count: Allocate answers once committed, and the
	// index may not have seen every allocation yet, so the count could read 1 before
	// the release was seen.
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if free := a.Free("10.0.0.0/29"); free != 1 {
		t.Fatalf("free addresses of 10.0.0.0/29 after the release = %d; want 1", free)
	}
	res, err := a.Allocate(ctx, Request{Owner: owner("again")})
	if err != nil || res.ClusterIPs[0] != first {
		t.Errorf("Allocate after releasing %s = %+v, %v; want %s again (the earlier range first)", first, res,
			err, first)
	}
}
