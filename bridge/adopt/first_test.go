package adopt

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/cmd/allocd/daemon"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// calls counts a client's calls to allocd, by method.
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.mu.Lock()
	c.n[path.Base(method)]++
	c.mu.Unlock()
	return invoker(ctx, method, req, reply, cc, opts...)
}

// take returns the calls counted since the last take, as "Method n, ..." in name order
// ("" for none), and starts counting again.
func (c *calls) take() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for m, n := range c.n {
		out = append(out, fmt.Sprintf("%s %d", m, n))
	}
	slices.Sort(out)
	c.n = map[string]int{}
	return strings.Join(out, ", ")
}

// startCounted starts allocd as startAllocd does and returns two clients of it: one
// whose calls are counted (the bridge's), one for the test's own calls.
func startCounted(t *testing.T) (counted *client.Client, cs *calls, plain *client.Client) {
	t.Helper()
	d := daemon.StartForTest(t, func(c *daemon.Config) { c.ServiceClusterIPRange = "10.96.0.0/24" })
	cs = &calls{n: map[string]int{}}
	counted, err := client.New(d.GRPCAddr(),
		client.WithDialOptions(grpc.WithChainUnaryInterceptor(cs.intercept)))
	if err != nil {
		t.Fatal(err)
	}
	plain, err = client.New(d.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { counted.Close(); plain.Close() })
	return counted, cs, plain
}

// TestFirstCalls: a Service allocd holds nothing for under its UID (one the bridge saw
// created) is adopted without a listing, in two calls: the admission webhook's
// allocation of all its items bound in one Transfer, or free items taken in one
// Allocate; a Service with nothing to hold costs no call. Before First, binding cost a
// listing, an Allocate refused and, per item, another refused Allocate and a Transfer.
func TestFirstCalls(t *testing.T) {
	c, cs, plain := startCounted(t)
	a := New(quiet, c)
	ctx := context.Background()
	external := &corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName}}
	external.Namespace, external.Name, external.UID = "ns", "ext", "uid-ext"
	for _, tc := range []struct {
		name           string
		svc            *corev1.Service
		provisional    bool
		bound, adopted []string
		calls          string
	}{
		{name: "bound", svc: storedService("web", "", "uid-web", "10.96.0.10", 30010), provisional: true,
			bound: []string{"10.96.0.10", "30010"}, calls: "GetAllocation 1, Transfer 1"},
		{name: "generateName", svc: storedService("gen-x7k2p", "gen-", "uid-gen", "10.96.0.11", 30011),
			provisional: true, bound: []string{"10.96.0.11", "30011"}, calls: "GetAllocation 1, Transfer 1"},
		{name: "free", svc: storedService("free", "", "uid-free", "10.96.0.12", 30012),
			adopted: []string{"10.96.0.12", "30012"}, calls: "Allocate 1, GetAllocation 1"},
		{name: "nothing to hold", svc: external},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.provisional {
				name := tc.svc.Name
				if tc.svc.GenerateName != "" {
					name = tc.svc.GenerateName
				}
				w := serviceWants(tc.svc)
				provisional(t, plain, name, "r-"+tc.name, w.ips, w.ports)
			}
			cs.take()
			res, err := a.First(ctx, tc.svc)
			if got := cs.take(); got != tc.calls {
				t.Errorf("First(%s) called allocd: %q; want %q", tc.svc.Name, got, tc.calls)
			}
			if err != nil || !slices.Equal(res.Bound, tc.bound) || !slices.Equal(res.Adopted, tc.adopted) {
				t.Errorf("First(%s) = %+v, %v; want bound %v, adopted %v", tc.svc.Name, res, err, tc.bound,
					tc.adopted)
			}
			w := serviceWants(tc.svc)
			for _, ip := range w.ips {
				if h := holderOf(t, plain, ip, 0); h != string(tc.svc.UID) {
					t.Errorf("%s held by %q; want %s", ip, h, tc.svc.UID)
				}
			}
			for _, p := range w.ports {
				if h := holderOf(t, plain, "", p); h != string(tc.svc.UID) {
					t.Errorf("%d held by %q; want %s", p, h, tc.svc.UID)
				}
			}
		})
	}
	if n := testutil.ToFloat64(a.bound); n != 4 {
		t.Errorf("allocd_bridge_pending_bound_total = %v; want 4", n)
	}
}

