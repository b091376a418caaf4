package endpoints

import (
	"context"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// TestWatchReadsDeletesTogether: a watch that sees a namespace's 100 objects deleted in
// one transaction reads their last states in a few etcd round trips, not one per
// delete, and sends each Deleted event with its object's last state, in order.
func TestWatchReadsDeletesTogether(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	var reads atomic.Int64 // Range and Txn calls of the watching controller's client
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == "/etcdserverpb.KV/Range" || method == "/etcdserverpb.KV/Txn" {
			reads.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint},
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	c, err := New(cli, Config{Prefix: testPrefix, DisableEndpointSlices: true})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, etcd: e, cli: e.Client, c: c}
	const n = 100
	for i := range n {
		h.store(handMade("ns", "svc"+strconv.Itoa(i)))
	}
	start, err := e.Client.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.Delete(ctx, testPrefix+"/endpoints/ns/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var got []string
	before := reads.Load()
	err = c.Watch(wctx, "ns", start.Header.Revision, func(ev WatchEvent) error {
		if ev.Type != Deleted || ev.Endpoints == nil || len(ev.Endpoints.Subsets) != 1 {
			t.Fatalf("event %v %+v; want Deleted with the last state", ev.Type, ev.Endpoints)
		}
		got = append(got, ev.Endpoints.Name)
		if len(got) == n {
			cancel()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.IsSorted(got) { // one delete of a prefix: its events come in key order
		t.Errorf("Deleted events out of the deletes' order: %v", got)
	}
	if len(got) != n {
		t.Fatalf("%d Deleted events; want %d", len(got), n)
	}
	if r := reads.Load() - before; r > n/lastStatesPerTxn+2 {
		t.Errorf("the watch made %d reads for %d deletes; want at most %d", r, n, n/lastStatesPerTxn+2)
	}
}
