package admit

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/cmd/allocd/daemon"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// The ranges of the tests: allocd's and the cluster's (dual-stack, IPv4 primary).
const (
	testCIDR4 = "10.96.0.0/24"
	testCIDR6 = "fd00:10:96::/120"
)

// fixture is a webhook against a real allocd (embedded etcd, gRPC on loopback) and a
// cluster of client-go's fake clientset, its informers synced.
type fixture struct {
	t       *testing.T
	c       *client.Client
	kube    *fake.Clientset
	cluster *Cluster
	w       *Webhook
	reg     *prometheus.Registry
	uids    int
}

// setup says how to start a fixture: allocd's ClusterIP ranges (testCIDR4,testCIDR6
// when empty) and node port range (allocd's default when empty), the CIDRs of the
// cluster's default ServiceCIDR (both test CIDRs when nil).
type setup struct {
	ranges, nodePorts string
	cidrs             []string
}

// newFixture starts allocd and a cluster as s says, the cluster holding objs.
func newFixture(t *testing.T, s setup, objs ...runtime.Object) *fixture {
	t.Helper()
	if s.ranges == "" {
		s.ranges = testCIDR4 + "," + testCIDR6
	}
	cidrs := s.cidrs
	if cidrs == nil {
		cidrs = []string{testCIDR4, testCIDR6}
	}
	d := daemon.StartForTest(t, func(c *daemon.Config) {
		c.ServiceClusterIPRange = s.ranges
		if s.nodePorts != "" {
			c.ServiceNodePortRange = s.nodePorts
		}
	})
	c, err := client.New(d.GRPCAddr())
	if err != nil {
		t.Fatalf("client.New(%q) = %v", d.GRPCAddr(), err)
	}
	t.Cleanup(func() { c.Close() })
	objs = append(objs, &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: defaultServiceCIDR},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}})
	f := &fixture{t: t, c: c, kube: fake.NewClientset(objs...), reg: prometheus.NewRegistry()}
	factory := informers.NewSharedInformerFactory(f.kube, 0)
	if f.cluster, err = NewCluster(f.kube, factory); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if f.w, err = New(log, c, f.cluster, f.reg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	t.Cleanup(func() { cancel(); factory.Shutdown() })
	waitFor(t, "the informers synced", f.cluster.Synced)
	return f
}

// review is one admission: the request, the answer, and the object with the patch
// applied.
type review struct {
	req     *admissionv1.AdmissionRequest
	resp    *admissionv1.AdmissionResponse
	result  string
	err     error
	patched *corev1.Service
}

