package allocator

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/badrequest"
	"github.com/allocd/allocd/internal/testing/etcdtest"
)

func testConfig(ranges ...string) Config {
	c := Config{Prefix: "/allocd", NodePortRange: DefaultNodePortRange}
	for _, r := range ranges {
		c.ClusterIPRanges = append(c.ClusterIPRanges, netip.MustParsePrefix(r))
	}
	return c
}

// start makes an Allocator and runs it until the test ends.
func start(t *testing.T, cli *clientv3.Client, cfg Config) *Allocator {
	t.Helper()
	return startWith(t, cli, cfg, nil)
}

// startWith is start, calling before (unless nil) on the allocator before Run.
func startWith(t *testing.T, cli *clientv3.Client, cfg Config, before func(*Allocator)) *Allocator {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a, err := New(ctx, cli, cfg)
	if err != nil {
		cancel()
		t.Fatalf("New(%v) = %v", cfg.ClusterIPRanges, err)
	}
	if before != nil {
		before(a)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v; want nil", err)
		}
	})
	// Until Run's watch runs, a call that waits for the index to see its own write
	// (CreateServiceCIDR, say) gives up at once: wait for it, with a write the index
	// must get past.
	if _, err := cli.Put(ctx, "/allocator-test-started", ""); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, "the allocator's watch to run",
		func() bool { return a.Sync(ctx) == nil })
	return a
}

func owner(uid string) Owner { return Owner{Namespace: "ns", Name: "svc-" + uid, UID: uid} }

func TestAllocateAndReplay(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/24", "fd00::/120"))
	ctx := etcdtest.Context(t)

	if al, err := a.Get(ctx, IP(netip.MustParseAddr("10.0.0.1"))); err != nil || al.Owner != KubernetesOwner {
		t.Fatalf("Get(10.0.0.1) = %+v, %v; want held by %v", al, err, KubernetesOwner)
	}
	tests := []struct {
		name     string
		req      Request
		families []bool // is4 of each address
		ports    int
	}{
		{"single stack default", Request{}, []bool{true}, 0},
		{"single stack IPv6", Request{Families: []Family{IPv6}}, []bool{false}, 0},
		{"prefer dual", Request{Policy: PreferDualStack}, []bool{true, false}, 0},
		{"require dual IPv6 first", Request{Policy: RequireDualStack, Families: []Family{IPv6}},
			[]bool{false, true}, 0},
		{"ports only", Request{NoClusterIP: true, NodePortCount: 3}, nil, 3},
		{"ip and port", Request{NodePortCount: 1}, []bool{true}, 1},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			req.Owner = owner(fmt.Sprint("replay-", i))
			got, err := a.Allocate(ctx, req)
			if err != nil {
				t.Fatalf("Allocate(%+v) = %v", req, err)
			}
			if len(got.ClusterIPs) != len(tc.families) || len(got.NodePorts) != tc.ports || got.Replayed ||
				got.Revision == 0 {
				t.Fatalf("Allocate(%+v) = %+v; want %d addresses, %d ports, a revision, not replayed", req,
					got, len(tc.families), tc.ports)
			}
			for j, ip := range got.ClusterIPs {
				if ip.Is4() != tc.families[j] {
					t.Errorf("Allocate(%+v) address %d = %s; want is4=%v", req, j, ip, tc.families[j])
				}
				r, off, err := a.idx.locate(IP(ip))
				if err != nil || r.Static(off) {
					t.Errorf("Allocate(%+v) address %s: offset %d, %v; want in the dynamic band", req, ip,
						off, err)
				}
				al, err := a.Get(ctx, IP(ip))
				if err != nil || al.Owner != req.Owner || al.CreateRevision != got.Revision {
					t.Errorf("Get(%s) = %+v, %v; want held by %v since revision %d", ip, al, err, req.Owner,
						got.Revision)
				}
			}
			for _, p := range got.NodePorts {
				if p < 30086 || p > 32767 {
					t.Errorf("Allocate(%+v) port %d; want in the dynamic band 30086-32767", req, p)
				}
			}
			again, err := a.Allocate(ctx, req)
			if err != nil || !again.Replayed ||
				fmt.Sprint(again.ClusterIPs, again.NodePorts) != fmt.Sprint(got.ClusterIPs, got.NodePorts) {
				t.Errorf("retry of Allocate(%+v) = %+v, %v; want the same result, replayed", req, again, err)
			}
		})
	}

	// A different request of an existing owner allocates more.
	o := owner("replay-0")
	more, err := a.Allocate(ctx, Request{Owner: o, NoClusterIP: true, NodePorts: []int{30005}})
	if err != nil || len(more.NodePorts) != 1 || more.NodePorts[0] != 30005 || more.Replayed {
		t.Fatalf("Allocate(more for %s) = %+v, %v; want port 30005", o.UID, more, err)
	}
	page, err := a.ListPage(ctx, ListOptions{OwnerUID: o.UID})
	if err != nil || len(page.Allocations) != 2 {
		t.Errorf("ListPage(owner %s) = %+v, %v; want 2 allocations", o.UID, page, err)
	}
}

