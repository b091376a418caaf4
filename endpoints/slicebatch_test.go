package endpoints

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/allocd/allocd/endpoints/kube"
	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// sliceGate holds every slice transaction while closed, and records the Services whose
// slices each transaction wrote.
type sliceGate struct {
	closed  atomic.Bool
	open    chan struct{}
	once    sync.Once
	blocked atomic.Int32

	mu   sync.Mutex
	txns [][]string // the Services of each slice transaction, sorted
}

// intercept is the gate as a unary client interceptor.
func (g *sliceGate) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	tr, ok := req.(*etcdserverpb.TxnRequest)
	if !ok {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	var svcs []string
	for _, op := range tr.Success {
		key := string(op.GetRequestPut().GetKey()) + string(op.GetRequestDeleteRange().GetKey())
		_, rest, found := strings.Cut(key, "/endpointslices/")
		if parts := strings.Split(rest, "/"); found && len(parts) == 3 && !slices.Contains(svcs, parts[1]) {
			svcs = append(svcs, parts[1])
		}
	}
	if len(svcs) > 0 {
		slices.Sort(svcs)
		g.mu.Lock()
		g.txns = append(g.txns, svcs)
		g.mu.Unlock()
		if g.closed.Load() {
			g.blocked.Add(1)
			<-g.open
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// release opens the gate for good.
func (g *sliceGate) release() { g.once.Do(func() { g.closed.Store(false); close(g.open) }) }

// TestTwoBigServicesBatched: the writes of two Services of 6,000 Pods each (60 slices,
// ~840 KB of values each) wait in the committer's queue together: each fits a
// transaction alone, two do not, and the committer must not batch them into one too
// large. Both are written whole: 60 slices and 6,000 distinct endpoints each.
//
// To have both writes queued at once, a gate holds the slice transactions of four small
// Services (every slot of the committer) while a fifth waits for a slot.
func TestTwoBigServicesBatched(t *testing.T) {
	if testing.Short() {
		t.Skip("two Services of 6,000 Pods: seconds")
	}
	e := etcdtest.New(t)
	g := &sliceGate{open: make(chan struct{})}
	t.Cleanup(g.release)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second,
		Logger: zap.NewNop(), DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(g.intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	h := &harness{t: t, etcd: e, cli: cli}
	warn := slog.New(slog.NewTextHandler(&tw{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if h.c, err = New(cli, Config{Prefix: testPrefix, DisableEndpoints: true, SliceWorkers: 8,
		Logger: warn}); err != nil {
		t.Fatal(err)
	}
	h.lead()
	service := func(name string) *kube.Service {
		svc := sliceService("production")
		svc.Name, svc.UID = name, "uid-"+name
		svc.Selector = map[string]string{"app": name}
		return svc
	}
	const fillers = maxInFlight + 1
	fillerPod := func(i, n int) *kube.Pod {
		p := testPod("production", 100*i+n, true, 1)
		p.Name, p.NodeName = fmt.Sprintf("f%d-%d", i, n), "node-0"
		p.Labels = map[string]string{"app": fmt.Sprint("f", i)}
		return p
	}
	var svcs []*kube.Service
	var pods []*kube.Pod
	for i := range fillers {
		svcs = append(svcs, service(fmt.Sprint("f", i)))
		pods = append(pods, fillerPod(i, 0))
	}
	const n = 6000
	names := []string{"alpha", "beta"}
	var big []Event
	for _, name := range names {
		svcs = append(svcs, service(name))
		for _, p := range realisticPods("production", n, 50) {
			p.Name = name + "-" + p.Name
			p.Labels = map[string]string{"app": name}
			big = append(big, Event{Type: Upsert, Revision: 10, Pod: p})
		}
	}
	h.sliceSnapshots(1, svcs, realisticNodes(50), pods)
	h.settle()
	tm, err := h.c.currentTerm()
	if err != nil {
		t.Fatal(err)
	}

	g.mu.Lock()
	g.txns = nil // the first syncs wrote every Service's placeholder in one transaction
	g.mu.Unlock()
	g.closed.Store(true)
	for i := range maxInFlight {
		h.events(Event{Type: Upsert, Revision: int64(2 + i), Pod: fillerPod(i, 1)})
		etcdtest.WaitFor(t, 5*time.Second, fmt.Sprint(i+1, " slice transactions held"), func() bool {
			return g.blocked.Load() == int32(i+1)
		})
	}
	// The fifth write: the committer takes it and waits for a slot.
	h.events(Event{Type: Upsert, Revision: 9, Pod: fillerPod(fillers-1, 1)})
	time.Sleep(500 * time.Millisecond)
	h.events(big...)
	etcdtest.WaitFor(t, 20*time.Second, "both big writes queued", func() bool {
		return len(tm.committer.in) == 2
	})
	g.release()
	h.settle()

	g.mu.Lock()
	defer g.mu.Unlock()
	for _, svcs := range g.txns {
		if slices.Contains(svcs, "alpha") && slices.Contains(svcs, "beta") {
			t.Errorf("a transaction wrote the slices of %v; want alpha's and beta's apart", svcs)
		}
	}
	for _, name := range names {
		sl := h.slices("production", name)
		all := endpointNames(sl)
		distinct := len(slices.Compact(slices.Clone(all)))
		if len(sl) != n/DefaultMaxEndpointsPerSlice || len(all) != n || distinct != n {
			t.Errorf("%s: %d endpoints (%d distinct) in %d slices; want %d in %d", name, len(all), distinct,
				len(sl), n, n/DefaultMaxEndpointsPerSlice)
		}
	}
}
