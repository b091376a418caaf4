package call_test

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/allocd/allocd/internal/etcd/call"
	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// blackhole listens on loopback and accepts connections but never answers: a member
// that stalls without closing its connections, as a paused process does.
func blackhole(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	return "http://" + lis.Addr().String()
}

// probes counts the probes started, by every member's probe client.
var probes atomic.Int64

func countProbes(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker,
	opts ...grpc.CallOption) error {
	probes.Add(1)
	return invoker(ctx, method, req, reply, cc, opts...)
}

func startMembers(t *testing.T, endpoints []string, onLeftOut func()) *clientv3.Client {
	t.Helper()
	cli := newClient(t, endpoints[0], true)
	cli.SetEndpoints(endpoints...)
	probe := func(ep string) (*clientv3.Client, error) {
		return clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: time.Second,
			Logger:      zap.NewNop(),
			DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(countProbes)}})
	}
	m, err := call.NewMembers(cli, endpoints, "/health", slog.New(slog.DiscardHandler), probe)
	if err != nil {
		t.Fatal(err)
	}
	m.OnLeftOut = onLeftOut
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; m.Close() })
	return cli
}

// A member that accepts connections and never answers is left out of the client's
// endpoints within a second, and the writes go to the member that answers.
func TestMembersLeaveOutStalled(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time probes of a stalled member: seconds")
	}
	e := etcdtest.New(t)
	hole := blackhole(t)
	var leftOut atomic.Int32
	cli := startMembers(t, []string{hole, e.Endpoint}, func() { leftOut.Add(1) })
	etcdtest.WaitFor(t, time.Second, "the stalled member to be left out", func() bool {
		return slices.Equal(cli.Endpoints(), []string{e.Endpoint})
	})
	// The watches are opened anew once, after three probes missed in a row.
	etcdtest.WaitFor(t, 2*time.Second, "OnLeftOut", func() bool { return leftOut.Load() > 0 })
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := cli.Put(ctx, "/k", "v")
		cancel()
		if err != nil {
			t.Fatalf("Put %d with the stalled member left out: %v", i, err)
		}
	}
	if n := leftOut.Load(); n != 1 {
		t.Errorf("OnLeftOut called %d times for one stalled member; want once", n)
	}
}

// When no member answers, all stay: leaving none would make every call fail at once.
func TestMembersKeepAllWhenNoneAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for rounds of real-time probes")
	}
	holes := []string{blackhole(t), blackhole(t)}
	before := probes.Load()
	cli := startMembers(t, holes, func() { t.Error("OnLeftOut called with no member answering") })
	// Run starts a round once it has acted on the one before: once the fourth round
	// has started, three (restartAfter) were missed and acted on.
	etcdtest.WaitFor(t, 10*time.Second, "four rounds of probes", func() bool {
		return probes.Load()-before > 3*int64(len(holes))
	})
	if got := cli.Endpoints(); !slices.Equal(got, holes) {
		t.Fatalf("endpoints = %v, want all of %v", got, holes)
	}
}

// A member that stops is left out, and comes back when it serves again.
func TestMembersComeBack(t *testing.T) {
	if testing.Short() {
		t.Skip("three etcd members stopped and started: seconds")
	}
	c := etcdtest.NewCluster(t, 3)
	cli := startMembers(t, c.Endpoints, nil)
	c.StopMember(2)
	etcdtest.WaitFor(t, 2*time.Second, "the stopped member to be left out", func() bool {
		return slices.Equal(cli.Endpoints(), c.Endpoints[:2])
	})
	c.StartMember(2)
	etcdtest.WaitFor(t, 2*time.Second, "the member to come back", func() bool {
		return slices.Equal(cli.Endpoints(), c.Endpoints)
	})
}
