package adopt

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/allocd/allocd/bridge/admit"
	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// provisional allocates ips and ports in allocd as the admission webhook does, for the
// Service ns/name (or generateName) of admission request uid.
func provisional(t *testing.T, c *client.Client, name, uid string, ips []string,
	ports []int32) *allocdv1.Owner {
	t.Helper()
	o := &allocdv1.Owner{Namespace: "ns", Name: name, Uid: "admission/" + uid}
	if _, err := c.Allocate(context.Background(), &allocdv1.AllocateRequest{Owner: o, ClusterIps: ips,
		NodePorts: ports, NoClusterIp: len(ips) == 0}); err != nil {
		t.Fatalf("Allocate(%v %v) for %s = %v", ips, ports, o.Uid, err)
	}
	return o
}

// storedService is Service ns/name as kube-apiserver stored it, with ip and nodePort.
func storedService(name, generateName, uid, ip string, nodePort int32) *corev1.Service {
	s := nodePortService(name, ip)
	s.UID, s.GenerateName = types.UID(uid), generateName
	s.Spec.Ports[0].NodePort = nodePort
	return s
}

func holderOf(t *testing.T, c *client.Client, item string, port int32) string {
	t.Helper()
	req := &allocdv1.GetAllocationRequest{Target: &allocdv1.GetAllocationRequest_NodePort{NodePort: port}}
	if item != "" {
		req.Target = &allocdv1.GetAllocationRequest_ClusterIp{ClusterIp: item}
	}
	al, err := c.GetAllocation(context.Background(), req)
	if err != nil {
		return ""
	}
	return al.GetOwner().GetUid()
}

// TestBind: adoption moves what the admission webhook allocated for a Service (held by
// a provisional owner of its namespace and name, or of its generateName) to the
// Service's UID, counted; an item a provisional owner of another name holds is a
// conflict, left to it.
func TestBind(t *testing.T) {
	c := startAllocd(t)
	a := New(quiet, c)
	ctx := context.Background()
	provisional(t, c, "web", "r1", []string{"10.96.0.10"}, []int32{30010})
	res, err := a.Service(ctx, storedService("web", "", "uid-web", "10.96.0.10", 30010))
	if err != nil || !slices.Equal(res.Bound, []string{"10.96.0.10", "30010"}) || len(res.Adopted) != 0 {
		t.Fatalf("Service(web) = %+v, %v; want 10.96.0.10 and 30010 bound", res, err)
	}
	if h := holderOf(t, c, "10.96.0.10", 0) + " " + holderOf(t, c, "", 30010); h != "uid-web uid-web" {
		t.Errorf("holders %q; want uid-web for both", h)
	}
	provisional(t, c, "gen-", "r2", []string{"10.96.0.11"}, nil)
	res, err = a.Service(ctx, storedService("gen-x7k2p", "gen-", "uid-gen", "10.96.0.11", 30011))
	if err != nil || !slices.Equal(res.Bound, []string{"10.96.0.11"}) ||
		!slices.Equal(res.Adopted, []string{"30011"}) {
		t.Errorf("Service(generateName) = %+v, %v; want 10.96.0.11 bound, 30011 adopted", res, err)
	}
	provisional(t, c, "other", "r3", []string{"10.96.0.12"}, nil)
	res, err = a.Service(ctx, storedService("web2", "", "uid-web2", "10.96.0.12", 30012))
	if err != nil || len(res.Bound) != 0 || len(res.Conflicts) != 1 {
		t.Errorf("Service(an address another name's admission holds) = %+v, %v; want a conflict", res, err)
	}
	if h := holderOf(t, c, "10.96.0.12", 0); h != "admission/r3" {
		t.Errorf("10.96.0.12 held by %q; want admission/r3 still", h)
	}
	if n := testutil.ToFloat64(a.bound); n != 3 {
		t.Errorf("allocd_bridge_pending_bound_total = %v; want 3", n)
	}
}

// sweeper returns a Sweeper of a over a cluster of objs, on a fake clock at now.
func sweeper(a *Adopter, objs ...runtime.Object) (*Sweeper, *clockwork.FakeClock) {
	clock := clockwork.NewFakeClockAt(time.Now())
	return NewSweeper(a, fake.NewClientset(objs...), quiet, SweeperConfig{Grace: time.Minute,
		Interval: time.Second, Clock: clock}), clock
}

