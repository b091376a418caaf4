package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// relay is a TCP relay on loopback between an allocd replica and etcd that a test cuts
// (every connection closed, new ones refused) and restores: a network partition.
type relay struct {
	t      *testing.T
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener // nil while cut
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newRelay(t *testing.T, target string) *relay {
	r := &relay{t: t, addr: freeAddr(t), target: target, conns: map[net.Conn]struct{}{}}
	r.restore()
	t.Cleanup(func() { r.cut(); r.wg.Wait() })
	return r
}

// restore listens again: the replica reconnects.
func (r *relay) restore() {
	ln, err := net.Listen("tcp", r.addr)
	if err != nil {
		r.t.Fatalf("relay listen %s: %v", r.addr, err)
	}
	r.mu.Lock()
	r.ln = ln
	r.mu.Unlock()
	r.wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", r.target)
			if err != nil {
				in.Close()
				continue
			}
			r.mu.Lock()
			live := r.ln != nil
			if live {
				r.conns[in], r.conns[out] = struct{}{}, struct{}{}
			}
			r.mu.Unlock()
			if !live {
				in.Close()
				out.Close()
				continue
			}
			r.wg.Go(func() { io.Copy(out, in); out.Close(); in.Close() })
			r.wg.Go(func() { io.Copy(in, out); in.Close(); out.Close() })
		}
	})
}

// cut closes the listener and every relayed connection.
func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != nil {
		r.ln.Close()
		r.ln = nil
	}
	for c := range r.conns {
		c.Close()
	}
	clear(r.conns)
}

// replica is one allocd of a test, with clients of its services.
type replica struct {
	d     *Daemon
	alloc allocdv1.AllocatorServiceClient
	lease allocdv1.LeaseServiceClient
	eps   allocdv1.EndpointsServiceClient
}

func newReplica(t *testing.T, d *Daemon) replica {
	conn := dial(t, d.GRPCAddr())
	return replica{d: d, alloc: allocdv1.NewAllocatorServiceClient(conn),
		lease: allocdv1.NewLeaseServiceClient(conn),
		eps:   allocdv1.NewEndpointsServiceClient(conn)}
}

func owner(uid string) *allocdv1.Owner {
	return &allocdv1.Owner{Namespace: "default", Name: uid, Uid: uid}
}

// view is what a replica serves from the state its watches keep: the used counts of
// its ranges (allocation index) and the master lease endpoints; and the stored
// Endpoints of default/kubernetes, which the Endpoints controller writes from them.
type view struct {
	used      []string // "range=used", sorted
	masters   []string // addresses of default/kubernetes from the master leases
	endpoints []string // addresses of the stored Endpoints of default/kubernetes
	shop      []string // addresses of the stored Endpoints of shop/web, sorted
}

func (r replica) view(ctx context.Context) (view, error) {
	var v view
	rs, err := r.alloc.ListRanges(ctx, &allocdv1.ListRangesRequest{})
	if err != nil {
		return v, err
	}
	for _, rg := range rs.GetRanges() {
		v.used = append(v.used, fmt.Sprintf("%s=%d", rg.GetName(), rg.GetUsed()))
	}
	slices.Sort(v.used)
	ep, err := r.lease.GetEndpoints(ctx, &allocdv1.GetEndpointsRequest{})
	if err != nil {
		return v, err
	}
	for _, s := range ep.GetEndpoints().GetSubsets() {
		v.masters = append(v.masters, s.GetAddresses()...)
	}
	se, err := r.eps.GetServiceEndpoints(ctx,
		&allocdv1.GetServiceEndpointsRequest{Namespace: "default", Name: "kubernetes"})
	if err != nil {
		return v, err
	}
	for _, s := range se.GetEndpoints().GetSubsets() {
		for _, a := range s.GetAddresses() {
			v.endpoints = append(v.endpoints, a.GetIp())
		}
	}
	se, err = r.eps.GetServiceEndpoints(ctx,
		&allocdv1.GetServiceEndpointsRequest{Namespace: "shop", Name: "web"})
	if err != nil {
		return v, err
	}
	for _, s := range se.GetEndpoints().GetSubsets() {
		for _, a := range s.GetAddresses() {
			v.shop = append(v.shop, a.GetIp())
		}
	}
	slices.Sort(v.shop)
	return v, nil
}

func (v view) String() string {
	return fmt.Sprintf("used %v, master lease endpoints %v, stored endpoints %v, shop/web %v", v.used,
		v.masters, v.endpoints, v.shop)
}

