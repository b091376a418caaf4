package daemon

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// watched runs a watch of the client package until the test ends and hands what it
// sees to the test through a channel, closed when the watch returns (its error in err).
type watched[T any] struct {
	ch  chan T
	err error // set before ch is closed
}

func watchAll[T any](t *testing.T, run func(ctx context.Context, fn func(T) error) error) *watched[T] {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watched[T]{ch: make(chan T, 1024)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.err = run(ctx, func(v T) error {
			select {
			case w.ch <- v:
			case <-ctx.Done():
			}
			return nil
		})
		close(w.ch)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// await receives from the watch until ok holds, failing the test after 10 s or when
// the watch ends.
func (w *watched[T]) await(t *testing.T, what string, ok func(T) bool) T {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case v, open := <-w.ch:
			if !open {
				t.Fatalf("waiting for %s: the watch ended: %v", what, w.err)
			}
			if ok(v) {
				return v
			}
		case <-timeout:
			t.Fatalf("waiting for %s: not seen after 10s", what)
		}
	}
}

// masterAddrs are the addresses of the kubernetes Service's Endpoints.
func masterAddrs(e *allocdv1.Endpoints) []string {
	var out []string
	for _, s := range e.GetSubsets() {
		out = append(out, s.GetAddresses()...)
	}
	return out
}

// readyIPs are the ready addresses of a Service's Endpoints, sorted.
func readyIPs(e *allocdv1.ServiceEndpoints) []string {
	var out []string
	for _, s := range e.GetSubsets() {
		for _, a := range s.GetAddresses() {
			out = append(out, a.GetIp())
		}
	}
	slices.Sort(out)
	return out
}

// shopEvent is a change of shop/web's Endpoints to the ready addresses ips.
func shopEvent(ips ...string) func(*allocdv1.WatchServiceEndpointsResponse) bool {
	return func(r *allocdv1.WatchServiceEndpointsResponse) bool {
		return r.GetEndpoints().GetName() == "web" && slices.Equal(readyIPs(r.GetEndpoints()), ips)
	}
}

