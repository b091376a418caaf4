package repair_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/allocd/allocd/allocator"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	leaderpkg "github.com/allocd/allocd/leader"
	"github.com/allocd/allocd/repair"
)

// TestRepairClean is Kubernetes' TestRepair with nothing to repair: every item of the
// snapshot is allocated to its Service, for both allocators.
func TestRepairClean(t *testing.T) {
	r := newEnv(t, opts{ranges: []string{"192.168.1.0/24", "2000::/108"}})
	r.assign("uid-a", ip("192.168.1.2"), ip("2000::2"), port(30001))
	r.assign("uid-b", ip("192.168.1.3"), port(30002), port(30003))
	snap := []repair.Service{
		svc("uid-a", ips("192.168.1.2", "2000::2"), 30001),
		{Namespace: "ns", Name: "b", UID: "uid-b", ClusterIPs: ips("192.168.1.3"),
			NodePorts: []repair.NodePort{{Port: 30002, Protocol: "TCP"}}, HealthCheckNodePort: 30003},
		svc("uid-headless", ips("None")),
	}
	r.push(2, snap...)
	before := r.etcdRev()
	for i := range 3 {
		rep := r.pass(false)
		if got := summary(rep.Findings); len(got) != 0 {
			t.Errorf("pass %d: findings = %v; want none", i+1, got)
		}
	}
	if got := r.etcdRev(); got != before {
		t.Errorf("etcd revision after clean passes = %d; want %d (no writes)", got, before)
	}
	if st := r.status(); len(st.Candidates) != 0 || st.LastReport == nil || st.SnapshotRevision != 2 {
		t.Errorf("Status() = %d candidates, last report %v, snapshot %d; want 0, a report, 2",
			len(st.Candidates), st.LastReport, st.SnapshotRevision)
	}
}

// TestRepairNotAllocated is Kubernetes' TestRepair: items used by Services but not
// allocated are allocated to them.
func TestRepairNotAllocated(t *testing.T) { bothPaths(t, testRepairNotAllocated) }

func testRepairNotAllocated(t *testing.T, listFirst bool) {
	r := newEnv(t, opts{ranges: []string{"192.168.1.0/24", "2000::/108"}, listFirst: listFirst})
	r.push(1,
		svc("uid-a", ips("192.168.1.2", "2000::2"), 30001),
		repair.Service{Namespace: "ns", Name: "b", UID: "uid-b", ClusterIPs: ips("192.168.1.3"),
			HealthCheckNodePort: 30002},
	)
	rep := r.pass(false)
	want := sorted(
		"ClusterIPNotAllocated 192.168.1.2 uid-a repaired",
		"ClusterIPNotAllocated 2000::2 uid-a repaired",
		"PortNotAllocated 30001 uid-a repaired",
		"ClusterIPNotAllocated 192.168.1.3 uid-b repaired",
		"PortNotAllocated 30002 uid-b repaired",
	)
	if got := summary(rep.Findings); !slices.Equal(got, want) {
		t.Errorf("findings = %q; want %q", got, want)
	}
	for it, uid := range map[allocator.Item]string{
		ip("192.168.1.2"): "uid-a", ip("2000::2"): "uid-a", port(30001): "uid-a",
		ip("192.168.1.3"): "uid-b", port(30002): "uid-b",
	} {
		if got := r.holder(it); got != uid {
			t.Errorf("holder(%v) = %q; want %q", it, got, uid)
		}
	}
	if got := summary(r.pass(false).Findings); len(got) != 0 {
		t.Errorf("second pass findings = %v; want none", got)
	}
}

