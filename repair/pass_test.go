package repair_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/allocator"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	"github.com/allocd/allocd/repair"
)

// hookStore is the real allocator with hooks run before ListExcept, Assign, Reassign and
// ReleaseIf, to make things happen inside a pass. A hook that returns an error fails
// the call with it.
type hookStore struct {
	*allocator.Allocator
	beforeList     func(ctx context.Context) error
	beforeAssign   func(allocator.Owner, allocator.Item) error
	beforeReassign func(allocator.Allocation, allocator.Owner) error
	beforeRelease  func(allocator.Allocation) error
}

func (s *hookStore) ListExcept(ctx context.Context, claims []allocator.Claim, held []bool) (
	int64, []allocator.Allocation, error) {
	if s.beforeList != nil {
		if err := s.beforeList(ctx); err != nil {
			return 0, nil, err
		}
	}
	return s.Allocator.ListExcept(ctx, claims, held)
}

func (s *hookStore) Assign(ctx context.Context, o allocator.Owner,
	it allocator.Item) (allocator.Allocation, error) {
	if s.beforeAssign != nil {
		if err := s.beforeAssign(o, it); err != nil {
			return allocator.Allocation{}, err
		}
	}
	return s.Allocator.Assign(ctx, o, it)
}

func (s *hookStore) Reassign(ctx context.Context, al allocator.Allocation,
	to allocator.Owner) (allocator.Allocation, error) {
	if s.beforeReassign != nil {
		if err := s.beforeReassign(al, to); err != nil {
			return allocator.Allocation{}, err
		}
	}
	return s.Allocator.Reassign(ctx, al, to)
}

func (s *hookStore) ReleaseIf(ctx context.Context, al allocator.Allocation) (bool, error) {
	if s.beforeRelease != nil {
		if err := s.beforeRelease(al); err != nil {
			return false, err
		}
	}
	return s.Allocator.ReleaseIf(ctx, al)
}

func hooked(hs **hookStore) func(*allocator.Allocator) repair.Store {
	return func(a *allocator.Allocator) repair.Store {
		*hs = &hookStore{Allocator: a}
		return *hs
	}
}

// kubeSvc is the kubernetes Service as an API server lists it (its own uid, not the
// uid of allocator.KubernetesOwner).
func kubeSvc(ips []string, ports ...int) repair.Service {
	s := repair.Service{Namespace: "default", Name: "kubernetes", UID: "kube-uid", ClusterIPs: ips}
	for _, p := range ports {
		s.NodePorts = append(s.NodePorts, repair.NodePort{Port: p, Protocol: "TCP"})
	}
	return s
}