// TestSweep: past the grace, a provisional owner's items are bound to the stored
// Service that holds them (by name, or by generateName) and freed when none does;
// young ones are left alone.
func TestSweep(t *testing.T) {
	c := startAllocd(t)
	a := New(quiet, c)
	ctx := context.Background()
	provisional(t, c, "web", "stored", []string{"10.96.0.20"}, []int32{30020})
	provisional(t, c, "web", "retried", []string{"10.96.0.21"}, []int32{30021}) // a retried create's
	provisional(t, c, "gone", "refused", []string{"10.96.0.22"}, nil)
	provisional(t, c, "gen-", "generated", nil, []int32{30023})
	other := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "gen-abcde",
		GenerateName: "gen-", UID: "uid-other"}}
	s, clock := sweeper(a, storedService("web", "", "uid-web", "10.96.0.20", 30020),
		storedService("gen-x7k2p", "gen-", "uid-gen", "10.96.0.99", 30023), other)

	res, err := s.RunOnce(ctx)
	if err != nil || res.Young != 6 || len(res.Bound)+len(res.Freed) != 0 {
		t.Fatalf("RunOnce() within the grace = %+v, %v; want 6 young items, nothing done", res, err)
	}
	clock.Advance(time.Minute + time.Second)
	res, err = s.RunOnce(ctx)
	slices.Sort(res.Bound)
	slices.Sort(res.Freed)
	if err != nil || !slices.Equal(res.Bound, []string{"10.96.0.20", "30020", "30023"}) ||
		!slices.Equal(res.Freed, []string{"10.96.0.21", "10.96.0.22", "30021"}) {
		t.Fatalf("RunOnce() past the grace = %+v, %v; want the stored Services' bound, the rest freed",
			res, err)
	}
	for item, want := range map[string]string{"10.96.0.20": "uid-web", "10.96.0.21": "", "10.96.0.22": ""} {
		if h := holderOf(t, c, item, 0); h != want {
			t.Errorf("%s held by %q; want %q", item, h, want)
		}
	}
	if h := holderOf(t, c, "", 30023); h != "uid-gen" {
		t.Errorf("30023 held by %q; want uid-gen (its Service's generateName is the owner's name)", h)
	}
	if b, f := testutil.ToFloat64(a.bound), testutil.ToFloat64(a.freed); b != 3 || f != 3 {
		t.Errorf("bound %v, freed %v; want 3 and 3", b, f)
	}
	if res, err := s.RunOnce(ctx); err != nil || res.Owners != 0 {
		t.Errorf("RunOnce() again = %+v, %v; want no provisional owner left", res, err)
	}
}

// TestSweepWaitsForAdoption: the first sweep comes only once the bridge is ready (its
// adoption run over every Service once): a bridge down for longer than the grace
// binds what was stored meanwhile through adoption before it frees anything.
func TestSweepWaitsForAdoption(t *testing.T) {
	c := startAllocd(t)
	a := New(quiet, c)
	provisional(t, c, "gone", "refused", []string{"10.96.0.30"}, nil)
	s, clock := sweeper(a)
	clock.Advance(2 * time.Minute)
	var mu sync.Mutex
	ready := false
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- s.Run(ctx, func() bool { mu.Lock(); defer mu.Unlock(); return ready })
	}()
	for range 3 {
		clock.BlockUntilContext(ctx, 1)
		clock.Advance(time.Second)
	}
	if h := holderOf(t, c, "10.96.0.30", 0); h != "admission/refused" {
		t.Errorf("10.96.0.30 held by %q before the bridge is ready; want admission/refused still", h)
	}
	mu.Lock()
	ready = true
	mu.Unlock()
	clock.BlockUntilContext(ctx, 1)
	clock.Advance(time.Second)
	waitFor(t, "the first sweep once ready", func() bool { return holderOf(t, c, "10.96.0.30", 0) == "" })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run() = %v; want nil once ctx ends", err)
	}
}