// TestRepairLeak is Kubernetes' TestRepairLeak (and its dual-stack and port copies):
// an allocation no Service uses is held for LeakStrikes-1 passes and released on the
// last.
func TestRepairLeak(t *testing.T) {
	for _, tc := range []struct {
		name string
		item allocator.Item
	}{
		{"ipv4", ip("192.168.1.10")},
		{"ipv6", ip("2000::10")},
		{"nodeport", port(30010)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const strikes = 3
			r := newEnv(t, opts{ranges: []string{"192.168.1.0/24", "2000::/108"}, strikes: strikes})
			r.assign("uid-leak", tc.item)
			r.assign("uid-a", ip("192.168.1.2"))
			r.push(1, svc("uid-a", ips("192.168.1.2")))
			for i := 1; i < strikes; i++ {
				rep := r.pass(false)
				if got, want := rep.Counts[repair.LeakSuspected], int64(1); got != want {
					t.Errorf("pass %d: LeakSuspected count = %d; want %d", i, got, want)
				}
				if got := r.holder(tc.item); got != "uid-leak" {
					t.Fatalf("pass %d: holder(%v) = %q; want uid-leak (not released before %d passes)", i,
						tc.item, got, strikes)
				}
				if s, left := r.strikes(tc.item); s != i || left != strikes-i {
					t.Errorf("pass %d: strikes of %v = %d, %d left; want %d, %d left", i, tc.item, s, left, i,
						strikes-i)
				}
			}
			rep := r.pass(false)
			want := []string{"LeakReleased " + tc.item.String() + " uid-leak repaired"}
			if got := summary(rep.Findings); !slices.Equal(got, want) {
				t.Errorf("pass %d findings = %q; want %q", strikes, got, want)
			}
			if got := r.holder(tc.item); got != "" {
				t.Errorf("holder(%v) after %d passes = %q; want free", tc.item, strikes, got)
			}
			if s, _ := r.strikes(tc.item); s != -1 {
				t.Errorf("released %v still a candidate with %d strikes", tc.item, s)
			}
			if got := r.holder(ip("192.168.1.2")); got != "uid-a" {
				t.Errorf("holder(192.168.1.2) = %q; want uid-a", got)
			}
			rng := "192.168.1.0/24"
			switch {
			case tc.item.Kind == allocator.KindNodePort:
				rng = "30000-32767"
			case tc.item.Addr.Is6():
				rng = "2000::/108"
			}
			if got := metric(t, r, "allocd_repair_findings_total", "range="+rng,
				"reason=LeakSuspected"); got != strikes-1 {
				t.Errorf("allocd_repair_findings_total{range=%q,reason=LeakSuspected} = %v; want %d", rng,
					got, strikes-1)
			}
		})
	}
}

// TestRepairWithExisting is Kubernetes' TestRepairWithExisting for ClusterIPs:
// duplicates, out-of-range, invalid and headless Services among good ones.
func TestRepairWithExisting(t *testing.T) { bothPaths(t, testRepairWithExisting) }

func testRepairWithExisting(t *testing.T, listFirst bool) {
	r := newEnv(t, opts{listFirst: listFirst})
	r.assign("uid-a", ip("192.168.1.2"))
	r.assign("uid-b", ip("192.168.1.100"))
	r.assign("uid-gone", ip("192.168.1.4"))
	r.assign("uid-leak", ip("192.168.1.5"))
	r.push(1,
		svc("uid-dup", ips("192.168.1.2")), // before its holder: the holder still wins
		svc("uid-a", ips("192.168.1.2")),
		svc("uid-b", ips("192.168.1.100")),
		svc("uid-out", ips("192.168.2.1")),
		svc("uid-network", ips("192.168.1.0")),
		svc("uid-broadcast", ips("192.168.1.255")),
		svc("uid-headless", ips("None")),
		svc("uid-empty", ips("")),
		svc("uid-none", nil),
		svc("uid-invalid", ips("300.1.1.1")),
		svc("uid-zone", ips("fe80::1%eth0")),
		svc("uid-nofamily", ips("2000::1")), // no IPv6 range configured
		svc("uid-kube", ips("192.168.1.1")), // the kubernetes address
		repair.Service{Namespace: "default", Name: "kubernetes", UID: "real-kubernetes-uid",
			ClusterIPs: ips("192.168.1.1")},
		svc("uid-notalloc", ips("192.168.1.3")),
		svc("uid-wrong", ips("192.168.1.4")),
		svc("uid-twice", ips("192.168.1.6", "192.168.1.6")),
	)
	rep := r.pass(false)
	want := sorted(
		"ClusterIPAlreadyAllocated 192.168.1.2 uid-dup",
		"ClusterIPOutOfRange 192.168.2.1 uid-out",
		"ClusterIPOutOfRange 192.168.1.0 uid-network",
		"ClusterIPOutOfRange 192.168.1.255 uid-broadcast",
		"ClusterIPNotValid 300.1.1.1 uid-invalid",
		"ClusterIPNotValid fe80::1%eth0 uid-zone",
		"ClusterIPNotValid 2000::1 uid-nofamily",
		"ClusterIPAlreadyAllocated 192.168.1.1 uid-kube",
		"ClusterIPNotAllocated 192.168.1.3 uid-notalloc repaired",
		"ClusterIPWrongOwner 192.168.1.4 uid-wrong repaired",
		"ClusterIPNotAllocated 192.168.1.6 uid-twice repaired",
		"LeakSuspected 192.168.1.5 uid-leak",
	)
	if got := summary(rep.Findings); !slices.Equal(got, want) {
		t.Errorf("findings =\n%q\nwant\n%q", got, want)
	}
	for it, uid := range map[allocator.Item]string{
		ip("192.168.1.1"):   allocator.KubernetesOwner.UID,
		ip("192.168.1.2"):   "uid-a",
		ip("192.168.1.100"): "uid-b",
		ip("192.168.1.3"):   "uid-notalloc",
		ip("192.168.1.4"):   "uid-wrong",
		ip("192.168.1.5"):   "uid-leak",
		ip("192.168.1.6"):   "uid-twice",
	} {
		if got := r.holder(it); got != uid {
			t.Errorf("holder(%v) = %q; want %q", it, got, uid)
		}
	}
	etcdtest.WaitFor(t, 10*time.Second, "Free(192.168.1.0/24) = 254-7",
		func() bool { return r.alloc.Free("192.168.1.0/24") == 254-7 })
}