// TestRepairReserved: the address and node port reserved for the kubernetes Service
// are allocated to it again once freed, and given back to it from an owner no Service
// uses; another Service using them is only reported.
func TestRepairReserved(t *testing.T) {
	const kubePort = 30443
	for _, tc := range []struct {
		name  string
		item  allocator.Item
		snap  []repair.Service
		taker string // "" or the uid that takes the item after it is freed, before the snapshot
		dry   bool
		want  []string
		// holder of the item after the pass ("default/kubernetes" or taker or "").
		holder string
	}{
		{"address freed", ip("192.168.1.1"), []repair.Service{kubeSvc(ips("192.168.1.1"))}, "", false,
			[]string{"ClusterIPNotAllocated 192.168.1.1 kube-uid repaired"}, allocator.KubernetesOwner.UID},
		{"node port freed", port(kubePort), []repair.Service{kubeSvc(ips("192.168.1.1"), kubePort)}, "",
			false,
			[]string{"PortNotAllocated 30443 kube-uid repaired"}, allocator.KubernetesOwner.UID},
		{"address freed, dry run", ip("192.168.1.1"), []repair.Service{kubeSvc(ips("192.168.1.1"))}, "", true,
			[]string{"ClusterIPNotAllocated 192.168.1.1 kube-uid"}, ""},
		{"address freed, also used by another Service", ip("192.168.1.1"),
			[]repair.Service{kubeSvc(ips("192.168.1.1")), svc("uid-b", ips("192.168.1.1"))}, "", false,
			[]string{"ClusterIPAlreadyAllocated 192.168.1.1 uid-b",
				"ClusterIPNotAllocated 192.168.1.1 kube-uid repaired"},
			allocator.KubernetesOwner.UID},
		{"address taken by a gone owner", ip("192.168.1.1"), []repair.Service{kubeSvc(ips("192.168.1.1"))},
			"uid-gone", false,
			[]string{"ClusterIPWrongOwner 192.168.1.1 kube-uid repaired"}, allocator.KubernetesOwner.UID},
		{"address taken by a Service of the snapshot", ip("192.168.1.1"),
			[]repair.Service{kubeSvc(ips("192.168.1.1")), svc("uid-b", ips("192.168.1.1"))}, "uid-b", false,
			[]string{"ClusterIPAlreadyAllocated 192.168.1.1 uid-b"}, "uid-b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newEnv(t, opts{kubeNodePort: kubePort})
			ctx := context.Background()
			if got := r.holder(tc.item); got != allocator.KubernetesOwner.UID {
				t.Fatalf("holder(%v) at start = %q; want %q", tc.item, got, allocator.KubernetesOwner.UID)
			}
			if _, _, err := r.alloc.Release(ctx, allocator.Owner{}, []allocator.Item{tc.item},
				true); err != nil {
				t.Fatalf("Release(%v, force) = %v", tc.item, err)
			}
			if tc.taker != "" {
				r.assign(tc.taker, tc.item)
			}
			r.push(1, tc.snap...)
			rep := r.pass(tc.dry)
			if got := summary(rep.Findings); !slices.Equal(got, sorted(tc.want...)) {
				t.Errorf("findings = %q; want %q", got, sorted(tc.want...))
			}
			if got := r.holder(tc.item); got != tc.holder {
				t.Errorf("holder(%v) after the pass = %q; want %q", tc.item, got, tc.holder)
			}
			if tc.holder != allocator.KubernetesOwner.UID {
				return
			}
			req := allocator.Request{Owner: owner("uid-other")}
			if tc.item.Kind == allocator.KindClusterIP {
				req.ClusterIPs = []netip.Addr{tc.item.Addr}
			} else {
				req.NodePorts = []int{tc.item.Port}
			}
			var ae *allocator.AllocatedError
			if _, err := r.alloc.Allocate(ctx, req); !errors.As(err, &ae) {
				t.Errorf("Allocate(uid-other, %v) after the pass = %v; want an AllocatedError", tc.item, err)
			}
			if got := summary(r.pass(false).Findings); !slices.Equal(got,
				sorted(tc.want[:len(tc.want)-1]...)) {
				t.Errorf("second pass findings = %q; want %q", got, tc.want[:len(tc.want)-1])
			}
		})
	}
}

// TestRepairUnrepairable: a Service that cannot be repaired is a finding not repaired
// and the pass goes on: the other Services are repaired and leaks are released.
func TestRepairUnrepairable(t *testing.T) {
	many := make([]int, allocator.MaxItems+1) // one more than an owner may hold
	for i := range many {
		many[i] = 30100 + i
	}
	for _, tc := range []struct {
		name string
		snap []repair.Service
		fail allocator.Item // Assign of it fails through the hook; zero Item for none
		want []string       // the findings not repaired
	}{
		{"owner would hold too many items",
			[]repair.Service{svc("uid-big", nil, many...), svc("uid-a", ips("192.168.1.2"))},
			allocator.Item{}, []string{fmt.Sprintf("PortNotAllocated %d uid-big", many[len(many)-1])}},
		{"contention outlasts the retries",
			[]repair.Service{svc("uid-c", ips("192.168.1.3")), svc("uid-a", ips("192.168.1.2"))},
			ip("192.168.1.3"), []string{"ClusterIPNotAllocated 192.168.1.3 uid-c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hs *hookStore
			r := newEnv(t, opts{strikes: 1, wrap: hooked(&hs)})
			hs.beforeAssign = func(_ allocator.Owner, it allocator.Item) error {
				if it == tc.fail {
					return fmt.Errorf("assign %v: %w", it, allocator.ErrConflict)
				}
				return nil
			}
			r.assign("uid-leak", ip("192.168.1.50"))
			r.push(1, tc.snap...)
			rep, err := r.ctl.RunRepair(context.Background(), false)
			if err != nil || rep.Err != nil {
				t.Fatalf("RunRepair() = report error %v, %v; want a complete pass", rep.Err, err)
			}
			var notRepaired []string
			for _, f := range rep.Findings {
				if !f.Repaired {
					notRepaired = append(notRepaired, summary([]repair.Finding{f})...)
				}
			}
			if !slices.Equal(notRepaired, tc.want) {
				t.Errorf("findings not repaired = %q; want %q", notRepaired, tc.want)
			}
			if got := r.holder(ip("192.168.1.50")); got != "" {
				t.Errorf("holder(192.168.1.50) = %q; want free (a leak with 1 strike is released)", got)
			}
			if got := r.holder(ip("192.168.1.2")); got != "uid-a" {
				t.Errorf("holder(192.168.1.2) = %q; want uid-a (repaired after the failure)", got)
			}
		})
	}
}