func TestAllocateErrors(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/29"))
	ctx := etcdtest.Context(t)
	held, err := a.Allocate(ctx,
		Request{Owner: owner("holder"), ClusterIPs: []netip.Addr{netip.MustParseAddr("10.0.0.3")}})
	if err != nil {
		t.Fatalf("Allocate(10.0.0.3) = %v", err)
	}
	ip := func(s string) []netip.Addr { return []netip.Addr{netip.MustParseAddr(s)} }
	tests := []struct {
		name   string
		req    Request
		check  func(error) bool
		holder Owner
	}{
		{"held by another", Request{ClusterIPs: ip("10.0.0.3")}, func(err error) bool {
			var ae *AllocatedError
			return errors.As(err, &ae) && ae.Holder == owner("holder")
		}, owner("holder")},
		{"kubernetes address", Request{ClusterIPs: ip("10.0.0.1")}, func(err error) bool {
			var ae *AllocatedError
			return errors.As(err, &ae) && ae.Holder == KubernetesOwner
		}, KubernetesOwner},
		{"network address", Request{ClusterIPs: ip("10.0.0.0")},
			func(err error) bool { var e *NotInRangeError; return errors.As(err, &e) }, Owner{}},
		{"broadcast", Request{ClusterIPs: ip("10.0.0.7")},
			func(err error) bool { return errors.Is(err, ErrNotInRange) }, Owner{}},
		{"outside", Request{ClusterIPs: ip("10.0.1.1")},
			func(err error) bool { return errors.Is(err, ErrNotInRange) }, Owner{}},
		{"no IPv6 range", Request{ClusterIPs: ip("fd00::1")},
			func(err error) bool { return errors.Is(err, ErrNoRange) }, Owner{}},
		{"require dual stack", Request{Policy: RequireDualStack},
			func(err error) bool { return errors.Is(err, ErrNoRange) }, Owner{}},
		{"port outside", Request{NodePorts: []int{80}},
			func(err error) bool { return errors.Is(err, ErrNotInRange) }, Owner{}},
		{"port twice", Request{NodePorts: []int{30001, 30001}},
			func(err error) bool { return errors.Is(err, ErrInvalid) }, Owner{}},
		{"too many", Request{NodePortCount: MaxItems + 1},
			func(err error) bool { return errors.Is(err, ErrInvalid) }, Owner{}},
		{"two IPv4",
			Request{ClusterIPs: []netip.Addr{netip.MustParseAddr("10.0.0.4"),
				netip.MustParseAddr("10.0.0.5")}},
			func(err error) bool { return errors.Is(err, ErrInvalid) }, Owner{}},
		{"single stack two families", Request{Families: []Family{IPv4, IPv6}},
			func(err error) bool { return errors.Is(err, ErrInvalid) }, Owner{}},
	}
	for i, tc := range tests {
		req := tc.req
		req.Owner = owner(fmt.Sprint("err-", i))
		got, err := a.Allocate(ctx, req)
		if !tc.check(err) {
			t.Errorf("%s: Allocate(%+v) = %+v, %v; want the matching error", tc.name, req, got, err)
		}
		// Nothing was written for the owner.
		if page, err := a.ListPage(ctx, ListOptions{OwnerUID: req.Owner.UID}); err != nil ||
			len(page.Allocations) != 0 {
			t.Errorf("%s: owner %s holds %+v, %v; want nothing", tc.name, req.Owner.UID, page.Allocations,
				err)
		}
	}
	// Fill the /29: 6 usable, one is the kubernetes address, one is held.
	var got []netip.Addr
	for i := range 4 {
		res, err := a.Allocate(ctx, Request{Owner: owner(fmt.Sprint("fill-", i))})
		if err != nil {
			t.Fatalf("Allocate(fill %d) = %v", i, err)
		}
		got = append(got, res.ClusterIPs...)
	}
	if _, err := a.Allocate(ctx, Request{Owner: owner("one-too-many")}); !errors.Is(err, ErrFull) {
		t.Errorf("Allocate on a full /29 = %v; want ErrFull", err)
	}
	etcdtest.WaitFor(t, 10*time.Second, "Free(10.0.0.0/29) = 0",
		func() bool { return a.Free("10.0.0.0/29") == 0 })
	// A dry run writes nothing.
	if _, _, err := a.Release(ctx, owner("holder"), nil, false); err != nil {
		t.Fatalf("Release(holder) = %v", err)
	}
	etcdtest.WaitFor(t, 10*time.Second, "the index to see the release",
		func() bool { return a.Free("10.0.0.0/29") == 1 })
	dry, err := a.Allocate(ctx, Request{Owner: owner("dry"), DryRun: true})
	if err != nil || len(dry.ClusterIPs) != 1 || dry.Revision != 0 {
		t.Errorf("Allocate(dry run) = %+v, %v; want one address, no revision", dry, err)
	}
	if _, err := a.Get(ctx, IP(held.ClusterIPs[0])); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get(%s) after release and a dry run = %v; want ErrNotFound", held.ClusterIPs[0], err)
	}
}