// TestRepairPortsWithExisting is the NodePort copy: duplicates, out of range, the same
// port under two protocols and as health check node port, the kubernetes node port.
func TestRepairPortsWithExisting(t *testing.T) { bothPaths(t, testRepairPortsWithExisting) }

func testRepairPortsWithExisting(t *testing.T, listFirst bool) {
	r := newEnv(t, opts{kubeNodePort: 30000, listFirst: listFirst})
	r.assign("uid-a", port(30001))
	r.assign("uid-gone", port(30005))
	r.assign("uid-leak", port(30006))
	r.assign("uid-hc", port(30002))
	r.push(1,
		repair.Service{Namespace: "ns", Name: "a", UID: "uid-a", NodePorts: []repair.NodePort{
			{Port: 30001, Protocol: "TCP"}, {Port: 30001, Protocol: "UDP"}}},
		repair.Service{Namespace: "ns", Name: "hc", UID: "uid-hc", NodePorts: []repair.NodePort{
			{Port: 30002, Protocol: "TCP"}}, HealthCheckNodePort: 30003},
		repair.Service{Namespace: "ns", Name: "hcsame", UID: "uid-hcsame", NodePorts: []repair.NodePort{
			{Port: 30004, Protocol: "SCTP"}}, HealthCheckNodePort: 30004},
		svc("uid-dup", nil, 30001),
		svc("uid-low", nil, 111),
		svc("uid-high", nil, 40000),
		svc("uid-negative", nil, -5),
		repair.Service{Namespace: "ns", Name: "wrong", UID: "uid-wrong", NodePorts: []repair.NodePort{
			{Port: 30005, Protocol: "TCP"}, {Port: 30005, Protocol: "UDP"}}},
		svc("uid-kube", nil, 30000),
		svc("uid-zero", nil, 0),
	)
	rep := r.pass(false)
	want := sorted(
		"PortAlreadyAllocated 30001 uid-dup",
		"PortNotAllocated 30003 uid-hc repaired",
		"PortNotAllocated 30004 uid-hcsame repaired",
		"PortOutOfRange 111 uid-low",
		"PortOutOfRange 40000 uid-high",
		"PortOutOfRange -5 uid-negative",
		"PortWrongOwner 30005 uid-wrong repaired",
		"PortAlreadyAllocated 30000 uid-kube",
		"LeakSuspected 30006 uid-leak",
	)
	if got := summary(rep.Findings); !slices.Equal(got, want) {
		t.Errorf("findings =\n%q\nwant\n%q", got, want)
	}
	for it, uid := range map[allocator.Item]string{
		port(30000): allocator.KubernetesOwner.UID,
		port(30001): "uid-a",
		port(30002): "uid-hc",
		port(30003): "uid-hc",
		port(30004): "uid-hcsame",
		port(30005): "uid-wrong",
		port(30006): "uid-leak",
	} {
		if got := r.holder(it); got != uid {
			t.Errorf("holder(%v) = %q; want %q", it, got, uid)
		}
	}
}

// TestRepairDualStack is the dual-stack copy of TestRepairWithExisting, with a leak in
// each family.
func TestRepairDualStack(t *testing.T) { bothPaths(t, testRepairDualStack) }