// equal reports whether v and w are the same state.
func (v view) equal(w view) bool {
	return slices.Equal(v.used, w.used) && slices.Equal(v.masters, w.masters) &&
		slices.Equal(v.endpoints, w.endpoints) &&
		slices.Equal(v.shop, w.shop)
}

// etcdTruth counts the allocation keys in etcd: what every replica's index must show.
func etcdTruth(t *testing.T, cli *clientv3.Client) (ips, ports int64) {
	t.Helper()
	ctx := etcdtest.Context(t)
	for _, k := range []struct {
		prefix string
		n      *int64
	}{{"/allocd/clusterips/", &ips}, {"/allocd/nodeports/", &ports}} {
		resp, err := cli.Get(ctx, k.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		*k.n = resp.Count
	}
	return ips, ports
}

// TestCompactionRelist runs two replicas on one etcd with --etcd-compaction-interval
// 200ms while Allocate, Release, Renew, RemoveLease and Pod events go on, and cuts the
// second replica (the repair and Endpoints leader) off etcd until the history its
// watches would resume from is compacted: a read at the cut revision fails with
// ErrCompacted. Its watches can then only catch up by listing again; the test checks
// that they do. First the allocation index and the master leases: once it reconnects,
// the second replica serves the same used counts as the first and as etcd's keys, and
// the master lease endpoints that the leases in etcd make, stored in
// default/kubernetes's Endpoints. Then the Endpoints controller's watch of what it
// stored: shop/web's Endpoints are deleted behind its back while it is cut off, and it
// must write them again.
func TestCompactionRelist(t *testing.T) {
	if testing.Short() {
		t.Skip("partitions replicas and waits for them to converge: seconds")
	}
	e := etcdtest.New(t)
	setup := func(c *Config) {
		c.EtcdServers = []string{e.Endpoint}
		c.EtcdCompactionInterval = 200 * time.Millisecond
		c.ServiceClusterIPRange = "10.96.0.0/26"
		c.ServiceNodePortRange = "30000-30099"
	}
	rl := newRelay(t, strings.TrimPrefix(e.Endpoint, "http://"))
	// The second replica starts first: it leads repair and the Endpoints controller.
	two := StartForTest(t, setup, func(c *Config) { c.EtcdServers = []string{"http://" + rl.addr} })
	one := StartForTest(t, setup)
	a, b := newReplica(t, one), newReplica(t, two)
	ctx := etcdtest.Context(t)
	w := workload{t: t, ctx: ctx, cli: e.Client}
	if st, err := allocdv1.NewRepairServiceClient(dial(t, one.GRPCAddr())).GetRepairStatus(ctx,
		&allocdv1.GetRepairStatusRequest{}); err != nil || st.GetLeader() != two.GRPCAddr() {
		t.Fatalf("repair leader = %q, %v; want the replica started first, %s", st.GetLeader(), err,
			two.GRPCAddr())
	}
	w.shop(one, "10.244.0.1", "10.244.0.2")

	for i := range 10 {
		w.allocate([]replica{a, b}[i%2], fmt.Sprintf("o%d", i))
	}
	w.renew(a, "192.0.2.1", "192.0.2.2")
	w.churn(a, b, 20)
	w.partition(rl, a, func() {
		for i := range 6 { // more released than allocated: the used counts change
			w.release(a, fmt.Sprintf("o%d", i))
			if i%2 == 0 {
				w.allocate(a, fmt.Sprintf("p%d", i))
			}
		}
		w.renew(a, "192.0.2.3")
		w.remove(a, "192.0.2.1")
	})
	w.churn(a, b, 20)
	w.shop(one, "10.244.0.1", "10.244.0.2", "10.244.0.3")
	ips, ports := etcdTruth(t, e.Client)
	want := view{used: []string{fmt.Sprintf("10.96.0.0/26=%d", ips), fmt.Sprintf("30000-30099=%d", ports)},
		masters: []string{"192.0.2.2", "192.0.2.3"}, endpoints: []string{"192.0.2.2", "192.0.2.3"},
		shop: []string{"10.244.0.1", "10.244.0.2", "10.244.0.3"}}
	converge(t, map[string]replica{"first": a, "second (cut off)": b}, want)

	w.partition(rl, a, func() {
		if _, err := e.Client.Delete(ctx, "/allocd/endpoints/shop/web"); err != nil {
			t.Fatal(err)
		}
	})
	converge(t, map[string]replica{"first, after shop/web's Endpoints were deleted": a}, want)
}

// converge waits until every replica serves want, and fails the test if one does not
// within 20 s.
func converge(t *testing.T, replicas map[string]replica, want view) {
	t.Helper()
	ctx := etcdtest.Context(t)
	for name, r := range replicas {
		var got view
		var err error
		etcdtest.Eventually(20*time.Second, func() bool {
			got, err = r.view(ctx)
			return err == nil && got.equal(want)
		})
		if err != nil || !got.equal(want) {
			t.Errorf("%s replica serves %v, %v; want %v (etcd's keys and leases)", name, got, err, want)
		}
	}
}

// workload drives allocd through its API and fails the test on any error.
type workload struct {
	t   *testing.T
	ctx context.Context
	cli *clientv3.Client // of etcd
	n   int
}

// partition cuts the replica behind rl off etcd, runs during, and keeps writing
// through r until etcd has compacted the history since the cut; then it restores.
func (w *workload) partition(rl *relay, r replica, during func()) {
	w.t.Helper()
	cutRev := w.revision()
	rl.cut()
	during()
	etcdtest.WaitFor(w.t, 10*time.Second, "the history after the cut to be compacted", func() bool {
		w.churn(r, r, 2)
		w.renew(r, "192.0.2.2", "192.0.2.3")
		_, err := w.cli.Get(w.ctx, "/allocd/none", clientv3.WithRev(cutRev+1))
		return errors.Is(err, rpctypes.ErrCompacted)
	})
	rl.restore()
}

func (w *workload) allocate(r replica, uid string) {
	w.t.Helper()
	if _, err := r.alloc.Allocate(w.ctx,
		&allocdv1.AllocateRequest{Owner: owner(uid), NodePortCount: 1}); err != nil {
		w.t.Fatalf("Allocate(%s): %v", uid, err)
	}
}

func (w *workload) release(r replica, uid string) {
	w.t.Helper()
	if _, err := r.alloc.Release(w.ctx, &allocdv1.ReleaseRequest{Owner: owner(uid)}); err != nil {
		w.t.Fatalf("Release(%s): %v", uid, err)
	}
}

// churn allocates and releases n owners, alternately through x and y.
func (w *workload) churn(x, y replica, n int) {
	w.t.Helper()
	for range n {
		w.n++
		uid := fmt.Sprintf("churn-%d", w.n)
		w.allocate(x, uid)
		w.release(y, uid)
		x, y = y, x
	}
}

func (w *workload) renew(r replica, ips ...string) {
	w.t.Helper()
	for _, ip := range ips {
		if _, err := r.lease.Renew(w.ctx, &allocdv1.RenewRequest{Ip: ip, TtlSeconds: 30}); err != nil {
			w.t.Fatalf("Renew(%s): %v", ip, err)
		}
	}
}

func (w *workload) remove(r replica, ip string) {
	w.t.Helper()
	if _, err := r.lease.RemoveLease(w.ctx, &allocdv1.RemoveLeaseRequest{Ip: ip}); err != nil {
		w.t.Fatalf("RemoveLease(%s): %v", ip, err)
	}
}

// shop pushes snapshots of the Service shop/web and of ready Pods with ips (through
// d, forwarded to the leader), at a new revision each time.
func (w *workload) shop(d *Daemon, ips ...string) {
	w.t.Helper()
	c, err := client.New(d.GRPCAddr())
	if err != nil {
		w.t.Fatal(err)
	}
	defer c.Close()
	w.n++
	rev := int64(w.n)
	svc := &allocdv1.Service{Namespace: "shop", Name: "web", Uid: "uid-web",
		ClusterIps: []string{"10.96.0.50"},
		Selector:   &allocdv1.Selector{MatchLabels: map[string]string{"app": "web"}},
		Ports: []*allocdv1.ServicePortSpec{{Name: "http", Port: 80,
			TargetPort: &allocdv1.TargetPort{Value: &allocdv1.TargetPort_StrValue{StrValue: "http"}}}}}
	if _, err := c.PushServiceSnapshot(w.ctx,
		&allocdv1.ServiceSnapshot{Revision: rev, Services: []*allocdv1.Service{svc}}); err != nil {
		w.t.Fatalf("PushServiceSnapshot: %v", err)
	}
	var pods []*allocdv1.Pod
	for i, ip := range ips {
		pods = append(pods, webPod(fmt.Sprintf("web-%d", i), ip, true))
	}
	if _, err := c.PushPodSnapshot(w.ctx, &allocdv1.PodSnapshot{Revision: rev, Pods: pods}); err != nil {
		w.t.Fatalf("PushPodSnapshot: %v", err)
	}
}

func (w *workload) revision() int64 {
	w.t.Helper()
	resp, err := w.cli.Get(w.ctx, "/allocd/none")
	if err != nil {
		w.t.Fatal(err)
	}
	return resp.Header.Revision
}