// TestBindAndSweepRace: the adoption of a Service and the sweep act on the same
// provisional items at once, again and again: every item ends held by its Service's
// UID, bound exactly once, never freed; a retried create's items are freed.
func TestBindAndSweepRace(t *testing.T) {
	c := startAllocd(t)
	a := New(quiet, c)
	var svcs []runtime.Object
	for i := range 20 {
		name, ip, port := "web"+itoa(i), "10.96.0."+itoa(100+i), int32(30100+i)
		provisional(t, c, name, "first-"+itoa(i), []string{ip}, []int32{port})
		provisional(t, c, name, "retry-"+itoa(i), []string{"10.96.0." + itoa(150+i)}, nil)
		svcs = append(svcs, storedService(name, "", "uid-"+name, ip, port))
	}
	s, clock := sweeper(a, svcs...)
	clock.Advance(2 * time.Minute)
	var wg sync.WaitGroup
	ctx := context.Background()
	wg.Go(func() {
		if _, err := s.RunOnce(ctx); err != nil {
			t.Errorf("RunOnce() = %v", err)
		}
	})
	for _, obj := range svcs {
		wg.Go(func() {
			if _, err := a.Service(ctx, obj.(*corev1.Service)); err != nil {
				t.Errorf("Service(%s) = %v", obj.(*corev1.Service).Name, err)
			}
		})
	}
	wg.Wait()
	if _, err := s.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		ip, port := "10.96.0."+itoa(100+i), int32(30100+i)
		want := "uid-web" + itoa(i)
		if h := holderOf(t, c, ip, 0) + " " + holderOf(t, c, "", port); h != want+" "+want {
			t.Errorf("web%d's %s and %d held by %q; want its UID", i, ip, port, h)
		}
		if h := holderOf(t, c, "10.96.0."+itoa(150+i), 0); h != "" {
			t.Errorf("the retried create's address held by %q; want it freed", h)
		}
	}
	if b, f := testutil.ToFloat64(a.bound), testutil.ToFloat64(a.freed); b != 40 || f != 20 {
		t.Errorf("bound %v, freed %v; want 40 and 20", b, f)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// webhook returns the admission webhook over allocd c and a cluster of objs (its
// default ServiceCIDR allocd's range), its informers synced.
func webhook(t *testing.T, c *client.Client, objs ...runtime.Object) *admit.Webhook {
	t.Helper()
	objs = append(objs, &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/24"}}})
	kube := fake.NewClientset(objs...)
	factory := informers.NewSharedInformerFactory(kube, 0)
	cluster, err := admit.NewCluster(kube, factory)
	if err != nil {
		t.Fatal(err)
	}
	w, err := admit.New(quiet, c, cluster, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	t.Cleanup(func() { cancel(); factory.Shutdown() })
	waitFor(t, "the webhook's informers synced", cluster.Synced)
	return w
}

// createRequest is the admission request of a create of svc, request uid uid.
func createRequest(t *testing.T, uid string, svc *corev1.Service) *admissionv1.AdmissionRequest {
	t.Helper()
	raw, err := json.Marshal(svc)
	if err != nil {
		t.Fatal(err)
	}
	dry := false
	return &admissionv1.AdmissionRequest{UID: types.UID(uid),
		Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Service"},
		Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "services"},
		Namespace: svc.Namespace, Name: svc.Name, Operation: admissionv1.Create,
		Object: runtime.RawExtension{Raw: raw}, DryRun: &dry}
}

// TestRetryNotSwept: a create refused after admission (a quota) is retried with the
// address its admission was given, just before that admission's grace ends. The
// webhook moves the address to the retry's provisional owner with a new
// allocate_time, so the sweep that judges the first admission's items past the grace
// (and frees its node port, which the retry does not ask for) leaves the address to
// the retry, which kube-apiserver may still store.
func TestRetryNotSwept(t *testing.T) {
	c := startAllocd(t)
	a := New(quiet, c)
	ctx := context.Background()
	provisional(t, c, "web", "r1", []string{"10.96.0.30"}, []int32{30030})
	first, err := c.GetAllocation(ctx, &allocdv1.GetAllocationRequest{
		Target: &allocdv1.GetAllocationRequest_ClusterIp{ClusterIp: "10.96.0.30"}})
	if err != nil {
		t.Fatal(err)
	}
	w := webhook(t, c)
	retry := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.30",
			ClusterIPs: []string{"10.96.0.30"}, Ports: []corev1.ServicePort{{Port: 80,
				Protocol: corev1.ProtocolTCP}}}}
	resp, _, err := w.Admit(ctx, createRequest(t, "r2", retry))
	if err != nil || !resp.Allowed {
		t.Fatalf("Admit(the retry) = %+v, %v; want allowed", resp, err)
	}
	clock := clockwork.NewFakeClockAt(first.GetAllocateTime().AsTime().Add(time.Minute))
	s := NewSweeper(a, fake.NewClientset(), quiet, SweeperConfig{Grace: time.Minute, Interval: time.Second,
		Clock: clock})
	res, err := s.RunOnce(ctx)
	if err != nil || !slices.Equal(res.Freed, []string{"30030"}) {
		t.Errorf("RunOnce() at the first admission's grace = %+v, %v; want its node port freed", res, err)
	}
	if h := holderOf(t, c, "10.96.0.30", 0); h != "admission/r2" {
		t.Errorf("10.96.0.30 held by %q; want admission/r2, the retry in flight", h)
	}
}

// TestShortGraceWarns: a grace below kube-apiserver's 34 s bound is taken (the kube e2e
// uses one on purpose), with a warning; the default one draws none.
func TestShortGraceWarns(t *testing.T) {
	for _, tc := range []struct {
		grace time.Duration
		warn  bool
	}{{15 * time.Second, true}, {0, false}, {RequestTimeoutUpperBound, false}} {
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
		s := NewSweeper(nil, nil, log, SweeperConfig{Grace: tc.grace})
		if warned := strings.Contains(buf.String(), "below kube-apiserver's bound"); warned != tc.warn {
			t.Errorf("NewSweeper(grace %v) warned %v (%q); want %v", tc.grace, warned, buf.String(), tc.warn)
		}
		if want := cmp.Or(tc.grace, DefaultPendingGrace); s.cfg.Grace != want {
			t.Errorf("NewSweeper(grace %v): grace %v; want %v", tc.grace, s.cfg.Grace, want)
		}
	}
}