func testRepairDualStack(t *testing.T, listFirst bool) {
	r := newEnv(t, opts{ranges: []string{"2000::/108", "192.168.1.0/24"}, strikes: 2, listFirst: listFirst})
	r.assign("uid-a", ip("192.168.1.2"), ip("2000::2"))
	r.assign("uid-leak", ip("192.168.1.10"), ip("2000::10"))
	r.push(1,
		svc("uid-a", ips("2000::2", "192.168.1.2")),
		svc("uid-dup", ips("192.168.1.2", "2000::3")),
		svc("uid-out", ips("2001::1", "10.0.0.1")),
		svc("uid-v6only", ips("2000::4")),
		svc("uid-headless", ips("None", "None")),
	)
	want1 := sorted(
		"ClusterIPAlreadyAllocated 192.168.1.2 uid-dup",
		"ClusterIPNotAllocated 2000::3 uid-dup repaired",
		"ClusterIPOutOfRange 2001::1 uid-out",
		"ClusterIPOutOfRange 10.0.0.1 uid-out",
		"ClusterIPNotAllocated 2000::4 uid-v6only repaired",
		"LeakSuspected 192.168.1.10 uid-leak",
		"LeakSuspected 2000::10 uid-leak",
	)
	if got := summary(r.pass(false).Findings); !slices.Equal(got, want1) {
		t.Errorf("pass 1 findings =\n%q\nwant\n%q", got, want1)
	}
	want2 := sorted(
		"ClusterIPAlreadyAllocated 192.168.1.2 uid-dup",
		"ClusterIPOutOfRange 2001::1 uid-out",
		"ClusterIPOutOfRange 10.0.0.1 uid-out",
		"LeakReleased 192.168.1.10 uid-leak repaired",
		"LeakReleased 2000::10 uid-leak repaired",
	)
	if got := summary(r.pass(false).Findings); !slices.Equal(got, want2) {
		t.Errorf("pass 2 findings =\n%q\nwant\n%q", got, want2)
	}
	for it, uid := range map[allocator.Item]string{
		ip("2000::1"): allocator.KubernetesOwner.UID, // the primary range is IPv6
		ip("2000::2"): "uid-a", ip("192.168.1.2"): "uid-a",
		ip("2000::3"): "uid-dup", ip("2000::4"): "uid-v6only",
		ip("192.168.1.10"): "", ip("2000::10"): "",
	} {
		if got := r.holder(it); got != uid {
			t.Errorf("holder(%v) = %q; want %q", it, got, uid)
		}
	}
}

// TestRepairAllocatedAfterSnapshot: an allocation committed after the snapshot was
// received is never judged by passes over that snapshot (#8295), nor corrected.
func TestRepairAllocatedAfterSnapshot(t *testing.T) { bothPaths(t, testRepairAllocatedAfterSnapshot) }

func testRepairAllocatedAfterSnapshot(t *testing.T, listFirst bool) {
	r := newEnv(t, opts{strikes: 2, listFirst: listFirst})
	old := r.assign("uid-b", ip("192.168.1.7"))[0]
	r.push(1, svc("uid-a", nil), svc("uid-b", ips("192.168.1.7")))
	// The shim allocated these after it took the snapshot: a new Service, and the
	// address of a Service deleted since (uid-b) given to another.
	r.assign("uid-new", ip("192.168.1.8"), port(30008))
	if ok, err := r.alloc.ReleaseIf(context.Background(), old); !ok || err != nil {
		t.Fatalf("ReleaseIf(%v) = %v, %v; want true, nil", old.Item, ok, err)
	}
	r.assign("uid-c", ip("192.168.1.7"))
	for i := 1; i <= 5; i++ {
		rep := r.pass(false)
		want := []string{"ClusterIPWrongOwner 192.168.1.7 uid-b"}
		if got := summary(rep.Findings); !slices.Equal(got, want) {
			t.Errorf("pass %d findings = %q; want %q", i, got, want)
		}
	}
	for it, uid := range map[allocator.Item]string{
		ip("192.168.1.8"): "uid-new", port(30008): "uid-new", ip("192.168.1.7"): "uid-c",
	} {
		if got := r.holder(it); got != uid {
			t.Errorf("holder(%v) after 5 passes = %q; want %q", it, got, uid)
		}
	}
	if st := r.status(); len(st.Candidates) != 0 {
		t.Errorf("Status().Candidates = %v; want none", st.Candidates)
	}
	// A newer snapshot still without them judges them.
	r.push(2, svc("uid-a", nil))
	if got := r.pass(false).Counts[repair.LeakSuspected]; got != 3 {
		t.Errorf("LeakSuspected after a newer snapshot = %d; want 3", got)
	}
}