func TestRangesMismatch(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	if _, err := New(ctx, e.Client, testConfig("10.0.0.0/24")); err != nil {
		t.Fatalf("New = %v", err)
	}
	// The same ranges again: fine, and the kubernetes reservation is idempotent.
	if _, err := New(ctx, e.NewClient(), testConfig("10.0.0.0/24")); err != nil {
		t.Fatalf("New (second replica, same ranges) = %v", err)
	}
	// Another node port range is refused.
	cfg := testConfig("10.0.0.0/24")
	cfg.NodePortRange = PortRange{30000, 100}
	_, err := New(ctx, e.NewClient(), cfg)
	var me *RangesMismatchError
	if !errors.As(err, &me) || me.Stored == me.Configured {
		t.Errorf("New(%v %v) = %v; want a *RangesMismatchError naming both", cfg.ClusterIPRanges,
			cfg.NodePortRange, err)
	}
	// Other ClusterIP ranges are not: the kubernetes ServiceCIDR in etcd wins (as in
	// Kubernetes), and the replica allocates from it.
	for _, cfg := range []Config{testConfig("10.0.1.0/24"), testConfig("10.0.0.0/24", "fd00::/120")} {
		a, err := New(ctx, e.NewClient(), cfg)
		if err != nil {
			t.Fatalf("New(%v) = %v; want the stored kubernetes ServiceCIDR used", cfg.ClusterIPRanges, err)
		}
		if got := strings.Join(a.idx.rangeNames(), " "); got != "10.0.0.0/24 30000-32767" {
			t.Errorf("New(%v).rangeNames() = %s; want the stored ranges 10.0.0.0/24 30000-32767",
				cfg.ClusterIPRanges, got)
		}
		if a.kubernetesIP() != netip.MustParseAddr("10.0.0.1") {
			t.Errorf("New(%v).kubernetesIP() = %s; want 10.0.0.1", cfg.ClusterIPRanges, a.kubernetesIP())
		}
	}
	// Another prefix is another allocd.
	c := testConfig("10.0.1.0/24")
	c.Prefix = "/other"
	if _, err := New(ctx, e.Client, c); err != nil {
		t.Errorf("New(prefix /other) = %v", err)
	}
}

