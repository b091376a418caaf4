package adopt

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/cmd/allocd/daemon"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

func startAllocd(t *testing.T) *client.Client {
	t.Helper()
	d := daemon.StartForTest(t, func(c *daemon.Config) { c.ServiceClusterIPRange = "10.96.0.0/24" })
	c, err := client.New(d.GRPCAddr())
	if err != nil {
		t.Fatalf("client.New(%q) = %v", d.GRPCAddr(), err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// nodePortService holds clusterIP and NodePort 30080.
func nodePortService(name, clusterIP string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: clusterIP,
			ClusterIPs: []string{clusterIP},
			Ports:      []corev1.ServicePort{{Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}}},
	}
}

// holder returns the UID that holds NodePort port in allocd, "" when free.
func holder(t *testing.T, c *client.Client, port int32) string {
	t.Helper()
	al, err := c.GetAllocation(context.Background(), &allocdv1.GetAllocationRequest{
		Target: &allocdv1.GetAllocationRequest_NodePort{NodePort: port}})
	if err != nil {
		return ""
	}
	return al.GetOwner().GetUid()
}

// TestAdoptEachOnItsOwn: a Service whose ClusterIP is outside allocd's ranges has its
// NodePort adopted all the same; the ClusterIP is reported as a failure, not an error
// that aborts the Service.
func TestAdoptEachOnItsOwn(t *testing.T) {
	c := startAllocd(t)
	a := New(slog.New(slog.NewTextHandler(io.Discard, nil)), c)
	s := nodePortService("web", "10.200.0.5")
	res, err := a.Service(context.Background(), s)
	if err != nil {
		t.Fatalf("Service(ClusterIP outside the ranges) = %v; want the NodePort adopted, "+
			"the ClusterIP failed", err)
	}
	if !slices.Equal(res.Adopted, []string{"30080"}) || len(res.Failed) != 1 ||
		res.Failed[0].Resource != "10.200.0.5" {
		t.Errorf("Service(ClusterIP outside the ranges) = %+v; want 30080 adopted, 10.200.0.5 failed", res)
	}
	if got := holder(t, c, 30080); got != string(s.UID) {
		t.Errorf("NodePort 30080 held by %q; want %q", got, s.UID)
	}
	if f := a.Failures(); len(f) != 1 || f[0].Resource != "10.200.0.5" {
		t.Errorf("Failures() = %+v; want 10.200.0.5", f)
	}
}

// TestControllerCIDRConflictDoesNotStall: a ServiceCIDR that conflicts with allocd's
// is reported without holding adoption up; a ServiceCIDR that appears later is synced,
// and the Service whose ClusterIP is in it is adopted then; the controller is ready
// once every Service was tried, failures included.
func TestControllerCIDRConflictDoesNotStall(t *testing.T) {
	c := startAllocd(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	s := nodePortService("web", "10.200.0.5")
	if err := store.Add(s); err != nil {
		t.Fatal(err)
	}
	ctl := NewController(New(log, c), log, store, 2)
	var mu sync.Mutex
	cidrs := []networkingv1.ServiceCIDR{{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.97.0.0/24"}}}} // allocd has 10.96.0.0/24
	list := func(context.Context) ([]networkingv1.ServiceCIDR, error) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(cidrs), nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { ctl.SyncCIDRs(ctx, list, 50*time.Millisecond) })
	wg.Go(func() { _ = ctl.Run(ctx, func() bool { return true }) })
	defer func() { cancel(); wg.Wait() }()
	ctl.ServiceChanged(nil, s)

	waitFor(t, "the controller ready", ctl.Ran)
	waitFor(t, "NodePort 30080 adopted", func() bool { return holder(t, c, 30080) == string(s.UID) })
	if f := ctl.a.Failures(); len(f) != 1 {
		t.Errorf("Failures() = %+v; want the ClusterIP outside allocd's ranges", f)
	}
	waitFor(t, "the conflict on ServiceCIDR kubernetes counted", func() bool {
		return testutil.ToFloat64(ctl.cidrErr) >= 1
	})
	mu.Lock()
	cidrs = append(cidrs, networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "extra"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.200.0.0/24"}}})
	mu.Unlock()
	waitFor(t, "10.200.0.5 adopted once its ServiceCIDR is synced", func() bool {
		al, err := c.GetAllocation(context.Background(), &allocdv1.GetAllocationRequest{
			Target: &allocdv1.GetAllocationRequest_ClusterIp{ClusterIp: "10.200.0.5"}})
		return err == nil && al.GetOwner().GetUid() == string(s.UID)
	})
	// The failure is cleared once the adoption that made the allocation returns (it
	// records the Service's failures after its writes).
	waitFor(t, "the failure cleared after the range came", func() bool { return len(ctl.a.Failures()) == 0 })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