// raceStore is the real allocator with a hook run just before ReleaseIf, to make a
// concurrent re-allocation happen inside a pass.
type raceStore struct {
	*allocator.Allocator
	beforeRelease func(allocator.Allocation)
}

func (s *raceStore) ReleaseIf(ctx context.Context, al allocator.Allocation) (bool, error) {
	if s.beforeRelease != nil {
		s.beforeRelease(al)
	}
	return s.Allocator.ReleaseIf(ctx, al)
}

// TestRepairLeakReallocated: a leak re-allocated between two passes, or between the
// pass's read and its release, is never freed.
func TestRepairLeakReallocated(t *testing.T) {
	t.Run("between passes", func(t *testing.T) {
		r := newEnv(t, opts{strikes: 3})
		al := r.assign("uid-leak", ip("192.168.1.10"))[0]
		r.push(1)
		r.pass(false)
		r.pass(false)
		if ok, err := r.alloc.ReleaseIf(context.Background(), al); !ok || err != nil {
			t.Fatalf("ReleaseIf = %v, %v; want true, nil", ok, err)
		}
		r.assign("uid-new", ip("192.168.1.10"))
		r.push(2) // newer, still without uid-new: it is judged, from strike 1
		rep := r.pass(false)
		got, want := summary(rep.Findings), []string{"LeakSuspected 192.168.1.10 uid-new"}
		if !slices.Equal(got, want) {
			t.Errorf("findings = %q; want %q", got, want)
		}
		if s, _ := r.strikes(ip("192.168.1.10")); s != 1 {
			t.Errorf("strikes of the re-made allocation = %d; want 1", s)
		}
		if got := r.holder(ip("192.168.1.10")); got != "uid-new" {
			t.Errorf("holder = %q; want uid-new", got)
		}
	})
	t.Run("during the pass", func(t *testing.T) {
		var rs *raceStore
		r := newEnv(t, opts{strikes: 1, wrap: func(a *allocator.Allocator) repair.Store {
			rs = &raceStore{Allocator: a}
			return rs
		}})
		r.assign("uid-leak", ip("192.168.1.10"))
		r.push(1)
		rs.beforeRelease = func(al allocator.Allocation) {
			if _, err := r.alloc.Reassign(context.Background(), al, owner("uid-new")); err != nil {
				t.Errorf("Reassign = %v", err)
			}
		}
		rep := r.pass(false)
		got, want := summary(rep.Findings), []string{"LeakSuspected 192.168.1.10 uid-leak"}
		if !slices.Equal(got, want) {
			t.Errorf("findings = %q; want %q", got, want)
		}
		if got := r.holder(ip("192.168.1.10")); got != "uid-new" {
			t.Errorf("holder = %q; want uid-new (the conditional delete must not free it)", got)
		}
	})
}

// TestRepairDryRun: a dry run reports what a pass would do and writes nothing,
// strikes included.
func TestRepairDryRun(t *testing.T) { bothPaths(t, testRepairDryRun) }

func testRepairDryRun(t *testing.T, listFirst bool) {
	r := newEnv(t, opts{strikes: 2, listFirst: listFirst})
	r.assign("uid-gone", ip("192.168.1.4"))
	r.assign("uid-leak", ip("192.168.1.5"))
	r.push(1, svc("uid-notalloc", ips("192.168.1.3")), svc("uid-wrong", ips("192.168.1.4")))
	r.pass(false) // strike 1 of 2, and the repairs
	r.assign("uid-gone2", ip("192.168.1.6"))
	r.push(2, svc("uid-notalloc", ips("192.168.1.3")), svc("uid-wrong", ips("192.168.1.4")),
		svc("uid-x", ips("192.168.1.7")), svc("uid-y", ips("192.168.1.6")))
	before := r.etcdRev()
	last := r.status().LastReport
	for range 3 {
		rep := r.pass(true)
		want := sorted(
			"ClusterIPNotAllocated 192.168.1.7 uid-x",
			"ClusterIPWrongOwner 192.168.1.6 uid-y",
			"LeakReleased 192.168.1.5 uid-leak",
		)
		if got := summary(rep.Findings); !slices.Equal(got, want) || !rep.DryRun {
			t.Errorf("dry run findings = %q (dry run %v); want %q (true)", got, rep.DryRun, want)
		}
	}
	if got := r.etcdRev(); got != before {
		t.Errorf("etcd revision after dry runs = %d; want %d", got, before)
	}
	if s, _ := r.strikes(ip("192.168.1.5")); s != 1 {
		t.Errorf("strikes after dry runs = %d; want 1", s)
	}
	if st := r.status(); st.LastReport != last {
		t.Errorf("a dry run replaced the last report")
	}
	if got := summary(r.pass(false).Findings); !slices.Contains(got,
		"LeakReleased 192.168.1.5 uid-leak repaired") {
		t.Errorf("real pass after dry runs = %q; want the leak released", got)
	}
}