// Two replicas, each with its own etcd client, exhaust a /24 concurrently.
func TestTwoReplicasExhaust(t *testing.T) {
	e := etcdtest.New(t)
	cfg := testConfig("10.0.0.0/24")
	a1 := start(t, e.Client, cfg)
	a2 := start(t, e.NewClient(), cfg)
	ctx := etcdtest.Context(t)
	const requests = 320
	usable := 254 - 1 // minus the kubernetes address
	var mu sync.Mutex
	granted := map[netip.Addr]string{}
	full, other := 0, []error{}
	var wg sync.WaitGroup
	for w := range 32 {
		a := a1
		if w%2 == 1 {
			a = a2
		}
		wg.Go(func() {
			for i := w; i < requests; i += 32 {
				uid := fmt.Sprint("u", i)
				res, err := a.Allocate(ctx, Request{Owner: owner(uid)})
				mu.Lock()
				switch {
				case err == nil:
					for _, ip := range res.ClusterIPs {
						if prev, dup := granted[ip]; dup {
							t.Errorf("%s granted to %s and %s", ip, prev, uid)
						}
						granted[ip] = uid
					}
				case errors.Is(err, ErrFull):
					full++
				default:
					other = append(other, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(granted) != usable || full != requests-usable || len(other) != 0 {
		t.Errorf("granted %d, full %d, other errors %v; want %d granted, %d full, none", len(granted), full,
			other, usable, requests-usable)
	}
	// etcd agrees: every granted address is held by its owner.
	_, all, err := a1.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, al := range all {
		if al.Kind != KindClusterIP {
			continue
		}
		n++
		if uid, ok := granted[al.Addr]; ok && al.Owner.UID != uid {
			t.Errorf("etcd has %s held by %s; granted to %s", al.Addr, al.Owner.UID, uid)
		}
	}
	if n != usable+1 {
		t.Errorf("etcd holds %d ClusterIPs; want %d", n, usable+1)
	}
	// Both indexes converge on a full range.
	for _, a := range []*Allocator{a1, a2} {
		etcdtest.WaitFor(t, 10*time.Second, "a full index", func() bool { return a.Free("10.0.0.0/24") == 0 })
	}
}

func TestDualStackAllOrNothing(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/24", "fd00::/125"))
	ctx := etcdtest.Context(t)
	for i := range 7 { // fd00::/125 has 7 usable addresses
		if _, err := a.Allocate(ctx,
			Request{Owner: owner(fmt.Sprint("v6-", i)), Families: []Family{IPv6}}); err != nil {
			t.Fatalf("Allocate(IPv6 %d) = %v", i, err)
		}
	}
	before := a.Free("10.0.0.0/24")
	o := owner("dual")
	if res, err := a.Allocate(ctx, Request{Owner: o, Policy: RequireDualStack}); !errors.Is(err, ErrFull) {
		t.Fatalf("Allocate(require dual stack, IPv6 full) = %+v, %v; want ErrFull", res, err)
	}
	if page, err := a.ListPage(ctx, ListOptions{OwnerUID: o.UID}); err != nil || len(page.Allocations) != 0 {
		t.Errorf("owner %s holds %+v, %v; want nothing", o.UID, page.Allocations, err)
	}
	page, err := a.ListPage(ctx, ListOptions{Range: "10.0.0.0/24"})
	if err != nil || len(page.Allocations) != 1 {
		t.Errorf("ListPage(10.0.0.0/24) = %+v, %v; want only the kubernetes address", page.Allocations, err)
	}
	if after := a.Free("10.0.0.0/24"); after != before {
		t.Errorf("Free(10.0.0.0/24) = %d after the failed dual-stack Allocate; want %d", after, before)
	}
	// Prefer dual stack falls back to... nothing: it wants both configured families.
	if _, err := a.Allocate(ctx, Request{Owner: o, Policy: PreferDualStack}); !errors.Is(err, ErrFull) {
		t.Errorf("Allocate(prefer dual stack, IPv6 full) = %v; want ErrFull", err)
	}
}

func TestRestart(t *testing.T) {
	e := etcdtest.New(t, etcdtest.WithFsync())
	cfg := testConfig("10.0.0.0/24", "fd00::/120")
	ctx := etcdtest.Context(t)
	rctx, cancel := context.WithCancel(ctx)
	a, err := New(rctx, e.Client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(rctx) }()
	acked := map[Item]Owner{}
	for i := range 20 {
		o := owner(fmt.Sprint("r", i))
		res, err := a.Allocate(ctx, Request{Owner: o, Policy: PreferDualStack, NodePortCount: 1})
		if err != nil {
			t.Fatalf("Allocate(%d) = %v", i, err)
		}
		for _, ip := range res.ClusterIPs {
			acked[IP(ip)] = o
		}
		for _, p := range res.NodePorts {
			acked[Port(p)] = o
		}
	}
	cancel()
	<-done
	e.Restart()
	b := start(t, e.NewClient(), cfg)
	for it, o := range acked {
		al, err := b.Get(ctx, it)
		if err != nil || al.Owner != o {
			t.Errorf("after restart Get(%s) = %+v, %v; want held by %v", it, al, err, o)
		}
	}
	// The restarted index knows them: 20 IPv4, 20 IPv6 and the kubernetes address.
	if f := b.Free("10.0.0.0/24"); f != 254-21 {
		t.Errorf("after restart Free(10.0.0.0/24) = %d; want %d", f, 254-21)
	}
	// A retry after the restart still replays.
	res, err := b.Allocate(ctx, Request{Owner: owner("r3"), Policy: PreferDualStack, NodePortCount: 1})
	if err != nil || !res.Replayed || acked[IP(res.ClusterIPs[0])] != owner("r3") {
		t.Errorf("retry after restart = %+v, %v; want the acknowledged result, replayed", res, err)
	}
}

func TestRelease(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/24"))
	ctx := etcdtest.Context(t)
	o, other := owner("o"), owner("other")
	res, err := a.Allocate(ctx, Request{Owner: o, NodePortCount: 2})
	if err != nil {
		t.Fatal(err)
	}
	ip := IP(res.ClusterIPs[0])
	if _, _, err := a.Release(ctx, other, []Item{ip}, false); !errors.Is(err, ErrNotOwner) {
		t.Errorf("Release(%s by %s) = %v; want ErrNotOwner", ip, other.UID, err)
	}
	for i := range 2 {
		rel, rev, err := a.Release(ctx, o, []Item{ip}, false)
		if err != nil || (i == 0) != (len(rel) == 1 && rev > 0) {
			t.Errorf("Release(%s by its owner) #%d = %v, %d, %v; want freed once, then nothing", ip, i+1, rel,
				rev, err)
		}
	}
	if _, err := a.Get(ctx, ip); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get(%s) after Release = %v; want ErrNotFound", ip, err)
	}
	// The replay stops once the result is no longer held: the same request allocates.
	again, err := a.Allocate(ctx, Request{Owner: o, NodePortCount: 2})
	if err != nil || again.Replayed {
		t.Errorf("Allocate after a partial release = %+v, %v; want a new allocation", again, err)
	}
	// Force by another owner frees and fixes the holder's record.
	p := Port(res.NodePorts[0])
	if rel, _, err := a.Release(ctx, other, []Item{p}, true); err != nil || len(rel) != 1 {
		t.Errorf("Release(force %d) = %v, %v; want it freed", res.NodePorts[0], rel, err)
	}
	// Releasing all leaves a tombstone of the record, deleted once every transaction
	// built before the release fails its epoch compare.
	if _, _, err := a.Release(ctx, o, nil, false); err != nil {
		t.Fatal(err)
	}
	if page, _ := a.ListPage(ctx, ListOptions{OwnerUID: o.UID}); len(page.Allocations) != 0 {
		t.Errorf("owner %s holds %+v after releasing all; want nothing", o.UID, page.Allocations)
	}
	checkTombstone(t, e.Client, a, o.UID)
	passEpochs(t, a)
	if resp, err := e.Client.Get(ctx, a.ownerKey(o.UID)); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("owner record after releasing all and %d epochs = %v, %v; want gone", 2*epochSlack, resp.Kvs,
			err)
	}
	if _, _, err := a.Release(ctx, Owner{}, []Item{ip}, false); !errors.Is(err, ErrInvalid) {
		t.Errorf("Release(no owner, no force) = %v; want ErrInvalid", err)
	}
}

func TestRepairAPI(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/24"))
	ctx := etcdtest.Context(t)
	if got := a.idx.rangeNames(); fmt.Sprint(got) != "[10.0.0.0/24 30000-32767]" {
		t.Errorf("rangeNames() = %v", got)
	}
	if !a.IsReserved(IP(netip.MustParseAddr("10.0.0.1"))) ||
		a.IsReserved(IP(netip.MustParseAddr("10.0.0.2"))) {
		t.Errorf("IsReserved: want 10.0.0.1 only")
	}
	it := IP(netip.MustParseAddr("10.0.0.50"))
	al, err := a.Assign(ctx, owner("s1"), it)
	if err != nil || al.ModRevision == 0 || al.Range != "10.0.0.0/24" {
		t.Fatalf("Assign(%s) = %+v, %v", it, al, err)
	}
	again, err := a.Assign(ctx, owner("s1"), it)
	if err != nil || again.ModRevision != al.ModRevision {
		t.Errorf("Assign(%s) to its holder = %+v, %v; want no write (ModRevision %d)", it, again, err,
			al.ModRevision)
	}
	if _, err := a.Assign(ctx, owner("s2"), it); !errors.Is(err, ErrAllocated) {
		t.Errorf("Assign(%s) to another = %v; want ErrAllocated", it, err)
	}
	moved, err := a.Reassign(ctx, al, owner("s2"))
	if err != nil || moved.Owner != owner("s2") {
		t.Fatalf("Reassign = %+v, %v", moved, err)
	}
	if _, err := a.Reassign(ctx, al, owner("s3")); !errors.Is(err, ErrConflict) {
		t.Errorf("Reassign with a stale revision = %v; want ErrConflict", err)
	}
	if ok, err := a.ReleaseIf(ctx, al); ok || err != nil {
		t.Errorf("ReleaseIf(stale) = %v, %v; want false", ok, err)
	}
	rev, all, err := a.List(ctx)
	if err != nil || rev == 0 || len(all) != 2 {
		t.Fatalf("List = %d, %+v, %v; want the kubernetes address and %s", rev, all, err, it)
	}
	cur, err := a.Get(ctx, it)
	if err != nil || cur.ModRevision != moved.ModRevision {
		t.Fatalf("Get(%s) = %+v, %v", it, cur, err)
	}
	if ok, err := a.ReleaseIf(ctx, cur); !ok || err != nil {
		t.Errorf("ReleaseIf(current) = %v, %v; want true", ok, err)
	}
	for _, uid := range []string{"s1", "s2"} {
		checkTombstone(t, e.Client, a, uid)
	}
	passEpochs(t, a)
	for _, uid := range []string{"s1", "s2"} {
		if resp, _ := e.Client.Get(ctx, a.ownerKey(uid)); len(resp.Kvs) != 0 {
			t.Errorf("record of %s = %s; want deleted with its last item (a tombstone, then collected)", uid,
				resp.Kvs[0].Value)
		}
	}
}

func TestGroupCommit(t *testing.T) {
	e := etcdtest.New(t)
	reg := prometheus.NewRegistry()
	cfg := testConfig("10.0.0.0/16")
	cfg.Registerer = reg
	ctx := etcdtest.Context(t)
	a, err := New(ctx, e.Client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Let the requests queue up as they would behind busy transactions, then start
	// the committer.
	a.committer.qmu.Lock()
	a.committer.running = true
	a.committer.qmu.Unlock()
	const n = 400
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			_, err := a.Allocate(ctx, Request{Owner: owner(fmt.Sprint("g", i))})
			errs <- err
		})
	}
	etcdtest.WaitFor(t, 10*time.Second, "every request to queue", func() bool {
		a.committer.qmu.Lock()
		defer a.committer.qmu.Unlock()
		return len(a.committer.queue) == n
	})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(rctx) }()
	defer func() { cancel(); <-done }()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Allocate = %v", err)
		}
	}
	// Two keys per request (address and owner record), 128 per transaction, plus the
	// transaction of New's kubernetes reservation.
	txns := counter(t, reg, "allocd_allocator_commit_transactions_total", "committed")
	if want := float64((n+63)/64 + 1); txns != want {
		t.Errorf("%d queued Allocates took %v transactions; want %v (64 requests per transaction)", n, txns,
			want)
	}
	if got := counter(t, reg, "allocd_allocator_allocations_total", "dynamic"); got != n {
		t.Errorf("allocations_total{scope=dynamic} = %v; want %d", got, n)
	}
	etcdtest.WaitFor(t, 10*time.Second, "the watch to see every allocation",
		func() bool { return a.Free("10.0.0.0/16") == 65534-n-1 })
}