// TestFirstFallsBack: when First's one write cannot be (the items are not all in the
// same hands, the first is another admission's, the Sweeper bound some to the UID
// already), the Service is adopted item by item after a listing, as Service does:
// what is the Service's is bound or adopted, the rest reported, extras released.
func TestFirstFallsBack(t *testing.T) {
	c, _, plain := startCounted(t)
	a := New(quiet, c)
	ctx := context.Background()

	provisional(t, plain, "split", "r1", []string{"10.96.0.20"}, nil)
	_, err := plain.Allocate(ctx, &allocdv1.AllocateRequest{Owner: &allocdv1.Owner{Namespace: "other",
		Name: "taker", Uid: "uid-taker"}, NodePorts: []int32{30020}, NoClusterIp: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := a.First(ctx, storedService("split", "", "uid-split", "10.96.0.20", 30020))
	if err != nil || !slices.Equal(res.Bound, []string{"10.96.0.20"}) || len(res.Conflicts) != 1 ||
		res.Conflicts[0].Resource != "30020" {
		t.Errorf("First(an address of its admission, a port of another owner) = %+v, %v; want the address "+
			"bound, the port a conflict", res, err)
	}

	provisional(t, plain, "someone-else", "r2", []string{"10.96.0.21"}, nil)
	res, err = a.First(ctx, storedService("web", "", "uid-web", "10.96.0.21", 30021))
	if err != nil || len(res.Bound) != 0 || !slices.Equal(res.Adopted, []string{"30021"}) ||
		len(res.Conflicts) != 1 {
		t.Errorf("First(an address of another name's admission) = %+v, %v; want a conflict, the port "+
			"adopted", res, err)
	}
	if h := holderOf(t, plain, "10.96.0.21", 0); h != "admission/r2" {
		t.Errorf("10.96.0.21 held by %q; want admission/r2 still", h)
	}

	// The Sweeper bound an address to the Service that a later version gave up.
	provisional(t, plain, "swept", "r3", []string{"10.96.0.22"}, []int32{30022, 30023})
	_, err = plain.Transfer(ctx, &allocdv1.TransferRequest{From: &allocdv1.Owner{Uid: "admission/r3"},
		To: &allocdv1.Owner{Namespace: "ns", Name: "swept", Uid: "uid-swept"}, NodePorts: []int32{30022}})
	if err != nil {
		t.Fatal(err)
	}
	a.markSwept("uid-swept")
	res, err = a.First(ctx, storedService("swept", "", "uid-swept", "10.96.0.22", 30023))
	if err != nil || !slices.Equal(res.Released, []string{"30022"}) ||
		!slices.Equal(res.Bound, []string{"10.96.0.22", "30023"}) {
		t.Errorf("First(a Service the Sweeper bound to) = %+v, %v; want 30022, which it no longer holds, "+
			"released", res, err)
	}
}

// TestControllerFirstSync: the Controller adopts a Service created after its first
// listing with First (two calls), and a Service of that listing with Service, even
// when the listing's add is handed over after the listing: its UID may hold what the
// Service no longer uses (released by Service; First would not see it).
func TestControllerFirstSync(t *testing.T) {
	c, cs, plain := startCounted(t)
	a := New(quiet, c)
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	old := storedService("old", "", "uid-old", "10.96.0.30", 30030)
	if err := store.Add(old); err != nil {
		t.Fatal(err)
	}
	// A port the Service gave up while no bridge looked.
	_, err := plain.Allocate(context.Background(), &allocdv1.AllocateRequest{Owner: ownerOf(old),
		NodePorts: []int32{30031}, NoClusterIp: true})
	if err != nil {
		t.Fatal(err)
	}
	ctl := NewController(a, quiet, store, 2)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = ctl.Run(ctx, func() bool { return true }) })
	defer func() { cancel(); wg.Wait() }()
	waitFor(t, "the first listing", func() bool {
		ctl.mu.Lock()
		defer ctl.mu.Unlock()
		return ctl.listed != nil
	})
	ctl.ServiceChanged(nil, old) // the listing's add, handed over after it
	waitFor(t, "the first listing adopted", ctl.Ran)
	if h := holderOf(t, plain, "", 30030) + " " + holderOf(t, plain, "", 30031); h != "uid-old " {
		t.Errorf("30030 and 30031 held by %q; want uid-old and nobody (released: the Service no longer "+
			"holds it)", h)
	}

	created := storedService("new", "", "uid-new", "10.96.0.31", 30032)
	provisional(t, plain, "new", "r1", []string{"10.96.0.31"}, []int32{30032})
	cs.take()
	if err := store.Add(created); err != nil {
		t.Fatal(err)
	}
	ctl.ServiceChanged(nil, created)
	waitFor(t, "the new Service's items bound", func() bool {
		return holderOf(t, plain, "10.96.0.31", 0) == "uid-new" && holderOf(t, plain, "", 30032) == "uid-new"
	})
	if got, want := cs.take(), "GetAllocation 1, Transfer 1"; got != want {
		t.Errorf("calls to bind a created Service: %q; want %q", got, want)
	}
}

// TestServiceBindsInOneTransfer: what an update newly holds, allocated by the admission
// webhook, is bound in one Transfer after the listing of what the UID holds: three
// calls, where an Allocate of all of it refused and an Allocate and a Transfer per
// item were six.
func TestServiceBindsInOneTransfer(t *testing.T) {
	c, cs, plain := startCounted(t)
	a := New(quiet, c)
	ctx := context.Background()
	svc := storedService("web", "", "uid-web", "10.96.0.40", 30040)
	_, err := plain.Allocate(ctx, &allocdv1.AllocateRequest{Owner: ownerOf(svc),
		ClusterIps: []string{"10.96.0.40"}})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "b", Port: 81, NodePort: 30041,
		Protocol: corev1.ProtocolTCP})
	provisional(t, plain, "web", "r-update", nil, []int32{30040, 30041})
	cs.take()
	res, err := a.Service(ctx, svc)
	if err != nil || !slices.Equal(res.Bound, []string{"30040", "30041"}) ||
		!slices.Equal(res.Held, []string{"10.96.0.40"}) {
		t.Errorf("Service(an update with two node ports) = %+v, %v; want both bound, the address held",
			res, err)
	}
	if got, want := cs.take(), "GetAllocation 1, ListAllocations 1, Transfer 1"; got != want {
		t.Errorf("calls: %q; want %q", got, want)
	}
}