// TestRepairLeakGrace: a leak younger than the grace when the snapshot was received is
// kept however many passes judge it.
func TestRepairLeakGrace(t *testing.T) {
	r := newEnv(t, opts{strikes: 2, grace: time.Hour})
	r.assign("uid-leak", port(30100))
	r.push(1)
	for i := 1; i <= 4; i++ {
		rep := r.pass(false)
		if got, want := summary(rep.Findings), []string{"LeakSuspected 30100 uid-leak"}; !slices.Equal(got,
			want) {
			t.Errorf("pass %d findings = %q; want %q", i, got, want)
		}
	}
	if s, left := r.strikes(port(30100)); s != 2 || left != 0 {
		t.Errorf("strikes = %d, %d left; want 2, 0", s, left)
	}
	if got := r.holder(port(30100)); got != "uid-leak" {
		t.Errorf("holder = %q; want uid-leak", got)
	}
}

// TestRepairLeakGraceEnds: the grace runs on the controller's clock, from the
// allocation to the receipt of the judging snapshot: a leak is kept while snapshots
// are received less than the grace after it was allocated, and released by the first
// pass over one received at the grace.
func TestRepairLeakGraceEnds(t *testing.T) {
	// Wall times only (Round(0) drops the monotonic reading): the pass measures the
	// age from the time stored in etcd, which has none.
	clock := clockwork.NewFakeClockAt(time.Now().Round(0))
	r := newEnv(t, opts{strikes: 2, grace: time.Hour, clock: clock})
	allocated := r.assign("uid-leak", port(30100))[0].AllocateTime.Round(0)
	kept := []string{"LeakSuspected 30100 uid-leak"}
	for i, at := range []time.Duration{0, time.Hour - time.Millisecond, time.Hour} {
		clock.Advance(allocated.Add(at).Sub(clock.Now()))
		r.push(int64(i + 1))
		rep := r.pass(false)
		if at < time.Hour {
			rep = r.pass(false) // the last strike too
		}
		want := kept
		if at == time.Hour {
			want = []string{"LeakReleased 30100 uid-leak repaired"}
		}
		if got := summary(rep.Findings); !slices.Equal(got, want) {
			t.Errorf("pass over a snapshot received %v after the allocation = %q; want %q", at, got, want)
		}
	}
	if got := r.holder(port(30100)); got != "" {
		t.Errorf("holder = %q; want none", got)
	}
}

// TestRepairPassesEveryInterval: while leading, a pass runs every Interval of the
// controller's clock, and none in between.
func TestRepairPassesEveryInterval(t *testing.T) {
	clock := clockwork.NewFakeClock()
	r := newEnv(t, opts{interval: time.Minute, clock: clock})
	r.push(1)
	passes := func() float64 { return metric(t, r, "allocd_repair_passes_total", "result=ok") }
	for i := 1; i <= 3; i++ {
		if err := clock.BlockUntilContext(etcdtest.Context(t), 1); err != nil { // the ticker
			t.Fatal(err)
		}
		clock.Advance(time.Minute - time.Millisecond)
		if got := passes(); got != float64(i-1) {
			t.Fatalf("passes before interval %d ended = %v; want %d", i, got, i-1)
		}
		clock.Advance(time.Millisecond)
		etcdtest.WaitFor(t, 10*time.Second, fmt.Sprintf("pass %d", i),
			func() bool { return passes() == float64(i) })
	}
}