// counter returns the value of the first series of name with a label value val.
func counter(t *testing.T, reg *prometheus.Registry, name, val string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			if hasLabel(m, val) {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no metric %s{...=%q}", name, val)
	return 0
}

func hasLabel(m *dto.Metric, val string) bool {
	for _, l := range m.Label {
		if l.GetValue() == val {
			return true
		}
	}
	return false
}

func TestWatchAcrossReplicas(t *testing.T) {
	e := etcdtest.New(t)
	cfg := testConfig("10.0.0.0/24")
	a1 := start(t, e.Client, cfg)
	a2 := start(t, e.NewClient(), cfg)
	ctx := etcdtest.Context(t)
	res, err := a1.Allocate(ctx, Request{Owner: owner("w"), NodePortCount: 1})
	if err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, "replica 2 to see the allocation", func() bool {
		return a2.Free("10.0.0.0/24") == 252 && a2.Free("30000-32767") == 2767
	})
	if _, _, err := a2.Release(ctx, owner("w"), nil, false); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, "replica 1 to see the release",
		func() bool { return a1.Free("10.0.0.0/24") == 253 })
	r, off, _ := a1.idx.locate(IP(res.ClusterIPs[0]))
	if r.IsUsed(off) {
		t.Errorf("index of replica 1 still has %s used", res.ClusterIPs[0])
	}
}