// admit sends svc (an update of old when old is set) through the webhook, as
// kube-apiserver would, with a request uid of its own.
func (f *fixture) admit(svc, old *corev1.Service, dryRun bool) review {
	f.t.Helper()
	f.uids++
	req := &admissionv1.AdmissionRequest{
		UID:       types.UID("req-" + f.t.Name() + "-" + itoa(f.uids)),
		Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Service"},
		Resource:  servicesResource,
		Namespace: svc.Namespace, Name: svc.Name,
		Operation: admissionv1.Create,
		Object:    runtime.RawExtension{Raw: mustJSON(f.t, svc)},
		DryRun:    &dryRun,
	}
	if old != nil {
		req.Operation = admissionv1.Update
		req.OldObject = runtime.RawExtension{Raw: mustJSON(f.t, old)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := review{req: req}
	r.resp, r.result, r.err = f.w.Admit(ctx, req)
	r.patched = svc.DeepCopy()
	if r.err == nil && r.resp.Allowed && len(r.resp.Patch) > 0 {
		p, err := jsonpatch.DecodePatch(r.resp.Patch)
		if err != nil {
			f.t.Fatalf("patch %s: %v", r.resp.Patch, err)
		}
		out, err := p.Apply(mustJSON(f.t, svc))
		if err != nil {
			f.t.Fatalf("apply patch %s: %v", r.resp.Patch, err)
		}
		r.patched = &corev1.Service{}
		if err := json.Unmarshal(out, r.patched); err != nil {
			f.t.Fatal(err)
		}
	}
	return r
}

// owner is the provisional owner of r.
func (r review) owner() string { return ProvisionalPrefix + string(r.req.UID) }

// holder returns allocd's holder UID of a ClusterIP or node port ("" when free).
func (f *fixture) holder(ip string, port int32) string {
	f.t.Helper()
	req := &allocdv1.GetAllocationRequest{Target: &allocdv1.GetAllocationRequest_NodePort{NodePort: port}}
	if ip != "" {
		req.Target = &allocdv1.GetAllocationRequest_ClusterIp{ClusterIp: ip}
	}
	al, err := f.c.GetAllocation(context.Background(), req)
	if err != nil {
		return ""
	}
	return al.GetOwner().GetUid()
}

// holderOwner returns allocd's holder of item, a ClusterIP or a node port; nil when free.
func (f *fixture) holderOwner(item string) *allocdv1.Owner {
	f.t.Helper()
	req := &allocdv1.GetAllocationRequest{Target: &allocdv1.GetAllocationRequest_ClusterIp{ClusterIp: item}}
	if p, err := strconv.Atoi(item); err == nil {
		req.Target = &allocdv1.GetAllocationRequest_NodePort{NodePort: int32(p)}
	}
	al, err := f.c.GetAllocation(context.Background(), req)
	if err != nil {
		return nil
	}
	return al.GetOwner()
}

// allocation returns allocd's allocation of a ClusterIP; nil when free.
func (f *fixture) allocation(ip string) *allocdv1.Allocation {
	f.t.Helper()
	al, err := f.c.GetAllocation(context.Background(), &allocdv1.GetAllocationRequest{
		Target: &allocdv1.GetAllocationRequest_ClusterIp{ClusterIp: ip}})
	if err != nil {
		return nil
	}
	return al
}

// held returns every allocation of owner uid: ClusterIPs and node ports as strings.
func (f *fixture) held(uid string) []string {
	f.t.Helper()
	resp, err := f.c.ListAllocations(context.Background(), &allocdv1.ListAllocationsRequest{OwnerUid: uid})
	if err != nil {
		f.t.Fatalf("ListAllocations(%s) = %v", uid, err)
	}
	var out []string
	for _, al := range resp.GetAllocations() {
		if al.GetClusterIp() != "" {
			out = append(out, al.GetClusterIp())
		} else {
			out = append(out, itoa(int(al.GetNodePort())))
		}
	}
	return out
}

// take allocates ClusterIPs and node ports in allocd for another owner.
func (f *fixture) take(uid string, ips []string, ports []int32) {
	f.t.Helper()
	_, err := f.c.Allocate(context.Background(), &allocdv1.AllocateRequest{
		Owner:      &allocdv1.Owner{Namespace: "other", Name: uid, Uid: uid},
		ClusterIps: ips, NodePorts: ports, NoClusterIp: len(ips) == 0})
	if err != nil {
		f.t.Fatalf("Allocate(%v %v) for %s = %v", ips, ports, uid, err)
	}
}

// hold allocates in allocd what svc, a Service of the cluster, holds: ips (as strings:
// items as allocd names them; node ports among them are allocated as node ports) and
// ports, under its UID.
func (f *fixture) hold(svc *corev1.Service, ips []string, ports []int32) {
	f.t.Helper()
	req := &allocdv1.AllocateRequest{Owner: ownerOf(svc)}
	for _, it := range ips {
		if p, err := strconv.Atoi(it); err == nil {
			req.NodePorts = append(req.NodePorts, int32(p))
		} else {
			req.ClusterIps = append(req.ClusterIps, it)
		}
	}
	req.NodePorts = append(req.NodePorts, ports...)
	req.NoClusterIp = len(req.ClusterIps) == 0
	if _, err := f.c.Allocate(context.Background(), req); err != nil {
		f.t.Fatalf("Allocate(%v %v) for %s = %v", req.ClusterIps, req.NodePorts, svc.UID, err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func itoa(i int) string { return strconv.Itoa(i) }

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