// run starts r's controller (the replica must be built with noRun) and waits until
// it leads; the returned func stops it and waits for Run to return.
func run(t *testing.T, r *replica) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.el.Run(ctx, r.ctl.Lead); err != nil {
			t.Errorf("%s Run: %v", r.id, err)
		}
	}()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	etcdtest.WaitFor(t, 10*time.Second, r.id+" to lead", r.ctl.IsLeader)
	return stop
}

// TestRepairStrikesPerTerm: a replica that leads again counts strikes from zero, not
// from where its earlier term left them.
func TestRepairStrikesPerTerm(t *testing.T) {
	e := etcdtest.New(t)
	r0 := newReplica(t, e.Client, opts{noRun: true}, "replica-0")
	r1 := newReplica(t, e.Client, opts{noRun: true}, "replica-1")
	x := ip("192.168.1.50")
	r0.assign("uid-x", x)

	stop0 := run(t, r0)
	r0.push(1) // no Service uses x
	r0.pass(false)
	r0.pass(false)
	if s, _ := r0.strikes(x); s != 2 {
		t.Fatalf("strikes of %v after two passes = %d; want 2", x, s)
	}
	last := r0.status().LastReport
	stop0()

	stop1 := run(t, r1) // another term, on another replica, between the two
	stop1()

	run(t, r0) // its first pass runs at once: the snapshot is there
	etcdtest.WaitFor(t, 10*time.Second, "the first pass of the new term",
		func() bool { return r0.status().LastReport != last })
	if s, _ := r0.strikes(x); s != 1 {
		t.Errorf("strikes of %v after the first pass of a new term = %d; want 1", x, s)
	}
	if got := r0.holder(x); got != "uid-x" {
		t.Errorf("holder(%v) = %q; want uid-x (released on the first pass of a new term)", x, got)
	}
}

// TestUnreadableSnapshotRecord: a record of the accepted snapshot revision that does not
// parse (it byte-compares above every revision, so it would refuse every snapshot) is
// an error naming the key, not a *StaleSnapshotError with a revision it never held.
func TestUnreadableSnapshotRecord(t *testing.T) {
	e := etcdtest.New(t)
	r := newReplica(t, e.Client, opts{noRun: true}, "replica-0")
	const key = prefix + "/repair/snapshot-revision"
	if _, err := e.Client.Put(etcdtest.Context(t), key, "not-a-revision"); err != nil {
		t.Fatal(err)
	}
	err := r.accept(5)
	var stale *repair.StaleSnapshotError
	if err == nil || errors.As(err, &stale) || !strings.Contains(err.Error(), key) {
		t.Errorf("Accept over an unreadable %s = %v; want an error naming it, not stale", key, err)
	}
}

