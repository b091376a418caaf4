package call_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/allocd/allocd/internal/etcd/call"
	"github.com/allocd/allocd/internal/loopback"
	"github.com/allocd/allocd/internal/testing/etcdtest"
)

func newClient(t *testing.T, endpoint string, intercept bool) *clientv3.Client {
	t.Helper()
	cfg := clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: time.Second, Logger: zap.NewNop()}
	if intercept {
		cfg.DialOptions = []grpc.DialOption{grpc.WithChainUnaryInterceptor(call.NotSentInterceptor())}
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// A write to an address where no etcd listens never left the process: not applied,
// even though the etcd client answers it with the context's deadline.
func TestNotSentIsNotApplied(t *testing.T) {
	addr, err := loopback.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	for _, intercept := range []bool{true, false} {
		cli := newClient(t, "http://"+addr, intercept)
		err := call.Write(context.Background(), 200*time.Millisecond, 200*time.Millisecond,
			func(ctx context.Context) error {
				_, err := cli.Put(ctx, "/k", "v")
				return err
			})
		if err == nil {
			t.Fatal("Put to an address where nothing listens succeeded")
		}
		// Without the interceptor nothing tells where the request went: unknown.
		if got := call.NotApplied(err); got != intercept {
			t.Errorf("interceptor %v: NotApplied(%v) = %v, want %v", intercept, err, got, intercept)
		}
	}
}

// A member without a leader refuses a write that asks for one; Write tries again until
// a leader is elected, and the write is applied once.
func TestNoLeaderRetried(t *testing.T) {
	if testing.Short() {
		t.Skip("three etcd members, an election: seconds")
	}
	c := etcdtest.NewCluster(t, 3)
	c.StopMember(1)
	c.StopMember(2)
	cli := newClient(t, c.Endpoints[0], true)
	// Wait until member 0 knows it has no leader (its election timeout is 100 ms): a
	// write sent before that goes to the dead leader and its outcome is unknown.
	var refused atomic.Int32
	etcdtest.WaitFor(t, 5*time.Second, "member 0 to refuse writes for want of a leader", func() bool {
		err := call.Write(context.Background(), time.Second, 0, func(ctx context.Context) error {
			_, err := cli.Put(ctx, "/probe", "v")
			return err
		})
		return call.NotApplied(err)
	})
	done := make(chan error, 1)
	go func() {
		done <- call.Write(context.Background(), time.Second, 20*time.Second,
			func(ctx context.Context) error {
				_, err := cli.Put(ctx, "/k", "v")
				if call.NotApplied(err) {
					refused.Add(1)
				}
				return err
			})
	}()
	etcdtest.WaitFor(t, 5*time.Second, "a try refused for want of a leader",
		func() bool { return refused.Load() > 0 })
	c.StartMember(1)
	if err := <-done; err != nil {
		t.Fatalf("Write after the election: %v", err)
	}
	if refused.Load() == 0 {
		t.Error("no try was refused for want of a leader: the retry was not exercised")
	}
	resp, err := cli.Get(context.Background(), "/k")
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Version != 1 {
		t.Fatalf("Get /k = %v, %v; want one version", resp, err)
	}
}
