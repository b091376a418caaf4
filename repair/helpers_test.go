package repair_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/allocator"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	"github.com/allocd/allocd/leader"
	"github.com/allocd/allocd/repair"
	"github.com/allocd/allocd/server"
)

const prefix = "/allocd"

// opts configures a test replica.
type opts struct {
	ranges       []string // default 192.168.1.0/24
	kubeNodePort int
	strikes      int // default 3
	grace        time.Duration
	file         string
	interval     time.Duration // default 1h: passes only when the test asks
	noRun        bool          // do not start the controller's Run
	wrap         func(*allocator.Allocator) repair.Store
	clock        clockwork.Clock // default the real clock
	// listFirst: the first pass lists every allocation, as the first pass of a term
	// does. By default the allocator's holders are seeded at start, so that every pass
	// reads only what it judges, as the passes after the first do.
	listFirst bool
}

// bothPaths runs test twice: with a first pass that lists every allocation, and with
// one that reads only what it judges.
func bothPaths(t *testing.T, test func(t *testing.T, listFirst bool)) {
	t.Run("listed", func(t *testing.T) { test(t, true) })
	t.Run("judged", func(t *testing.T) { test(t, false) })
}

// replica is one allocd replica's allocator and repair controller on a test etcd.
type replica struct {
	t     *testing.T
	cli   *clientv3.Client
	alloc *allocator.Allocator
	el    *leader.Elector
	ctl   *repair.Controller
	reg   *prometheus.Registry
	id    string
	stop  func() // stops the controller's Run (and waits for it)
}

// newEnv starts an etcd and one replica on it, leader once this returns (unless noRun).
func newEnv(t *testing.T, o opts) *replica {
	t.Helper()
	e := etcdtest.New(t)
	r := newReplica(t, e.Client, o, "replica-0")
	if !o.noRun {
		r.waitLeader()
	}
	return r
}