// TestRepairStaleSnapshot: a leader whose snapshot is older than one another replica
// accepted repairs nothing from it, judges no leak and counts no strike, until the
// newer snapshot reaches it.
func TestRepairStaleSnapshot(t *testing.T) {
	e := etcdtest.New(t)
	var hs *hookStore
	r0 := newReplica(t, e.Client, opts{strikes: 1, noRun: true, wrap: hooked(&hs)}, "replica-0")
	r1 := newReplica(t, e.NewClient(), opts{noRun: true}, "replica-1")
	x, y, z, w := ip("192.168.1.50"), ip("192.168.1.51"), ip("192.168.1.52"), ip("192.168.1.53")
	r0.assign("uid-x", x)
	r0.assign("uid-old", y)
	run(t, r0)
	// Snapshot 1: nothing uses x (a leak), uid-new uses y (wrong owner), uid-z uses z
	// (not allocated).
	r0.push(1, svc("uid-new", ips("192.168.1.51")), svc("uid-z", ips("192.168.1.52")))
	// Snapshot 2, accepted by the other replica: uid-x uses x again.
	snap2 := []repair.Service{svc("uid-x", ips("192.168.1.50")), svc("uid-new", ips("192.168.1.51")),
		svc("uid-z", ips("192.168.1.52"))}
	r1.push(2, snap2...)

	for _, dry := range []bool{true, false} {
		rep := r0.pass(dry)
		want := sorted("SnapshotStale  ", "ClusterIPWrongOwner 192.168.1.51 uid-new",
			"ClusterIPNotAllocated 192.168.1.52 uid-z")
		if got := summary(rep.Findings); !slices.Equal(got, want) {
			t.Errorf("stale pass (dry run %v) findings = %q; want %q", dry, got, want)
		}
	}
	for it, uid := range map[allocator.Item]string{x: "uid-x", y: "uid-old", z: ""} {
		if got := r0.holder(it); got != uid {
			t.Errorf("holder(%v) after a stale pass = %q; want %q", it, got, uid)
		}
	}
	if st := r0.status(); len(st.Candidates) != 0 {
		t.Errorf("Status().Candidates after a stale pass = %v; want none", st.Candidates)
	}

	r0.push(2, snap2...) // the newer snapshot arrives
	rep := r0.pass(false)
	want := sorted("ClusterIPWrongOwner 192.168.1.51 uid-new repaired",
		"ClusterIPNotAllocated 192.168.1.52 uid-z repaired")
	if got := summary(rep.Findings); !slices.Equal(got, want) {
		t.Errorf("pass over the current snapshot: findings = %q; want %q", got, want)
	}

	// A snapshot accepted elsewhere during a pass, after its first check: the pass
	// repairs, but judges no leak.
	r0.assign("uid-w", w)
	hs.beforeAssign = func(allocator.Owner, allocator.Item) error {
		hs.beforeAssign = nil
		r1.push(4, snap2...)
		return nil
	}
	r0.push(3, svc("uid-v", ips("192.168.1.54"))) // uid-v needs repair; nothing uses x, y, z, w
	rep = r0.pass(false)
	want = sorted("ClusterIPNotAllocated 192.168.1.54 uid-v repaired", "SnapshotStale  ")
	if got := summary(rep.Findings); !slices.Equal(got, want) {
		t.Errorf("pass during which a newer snapshot was accepted: findings = %q; want %q", got, want)
	}
	for _, it := range []allocator.Item{x, y, z, w} {
		if got := r0.holder(it); got == "" {
			t.Errorf("holder(%v) = free; want held (no leak judged by a stale pass)", it)
		}
	}

	// The same, but the newer snapshot is accepted by this replica: the pass's
	// snapshot was the newest when it started and the next pass judges the new one,
	// so the pass is not stale (else frequent pushes would stop every pass).
	hs.beforeAssign = func(allocator.Owner, allocator.Item) error {
		hs.beforeAssign = nil
		r0.push(6, snap2...)
		return nil
	}
	r0.push(5, svc("uid-u", ips("192.168.1.55")))
	rep = r0.pass(false)
	for _, f := range rep.Findings {
		if f.Reason == repair.SnapshotStale {
			t.Errorf("pass during which this replica accepted a newer snapshot: %v; want no SnapshotStale", f)
		}
	}
}

// TestRepairPassEndsWithTerm: a pass started by RunRepair ends when the leadership
// term it runs in ends (here the election lease is revoked), not only with the
// caller's context; RunRepair then answers NotLeaderError.
func TestRepairPassEndsWithTerm(t *testing.T) {
	var hs *hookStore
	r := newEnv(t, opts{wrap: hooked(&hs)})
	r.push(1)
	entered := make(chan struct{})
	hs.beforeList = func(ctx context.Context) error {
		hs.beforeList = nil // only the first pass blocks
		close(entered)
		<-ctx.Done()
		return ctx.Err()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		rep *repair.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := r.ctl.RunRepair(ctx, false)
		done <- result{rep, err}
	}()
	<-entered
	resp, err := r.cli.Get(context.Background(), prefix+"/repair/leader/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("Get(election keys) = %v, %v; want one key", resp, err)
	}
	if _, err := r.cli.Revoke(context.Background(), clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatalf("Revoke(election lease) = %v", err)
	}
	select {
	case res := <-done:
		if !errors.Is(res.err, repair.ErrNotLeader) {
			t.Errorf("RunRepair() after the term ended = %v, %v; want a NotLeaderError", res.rep, res.err)
		}
	case <-time.After(10 * time.Second):
		cancel()
		<-done
		t.Fatalf("RunRepair() still running 10 s after the election lease was revoked")
	}
}