func TestListPage(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/24", "fd00::/120"))
	ctx := etcdtest.Context(t)
	for i := range 10 {
		if _, err := a.Allocate(ctx, Request{Owner: owner(fmt.Sprint("l", i)), Policy: PreferDualStack,
			NodePortCount: 1}); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		rng  string
		want int
	}{{"", 31}, {"10.0.0.0/24", 11}, {"fd00::/120", 10}, {"30000-32767", 10}}
	for _, tc := range tests {
		seen := map[Item]bool{}
		tok := ""
		var rev int64
		for pages := 0; ; pages++ {
			page, err := a.ListPage(ctx, ListOptions{Range: tc.rng, PageSize: 4, PageToken: tok})
			if err != nil || len(page.Allocations) > 4 || pages > 20 {
				t.Fatalf("ListPage(%q, token %q) = %+v, %v", tc.rng, tok, page, err)
			}
			if rev != 0 && page.Revision != rev {
				t.Errorf("ListPage(%q) page at revision %d; want %d like the first", tc.rng, page.Revision,
					rev)
			}
			rev = page.Revision
			for _, al := range page.Allocations {
				if seen[al.Item] {
					t.Errorf("ListPage(%q) returned %s twice", tc.rng, al.Item)
				}
				seen[al.Item] = true
			}
			if tok = page.NextPageToken; tok == "" {
				break
			}
		}
		if len(seen) != tc.want {
			t.Errorf("ListPage(%q) listed %d; want %d", tc.rng, len(seen), tc.want)
		}
	}
	for _, lo := range []ListOptions{{PageToken: "garbage"}, {Range: "10.9.0.0/24"}, {PageSize: -1}} {
		if _, err := a.ListPage(ctx, lo); !errors.Is(err, ErrInvalid) {
			t.Errorf("ListPage(%+v) = %v; want ErrInvalid", lo, err)
		}
	}
	etcdtest.WaitFor(t, 10*time.Second, "the index to see every allocation",
		func() bool { return a.Free("30000-32767") == 2758 })
	ranges := a.Ranges()
	if len(ranges) != 3 || ranges[0].Used != 11 || ranges[0].Static.Used != 1 ||
		ranges[0].Dynamic.Used != 10 ||
		!ranges[0].Primary || ranges[2].Static.Last != Port(30085) {
		t.Errorf("Ranges() = %+v", ranges)
	}
}

