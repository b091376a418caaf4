package client_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/cmd/allocd/daemon"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// countRecv is a stream interceptor that counts the messages received on
// WatchEndpoints streams, so that the test knows when the watcher has reconnected.
type countRecv struct{ n atomic.Int64 }

func (c *countRecv) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
	streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != allocdv1.LeaseService_WatchEndpoints_FullMethodName {
		return s, err
	}
	return &countingStream{ClientStream: s, n: &c.n}, nil
}

type countingStream struct {
	grpc.ClientStream
	n *atomic.Int64
}

func (s *countingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		s.n.Add(1)
	}
	return err
}

// timeline records events with their times, from any goroutine.
type timeline struct {
	mu    sync.Mutex
	lines []string
}

func (l *timeline) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
}

// Write adds a log line.
func (l *timeline) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func (l *timeline) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func addresses(ep *allocdv1.Endpoints) []string {
	var out []string
	for _, s := range ep.GetSubsets() {
		out = append(out, s.GetAddresses()...)
	}
	return out
}

// TestEndpointsWatcherResumes restarts allocd under a watcher: the watcher reconnects,
// does not deliver the unchanged state it receives first on the new stream, and
// delivers the next change.
func TestEndpointsWatcherResumes(t *testing.T) {
	cfg := daemon.TestConfig(t.TempDir(), func() string { a, _ := daemon.FreeAddr(); return a })
	// events is what happened around the restart, allocd's log included, printed when
	// the test fails.
	var events timeline
	cfg.LogOutput = &events
	start := func() *daemon.Daemon {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		d, err := daemon.Start(ctx, cfg)
		if err != nil {
			t.Fatalf("start allocd: %v", err)
		}
		return d
	}
	d := start()
	t.Cleanup(func() { d.Close() })

	var recv countRecv
	c := newClient(t, cfg.GRPCAddress,
		client.WithDialOptions(grpc.WithChainStreamInterceptor(recv.intercept)))
	ctx := etcdtest.Context(t)
	if _, err := c.Renew(ctx, &allocdv1.RenewRequest{Ip: "10.0.0.11", TtlSeconds: 600}); err != nil {
		t.Fatalf("Renew(10.0.0.11) = %v", err)
	}

	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("timeline:\n%s", events.String())
		}
	})
	delivered := make(chan []string, 10)
	var broken atomic.Int64
	watchCtx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	done := make(chan error, 1)
	w := client.NewEndpointsWatcher(c, client.WithWatchBackoff(10*time.Millisecond, 200*time.Millisecond),
		client.WithWatchErrors(func(err error) {
			broken.Add(1)
			events.add("watcher: %v", err)
		}))
	go func() {
		done <- w.Watch(watchCtx, func(ep *allocdv1.Endpoints) { delivered <- addresses(ep) })
	}()
	next := func() []string {
		t.Helper()
		select {
		case a := <-delivered:
			return a
		case <-time.After(10 * time.Second):
			t.Fatal("no Endpoints delivered within 10s")
			return nil
		}
	}
	// The state before allocd has seen the lease, if it comes, has no address.
	got := next()
	for len(got) == 0 {
		got = next()
	}
	if want := []string{"10.0.0.11"}; !slices.Equal(got, want) {
		t.Fatalf("first Endpoints = %v; want %v", got, want)
	}

	// Restart allocd on the same address and data: the lease survives, the stream breaks.
	before := recv.n.Load()
	if err := d.Close(); err != nil {
		t.Fatalf("close allocd: %v", err)
	}
	etcdtest.WaitFor(t, 10*time.Second, "the watcher to see the broken stream",
		func() bool { return broken.Load() > 0 })
	d = start()
	events.add("allocd restarted")
	// Generous: what is asserted is the reconnect and the absence of a duplicate, not
	// its speed, and a shared CI machine once took more than 10 s (the timeline shows
	// why, if it happens again).
	etcdtest.WaitFor(t, 30*time.Second, "the watcher to receive the state again",
		func() bool { return recv.n.Load() > before })
	select {
	case a := <-delivered:
		t.Fatalf("after reconnecting the watcher delivered %v again; want no duplicate", a)
	default:
	}

	if _, err := c.Renew(ctx, &allocdv1.RenewRequest{Ip: "10.0.0.12", TtlSeconds: 600}); err != nil {
		t.Fatalf("Renew(10.0.0.12) = %v", err)
	}
	if got, want := next(), []string{"10.0.0.11", "10.0.0.12"}; !slices.Equal(got, want) {
		t.Errorf("Endpoints after a second lease = %v; want %v", got, want)
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Watch() = %v after cancel; want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Watch did not return within 5s of cancel")
	}
	select {
	case a := <-delivered:
		t.Errorf("unexpected extra delivery %v", a)
	default:
	}
}