// newReplica builds an allocator and a controller on cli, runs the allocator, and the
// controller unless o.noRun. Everything stops in t.Cleanup.
func newReplica(t *testing.T, cli *clientv3.Client, o opts, id string) *replica {
	t.Helper()
	if o.ranges == nil {
		o.ranges = []string{"192.168.1.0/24"}
	}
	if o.interval == 0 {
		o.interval = time.Hour
	}
	var ps []netip.Prefix
	for _, s := range o.ranges {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	a, err := allocator.New(ctx, cli, allocator.Config{
		Prefix:             prefix,
		ClusterIPRanges:    ps,
		NodePortRange:      allocator.DefaultNodePortRange,
		KubernetesNodePort: o.kubeNodePort,
	})
	if err != nil {
		t.Fatalf("allocator.New: %v", err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := a.Run(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("allocator Run: %v", err)
		}
	}()
	if !o.listFirst {
		// The holders, seeded as by a first pass (with no claims: it marks nothing).
		if _, _, err := a.ListExcept(ctx, nil, nil); err != nil {
			t.Fatalf("ListExcept: %v", err)
		}
	}
	var store repair.Store = a
	if o.wrap != nil {
		store = o.wrap(a)
	}
	reg := prometheus.NewRegistry()
	el, err := leader.New(cli,
		leader.Config{Prefix: prefix + "/repair/leader", Identity: id, SessionTTL: time.Second})
	if err != nil {
		t.Fatalf("leader.New: %v", err)
	}
	ctl, err := repair.New(cli, store, repair.Config{
		Prefix:            prefix,
		Interval:          o.interval,
		LeakStrikes:       o.strikes,
		LeakGrace:         o.grace,
		SnapshotFile:      o.file,
		ParseSnapshotFile: server.ParseServiceSnapshotJSON,
		Leadership:        el,
		Registerer:        reg,
		Clock:             o.clock,
	})
	if err != nil {
		t.Fatalf("repair.New: %v", err)
	}
	r := &replica{t: t, cli: cli, alloc: a, el: el, ctl: ctl, reg: reg, id: id, stop: func() {}}
	if !o.noRun {
		rctx, rcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := el.Run(rctx, ctl.Lead); err != nil {
				t.Errorf("repair Run: %v", err)
			}
		}()
		r.stop = func() { rcancel(); <-done }
		t.Cleanup(r.stop)
	}
	return r
}

func (r *replica) waitLeader() {
	r.t.Helper()
	etcdtest.WaitFor(r.t, 10*time.Second, r.id+" to lead", r.ctl.IsLeader)
}

// push accepts a snapshot as PushServiceSnapshot does.
func (r *replica) push(rev int64, svcs ...repair.Service) {
	r.t.Helper()
	if err := r.accept(rev, svcs...); err != nil {
		r.t.Fatalf("Accept(revision %d) = %v; want nil", rev, err)
	}
}

func (r *replica) accept(rev int64, svcs ...repair.Service) error {
	ctx := context.Background()
	rc, err := r.ctl.Receive(ctx)
	if err != nil {
		return err
	}
	return r.ctl.Accept(ctx, repair.Snapshot{Revision: rev, Services: svcs}, rc)
}

// pass runs a pass and fails the test on error.
func (r *replica) pass(dry bool) *repair.Report {
	r.t.Helper()
	rep, err := r.ctl.RunRepair(context.Background(), dry)
	if err != nil {
		r.t.Fatalf("RunRepair(dry run %v) = %v; want nil", dry, err)
	}
	if rep.Err != nil {
		r.t.Fatalf("RunRepair(dry run %v) stopped: %v", dry, rep.Err)
	}
	return rep
}

// assign gives items to an owner, as an Allocate of an API server would.
func (r *replica) assign(uid string, items ...allocator.Item) []allocator.Allocation {
	r.t.Helper()
	var out []allocator.Allocation
	for _, it := range items {
		al, err := r.alloc.Assign(context.Background(), owner(uid), it)
		if err != nil {
			r.t.Fatalf("Assign(%s, %v) = %v; want nil", uid, it, err)
		}
		out = append(out, al)
	}
	return out
}

// holder returns the uid holding it in etcd, "" when free.
func (r *replica) holder(it allocator.Item) string {
	r.t.Helper()
	al, err := r.alloc.Get(context.Background(), it)
	if errors.Is(err, allocator.ErrNotFound) {
		return ""
	}
	if err != nil {
		r.t.Fatalf("Get(%v) = %v", it, err)
	}
	return al.Owner.UID
}

// etcdRev is the current etcd revision (it moves on every write).
func (r *replica) etcdRev() int64 {
	r.t.Helper()
	resp, err := r.cli.Get(context.Background(), "/nothing")
	if err != nil {
		r.t.Fatal(err)
	}
	return resp.Header.Revision
}

func (r *replica) status() repair.Status {
	r.t.Helper()
	st, err := r.ctl.Status(context.Background())
	if err != nil {
		r.t.Fatalf("Status() = %v", err)
	}
	return st
}

// strikes returns the strikes of the candidate for it, -1 when it is not one.
func (r *replica) strikes(it allocator.Item) (strikes, left int) {
	for _, c := range r.status().Candidates {
		if c.Allocation.Item == it {
			return c.Strikes, c.StrikesLeft
		}
	}
	return -1, -1
}

func owner(uid string) allocator.Owner {
	return allocator.Owner{Namespace: "ns", Name: strings.TrimPrefix(uid, "uid-"), UID: uid}
}

func ip(s string) allocator.Item { return allocator.IP(netip.MustParseAddr(s)) }
func port(p int) allocator.Item  { return allocator.Port(p) }

// svc is a Service named after uid ("uid-a" is ns/a) with cluster IPs and TCP node ports.
func svc(uid string, ips []string, ports ...int) repair.Service {
	o := owner(uid)
	s := repair.Service{Namespace: o.Namespace, Name: o.Name, UID: uid, ClusterIPs: ips}
	for _, p := range ports {
		s.NodePorts = append(s.NodePorts, repair.NodePort{Port: p, Protocol: "TCP"})
	}
	return s
}

func ips(s ...string) []string { return s }

// summary lists findings as "Reason item uid repaired", sorted, for comparisons.
func summary(fs []repair.Finding) []string {
	var out []string
	for _, f := range fs {
		it := f.ClusterIP
		if f.NodePort != 0 {
			it = fmt.Sprint(f.NodePort)
		}
		s := fmt.Sprintf("%s %s %s", f.Reason, it, f.Service.UID)
		if f.Repaired {
			s += " repaired"
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}