func TestKubernetesNodePort(t *testing.T) {
	e := etcdtest.New(t)
	cfg := testConfig("10.0.0.0/24")
	cfg.KubernetesNodePort = 30443
	a := start(t, e.Client, cfg)
	ctx := etcdtest.Context(t)
	al, err := a.Get(ctx, Port(30443))
	if err != nil || al.Owner != KubernetesOwner || !a.IsReserved(Port(30443)) {
		t.Errorf("Get(30443) = %+v, %v; want reserved for %v", al, err, KubernetesOwner)
	}
	if _, err := a.Allocate(ctx, Request{Owner: owner("x"), NoClusterIP: true,
		NodePorts: []int{30443}}); !errors.Is(err, ErrAllocated) {
		t.Errorf("Allocate(30443) = %v; want ErrAllocated", err)
	}
}

// A watch that starts behind a compaction re-lists instead of missing changes.
func TestWatchAfterCompaction(t *testing.T) {
	e := etcdtest.New(t)
	cfg := testConfig("10.0.0.0/24")
	ctx := etcdtest.Context(t)
	idle, err := New(ctx, e.Client, cfg) // loaded, not running
	if err != nil {
		t.Fatal(err)
	}
	busy := start(t, e.NewClient(), cfg)
	for i := range 5 {
		if _, err := busy.Allocate(ctx, Request{Owner: owner(fmt.Sprint("c", i))}); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := e.Client.Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	// The index as loaded: empty (its own kubernetes reservation is still pending).
	if f := idle.Free("10.0.0.0/24"); f != 254 {
		t.Fatalf("Free before Run = %d; want 254", f)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- idle.Run(rctx) }()
	defer func() { cancel(); <-done }()
	etcdtest.WaitFor(t, 10*time.Second, "the re-list after the compaction",
		func() bool { return idle.Free("10.0.0.0/24") == 248 })
}

func TestList(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/24", "fd00::/120"))
	ctx := etcdtest.Context(t)
	want := map[Item]Owner{IP(a.kubernetesIP()): KubernetesOwner}
	for i := range 20 {
		o := owner(fmt.Sprint("u", i))
		if i == 3 {
			o.Name = `we"ird\name é` // escaped in the value: decoded by encoding/json
		}
		res, err := a.Allocate(ctx, Request{Owner: o, Policy: PreferDualStack, NodePortCount: i % 2})
		if err != nil {
			t.Fatalf("Allocate(%s) = %v", o.UID, err)
		}
		for _, ip := range res.ClusterIPs {
			want[IP(ip)] = o
		}
		for _, p := range res.NodePorts {
			want[Port(p)] = o
		}
	}
	// A value another writer spelled differently, and keys that are no allocations.
	foreign := IP(netip.MustParseAddr("10.0.0.200"))
	want[foreign] = Owner{Namespace: "x", Name: "y", UID: "z"}
	rec := `{ "uid": "z", "name": "y", "namespace": "x", "time": "2026-01-02T03:04:05+01:00" }`
	if _, err := e.Client.Put(ctx, a.key(foreign), rec); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{a.ipPrefix + "not-an-ip", a.ipPrefix + "192.168.0.1", a.portPrefix + "80"} {
		if _, err := e.Client.Put(ctx, k, "{}"); err != nil {
			t.Fatal(err)
		}
	}
	// RangeStream came with etcd 3.7: an older server (make etcd-matrix) answers it
	// Unimplemented, and List falls back to pages for good.
	stream := e.VersionAtLeast(3, 7)
	for _, paged := range []bool{false, true} {
		a.noStream.Store(paged)
		a.listPage = 7
		rev, all, err := a.List(ctx)
		if got, want := a.noStream.Load(), paged || !stream; got != want {
			t.Errorf("List() (paged %v) on etcd %s: listing in pages after = %v; want %v "+
				"(RangeStream since 3.7)", paged, e.Version(), got, want)
		}
		if err != nil || len(all) != len(want) {
			t.Fatalf("List() (paged %v) = %d allocations, %v; want %d", paged, len(all), err, len(want))
		}
		for _, al := range all {
			got, err := a.Get(ctx, al.Item)
			if err != nil || al != got || al.Owner != want[al.Item] || al.ModRevision > rev {
				t.Errorf("List() (paged %v) has %+v; want %+v (Get), owner %v, at most revision %d", paged,
					al, got, want[al.Item], rev)
			}
		}
	}
}

// TestSyncBesideAFutureWatch: another watch on the same client, opened from the
// revision after the current one (as every list-then-watch loop does), must not keep
// Sync from catching up with writes outside the item keys. etcd drops progress requests
// on a stream holding such a watch, so the index's watch has its own stream.
func TestSyncBesideAFutureWatch(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/24"))
	a.idx.syncTimeout = time.Second
	ctx := etcdtest.Context(t)
	if err := a.Sync(ctx); err != nil {
		t.Fatalf("Sync() = %v", err)
	}
	resp, err := e.Client.Put(ctx, "/elsewhere", "x")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	_ = e.Client.Watch(wctx, "/other/", clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	if err := a.Sync(ctx); err != nil {
		t.Fatalf("Sync() beside a watch from the next revision = %v", err)
	}
}

// A first page whose revision etcd compacts while it is read (between its reads of the
// address and the port keys) is read again at a new revision: the caller sent no token
// to blame. A token whose revision was compacted is the caller's INVALID_ARGUMENT.
func TestListPageCompactedMidway(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/24", "fd00::/120"))
	ctx := etcdtest.Context(t)
	for i := range 3 {
		if _, err := a.Allocate(ctx,
			Request{Owner: owner(fmt.Sprint("c", i)), NodePortCount: 1}); err != nil {
			t.Fatal(err)
		}
	}
	first, _ := a.ListPage(ctx, ListOptions{PageSize: 1})
	whole, err := a.ListPage(ctx, ListOptions{PageSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	compact := func() {
		put, err := e.Client.Put(ctx, "/unrelated", "x") // a revision past the page's
		if err == nil {
			_, err = e.Client.Compact(ctx, put.Header.Revision)
		}
		if err != nil {
			t.Error(err)
		}
	}
	reads := 0
	a.afterPageRead = func() {
		if reads++; reads == 1 {
			compact()
		}
	}
	page, err := a.ListPage(ctx, ListOptions{PageSize: 100})
	reads = 0
	for _, paged := range []bool{false, true} { // RangeStream, and pages (etcd before 3.7)
		a.noStream.Store(paged)
		reads = 0
		if _, all, err := a.List(ctx); err != nil || len(all) != len(whole.Allocations) {
			t.Errorf("List (paged %v) with a compaction between its reads = %d allocations, %v; want all %d",
				paged, len(all), err, len(whole.Allocations))
		}
	}
	a.afterPageRead = nil
	if err != nil || len(page.Allocations) != len(whole.Allocations) {
		t.Fatalf("ListPage with a compaction between its reads = %d allocations, %v; want all %d",
			len(page.Allocations), err, len(whole.Allocations))
	}
	_, err = a.ListPage(ctx, ListOptions{PageSize: 1, PageToken: first.NextPageToken})
	var inv *badrequest.Error
	if !errors.As(err, &inv) {
		t.Fatalf("ListPage with a compacted token = %v; want INVALID_ARGUMENT page_token", err)
	}
}