// TestRepairCandidateReappears: a candidate that appears in a Service loses its strikes.
func TestRepairCandidateReappears(t *testing.T) {
	r := newEnv(t, opts{strikes: 3})
	r.assign("uid-a", ip("192.168.1.9"))
	r.push(1)
	r.pass(false)
	r.pass(false)
	r.push(2, svc("uid-a", ips("192.168.1.9")))
	if got := summary(r.pass(false).Findings); len(got) != 0 {
		t.Errorf("findings with the Service back = %q; want none", got)
	}
	r.push(3)
	r.pass(false)
	r.pass(false)
	if s, _ := r.strikes(ip("192.168.1.9")); s != 2 {
		t.Errorf("strikes = %d; want 2 (counted again from zero)", s)
	}
	if got := r.holder(ip("192.168.1.9")); got != "uid-a" {
		t.Errorf("holder = %q; want uid-a", got)
	}
}

// TestRepairTwoReplicas: two replicas (own clients, own allocators) on one etcd: one
// leads and runs passes, the other refuses naming it, and takes over when it resigns.
func TestRepairTwoReplicas(t *testing.T) {
	e := etcdtest.New(t)
	file := writeSnapshotFile(t, `{"revision": "1", "services": []}`)
	o := opts{file: file, interval: 20 * time.Millisecond}
	r1 := newReplica(t, e.Client, o, "replica-1")
	r2 := newReplica(t, e.NewClient(), o, "replica-2")
	etcdtest.WaitFor(t, 10*time.Second, "a leader",
		func() bool { return r1.ctl.IsLeader() || r2.ctl.IsLeader() })
	leader, follower := r1, r2
	if r2.ctl.IsLeader() {
		leader, follower = r2, r1
	}
	passes := func(r *replica) float64 {
		return metric(t, r, "allocd_repair_passes_total", "result=ok")
	}
	etcdtest.WaitFor(t, 10*time.Second, "3 passes on the leader", func() bool { return passes(leader) >= 3 })
	if follower.ctl.IsLeader() {
		t.Fatalf("both replicas lead")
	}
	if got := passes(follower); got != 0 {
		t.Errorf("passes on the follower = %v; want 0", got)
	}
	if st := follower.status(); st.LastReport != nil || st.Leader != leader.id || st.Leading {
		t.Errorf("follower Status() = last report %v, leader %q, leading %v; want nil, %q, false",
			st.LastReport, st.Leader, st.Leading, leader.id)
	}
	_, err := follower.ctl.RunRepair(context.Background(), false)
	var nl *leaderpkg.NotLeaderError
	if !errors.As(err, &nl) || nl.Leader != leader.id {
		t.Errorf("follower RunRepair() = %v; want a NotLeaderError naming %s", err, leader.id)
	}

	leader.stop() // resigns
	follower.waitLeader()
	etcdtest.WaitFor(t, 10*time.Second, "passes on the new leader",
		func() bool { return passes(follower) >= 1 })
	if st := follower.status(); st.Leader != follower.id || !st.Leading {
		t.Errorf("new leader Status() = leader %q, leading %v; want %q, true", st.Leader, st.Leading,
			follower.id)
	}
}

// TestRepairFirstPassWhenElected: with a snapshot file, the leader runs a first pass
// as soon as it is elected.
func TestRepairFirstPassWhenElected(t *testing.T) {
	file := writeSnapshotFile(t, `{"revision": "4", "services": [
		{"namespace": "ns", "name": "a", "uid": "uid-a", "clusterIps": ["192.168.1.2"]}]}`)
	r := newEnv(t, opts{file: file})
	etcdtest.WaitFor(t, 10*time.Second, "the first pass", func() bool { return r.status().LastReport != nil })
	if got := r.holder(ip("192.168.1.2")); got != "uid-a" {
		t.Errorf("holder(192.168.1.2) = %q; want uid-a", got)
	}
	if got := r.status().SnapshotRevision; got != 4 {
		t.Errorf("SnapshotRevision = %d; want 4", got)
	}
}

// metric returns the value of a counter or gauge of r's registry with the given
// "name=value" labels, 0 when absent.
func metric(t *testing.T, r *replica, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatalf("Gather() = %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var have []string
			for _, l := range m.GetLabel() {
				have = append(have, l.GetName()+"="+l.GetValue())
			}
			if !slices.Equal(have, sorted(labels...)) {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

func writeSnapshotFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "services.json")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