// TestEtcdServersEndToEnd: allocd on an etcd of its own (--etcd-servers; under make
// etcd-matrix a process of etcd 3.5 or 3.6) serves the API through a compaction of
// etcd's history: a ServiceCIDR added, allocated from, drained and removed; Allocate and
// Release; master leases on the kubernetes Endpoints watch; a Service's Endpoints watch.
// Once etcd has compacted the history, the watches opened before keep seeing changes, a
// watch resumed from a compacted revision is refused with ErrCompacted, and one resumed
// from a later revision sees the next change.
func TestEtcdServersEndToEnd(t *testing.T) {
	e := etcdtest.New(t)
	t.Logf("etcd server %s", e.Version())
	d := StartForTest(t, func(c *Config) {
		c.EtcdServers = []string{e.Endpoint}
		c.EtcdCompactionInterval = 200 * time.Millisecond
		c.ServiceClusterIPRange = "10.96.0.0/26"
	})
	c, err := client.New(d.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := etcdtest.Context(t)
	masters := watchAll(t, c.WatchEndpoints)
	shop := watchAll(t,
		func(ctx context.Context, fn func(*allocdv1.WatchServiceEndpointsResponse) error) error {
			return c.WatchServiceEndpoints(ctx, &allocdv1.WatchServiceEndpointsRequest{Namespace: "shop"}, fn)
		})

	serviceCIDRLife(t, ctx, c)
	if _, err := c.Renew(ctx, &allocdv1.RenewRequest{Ip: "192.0.2.1", TtlSeconds: 30}); err != nil {
		t.Fatalf("Renew(192.0.2.1) = %v", err)
	}
	masters.await(t, "192.0.2.1 in the kubernetes Endpoints", func(e *allocdv1.Endpoints) bool {
		return slices.Equal(masterAddrs(e), []string{"192.0.2.1"})
	})
	pushShop(t, ctx, c, 1, webPod("web-0", "10.244.0.1", true))
	before := shop.await(t, "shop/web with 10.244.0.1", shopEvent("10.244.0.1")).GetRevision()

	compactPast(t, ctx, c, e.Client, before+1)

	for _, ip := range []string{"192.0.2.2", "192.0.2.3"} {
		if _, err := c.Renew(ctx, &allocdv1.RenewRequest{Ip: ip, TtlSeconds: 30}); err != nil {
			t.Fatalf("Renew(%s) after the compaction = %v", ip, err)
		}
	}
	if _, err := c.RemoveLease(ctx, &allocdv1.RemoveLeaseRequest{Ip: "192.0.2.1"}); err != nil {
		t.Fatalf("RemoveLease(192.0.2.1) = %v", err)
	}
	masters.await(t, "192.0.2.2 and 192.0.2.3 alone in the kubernetes Endpoints",
		func(e *allocdv1.Endpoints) bool {
			return slices.Equal(masterAddrs(e), []string{"192.0.2.2", "192.0.2.3"})
		})
	pushShop(t, ctx, c, 2, webPod("web-0", "10.244.0.1", true), webPod("web-1", "10.244.0.2", true))
	after := shop.await(t, "shop/web with 10.244.0.1 and 10.244.0.2",
		shopEvent("10.244.0.1", "10.244.0.2")).GetRevision()

	err = c.WatchServiceEndpoints(ctx,
		&allocdv1.WatchServiceEndpointsRequest{Namespace: "shop", StartRevision: before},
		func(*allocdv1.WatchServiceEndpointsResponse) error { return nil })
	if !errors.Is(err, client.ErrCompacted) {
		t.Errorf("WatchServiceEndpoints from compacted revision %d = %v; want %v", before, err,
			client.ErrCompacted)
	}
	resumed := watchAll(t,
		func(ctx context.Context, fn func(*allocdv1.WatchServiceEndpointsResponse) error) error {
			return c.WatchServiceEndpoints(ctx,
				&allocdv1.WatchServiceEndpointsRequest{Namespace: "shop", StartRevision: after}, fn)
		})
	pushShop(t, ctx, c, 3, webPod("web-1", "10.244.0.2", true))
	resumed.await(t, "shop/web with 10.244.0.2 alone, on the watch resumed from its last revision",
		shopEvent("10.244.0.2"))
}

// serviceCIDRLife adds the ServiceCIDR extra, allocates and releases one of its
// addresses, and deletes it: it must be gone at once, nothing holding it.
func serviceCIDRLife(t *testing.T, ctx context.Context, c *client.Client) {
	t.Helper()
	if _, err := c.CreateServiceCIDR(ctx, "extra", "10.97.0.0/28"); err != nil {
		t.Fatalf("CreateServiceCIDR(extra) = %v", err)
	}
	owner := &allocdv1.Owner{Namespace: "shop", Name: "db", Uid: "uid-db"}
	etcdtest.WaitFor(t, 10*time.Second, "an address of the new ServiceCIDR", func() bool {
		_, err := c.Allocate(ctx,
			&allocdv1.AllocateRequest{Owner: owner, ClusterIps: []string{"10.97.0.5"}, NodePortCount: 1})
		return err == nil
	})
	if _, err := c.Release(ctx, &allocdv1.ReleaseRequest{Owner: owner}); err != nil {
		t.Fatalf("Release(shop/db) = %v", err)
	}
	if _, err := c.DeleteServiceCIDR(ctx, "extra"); err != nil {
		t.Fatalf("DeleteServiceCIDR(extra) = %v", err)
	}
	etcdtest.WaitFor(t, 10*time.Second, "the ServiceCIDR extra removed", func() bool {
		_, err := c.GetServiceCIDR(ctx, "extra")
		return errors.Is(err, client.ErrNotFound)
	})
}

// pushShop pushes snapshots of the Service shop/web and of pods at revision rev.
func pushShop(t *testing.T, ctx context.Context, c *client.Client, rev int64, pods ...*allocdv1.Pod) {
	t.Helper()
	svc := &allocdv1.Service{Namespace: "shop", Name: "web", Uid: "uid-web",
		ClusterIps: []string{"10.96.0.50"},
		Selector:   &allocdv1.Selector{MatchLabels: map[string]string{"app": "web"}},
		Ports: []*allocdv1.ServicePortSpec{{Name: "http", Port: 80,
			TargetPort: &allocdv1.TargetPort{Value: &allocdv1.TargetPort_StrValue{StrValue: "http"}}}}}
	etcdtest.WaitFor(t, 20*time.Second, "the Endpoints leader to take the snapshots", func() bool {
		if _, err := c.PushServiceSnapshot(ctx,
			&allocdv1.ServiceSnapshot{Revision: rev, Services: []*allocdv1.Service{svc}}); err != nil {
			return false
		}
		_, err := c.PushPodSnapshot(ctx, &allocdv1.PodSnapshot{Revision: rev, Pods: pods})
		return err == nil
	})
}

// compactPast allocates and releases through allocd until its compactor has compacted
// etcd's history past revision rev (a read at rev is ErrCompacted).
func compactPast(t *testing.T, ctx context.Context, c *client.Client, cli *clientv3.Client, rev int64) {
	t.Helper()
	owner := &allocdv1.Owner{Namespace: "shop", Name: "churn", Uid: "uid-churn"}
	etcdtest.WaitFor(t, 20*time.Second, "etcd's history compacted past the Endpoints' revision", func() bool {
		if _, err := c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: owner, NodePortCount: 1}); err != nil {
			t.Fatalf("Allocate(churn) = %v", err)
		}
		if _, err := c.Release(ctx, &allocdv1.ReleaseRequest{Owner: owner}); err != nil {
			t.Fatalf("Release(churn) = %v", err)
		}
		_, err := cli.Get(ctx, "/allocd/none", clientv3.WithRev(rev))
		return errors.Is(err, rpctypes.ErrCompacted)
	})
}
