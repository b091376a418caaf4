package admit

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/cmd/allocd/daemon"
)

// switchProxy forwards TCP connections to a backend while up; while down it closes
// every connection it holds and each one it accepts: allocd stopped, as its clients
// see it, and started again on the same address.
type switchProxy struct {
	ln      net.Listener
	backend string
	down    atomic.Bool
	mu      sync.Mutex
	conns   map[net.Conn]bool
	wg      sync.WaitGroup
}

func startSwitchProxy(t *testing.T, backend string) *switchProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &switchProxy{ln: ln, backend: backend, conns: map[net.Conn]bool{}}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Go(func() { p.forward(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.setDown(true)
		p.wg.Wait()
	})
	return p
}

func (p *switchProxy) forward(c net.Conn) {
	if p.down.Load() {
		c.Close()
		return
	}
	up, err := net.Dial("tcp", p.backend)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// setDown switches the proxy down (every connection closed) or up.
func (p *switchProxy) setDown(down bool) {
	p.down.Store(down)
	if !down {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// allocateCalls counts the Allocate calls a client makes.
type allocateCalls struct{ n atomic.Int64 }

func (a *allocateCalls) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if path.Base(method) == "Allocate" {
		a.n.Add(1)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// TestAllocdDownFast: once the health check of allocd has failed, an admission is
// answered HTTP 500 at once (the failure policy decides) without asking allocd,
// instead of after its calls gave up a second before kube-apiserver's deadline; and
// allocd back, the next admission is served, before any periodic check (the clock
// is a fake one that never moves): each admission checks allocd itself while it is
// known down, so the webhook never says allocd is unreachable while it answers.
func TestAllocdDownFast(t *testing.T) {
	d := daemon.StartForTest(t, func(c *daemon.Config) { c.ServiceClusterIPRange = testCIDR4 })
	proxy := startSwitchProxy(t, d.GRPCAddr())
	var calls allocateCalls
	c, err := client.New(proxy.ln.Addr().String(),
		client.WithDialOptions(grpc.WithChainUnaryInterceptor(calls.intercept)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := newFixture(t, setup{ranges: testCIDR4, cidrs: []string{testCIDR4}})
	w, err := New(slog.New(slog.NewTextHandler(io.Discard, nil)), c, f.cluster, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	w.clock = clockwork.NewFakeClock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.WatchAllocd(ctx, HealthProbe(c.Conn()), time.Minute) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "allocd checked", func() bool { return testutil.ToFloat64(w.m.allocdUp) == 1 })
	if code, out, _, _ := post(t, w, createRequest(t, "up", spec{name: "web-up"}), "5s"); code != http.StatusOK ||
		!out.Response.Allowed {
		t.Fatalf("answer %d %+v with allocd up; want allowed", code, out)
	}

	proxy.setDown(true)
	// Not known down yet: this admission's calls give up before the deadline; its
	// failure makes the webhook check allocd at once.
	code, _, st, took := post(t, w, createRequest(t, "first", spec{name: "web-first"}), "3s")
	if code != http.StatusInternalServerError || took < time.Second {
		t.Errorf("answer %d %+v after %v, allocd just gone; want 500 after its calls gave up", code, st, took)
	}
	waitFor(t, "allocd known down", func() bool { return testutil.ToFloat64(w.m.allocdUp) == 0 })
	before := calls.n.Load()
	for i := range 5 {
		code, _, st, took := post(t, w, createRequest(t, "down-"+itoa(i), spec{name: "web-down-" + itoa(i)}), "5s")
		if code != http.StatusInternalServerError || !strings.Contains(st.Message, "allocd") ||
			!strings.Contains(st.Message, "health check failing since") {
			t.Errorf("answer %d %+v with allocd known down; want 500 naming allocd and its health check", code,
				st)
		}
		// At once: a check of allocd that fails, 0.66 s at most seen under -race on a
		// loaded machine; the budget was 4 s.
		if took > 2*time.Second {
			t.Errorf("answered after %v with allocd known down; want at once (its budget was 4 s)", took)
		}
	}
	if n := calls.n.Load() - before; n != 0 {
		t.Errorf("%d Allocate calls while allocd was known down; want none", n)
	}

	proxy.setDown(false)
	code, out, st, _ := post(t, w, createRequest(t, "back", spec{name: "web-back"}), "5s")
	if code != http.StatusOK || !out.Response.Allowed || len(out.Response.Patch) == 0 {
		t.Errorf("answer %d %+v %+v with allocd back, before any periodic check; want served", code, out, st)
	}
	if up := testutil.ToFloat64(w.m.allocdUp); up != 1 {
		t.Errorf("allocd_webhook_allocd_reachable = %v with allocd back; want 1", up)
	}
}
