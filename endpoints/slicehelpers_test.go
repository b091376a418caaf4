package endpoints

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"testing"

	"github.com/allocd/allocd/endpoints/endpointslice"
	"github.com/allocd/allocd/endpoints/kube"
	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// newSliceHarness starts etcd and the EndpointSlice controller alone (Endpoints off);
// existing slices are stored before the term starts.
func newSliceHarness(t *testing.T, cfg Config, existing ...*kube.EndpointSlice) *harness {
	t.Helper()
	e := etcdtest.New(t)
	h := &harness{t: t, etcd: e, cli: e.Client}
	for _, s := range existing {
		h.storeSlice(s)
	}
	cfg.Prefix = testPrefix
	cfg.DisableEndpoints = true
	c, err := New(e.Client, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.c = c
	h.lead()
	return h
}

// storeSlice writes s as it is into etcd.
func (h *harness) storeSlice(s *kube.EndpointSlice) {
	h.t.Helper()
	if _, err := h.cli.Put(etcdtest.Context(h.t), h.c0().sliceKey(s.Namespace, s.Service, s.Name),
		string(encodeSlice(s))); err != nil {
		h.t.Fatal(err)
	}
}

// c0 is a Controller for key names before h.c exists.
func (h *harness) c0() *Controller {
	if h.c != nil {
		return h.c
	}
	return &Controller{slicePrefix: testPrefix + "/endpointslices/"}
}

// sliceSnapshots pushes a Service, a Node and a Pod snapshot.
func (h *harness) sliceSnapshots(rev int64, svcs []*kube.Service, nodes []*kube.Node, pods []*kube.Pod) {
	h.t.Helper()
	ctx := etcdtest.Context(h.t)
	if err := h.c.ApplyServiceSnapshot(ctx, rev, svcs); err != nil {
		h.t.Fatalf("ApplyServiceSnapshot: %v", err)
	}
	if err := h.c.ApplyNodeSnapshot(ctx, rev, nodes); err != nil {
		h.t.Fatalf("ApplyNodeSnapshot: %v", err)
	}
	if err := h.c.ApplyPodSnapshot(ctx, rev, pods); err != nil {
		h.t.Fatalf("ApplyPodSnapshot: %v", err)
	}
}

// slices lists the stored slices of one Service, sorted by name.
func (h *harness) slices(ns, svc string) []*kube.EndpointSlice {
	h.t.Helper()
	out, next, _, err := h.c.ListSlices(etcdtest.Context(h.t), ns, svc, MaxPageSize, "")
	if err != nil || next != "" {
		h.t.Fatalf("ListSlices(%s/%s) = %v, next %q", ns, svc, err, next)
	}
	return out
}

// sizes returns the endpoint counts of slices, sorted.
func sizes(sl []*kube.EndpointSlice) []int {
	var out []int
	for _, s := range sl {
		out = append(out, len(s.Endpoints))
	}
	sort.Ints(out)
	return out
}

// changes compares the slices after a sync with those before: names created, updated
// (same name, new revision) and deleted.
func changes(before, after []*kube.EndpointSlice) (created, updated, deleted int) {
	old := map[string]int64{}
	for _, s := range before {
		old[s.Name] = s.Revision
	}
	now := map[string]bool{}
	for _, s := range after {
		now[s.Name] = true
		switch rev, ok := old[s.Name]; {
		case !ok:
			created++
		case rev != s.Revision:
			updated++
		}
	}
	for name := range old {
		if !now[name] {
			deleted++
		}
	}
	return created, updated, deleted
}

// testNodes are Nodes node-0 ... node-(n-1), in zones zone-a, zone-b, ... by i mod zones,
// ready, with 4 CPUs each.
func testNodes(n, zones int) []*kube.Node {
	var out []*kube.Node
	for i := range n {
		out = append(out, &kube.Node{Name: "node-" + strconv.Itoa(i), ResourceVersion: "1",
			Labels: map[string]string{kube.LabelZone: "zone-" + string(rune('a'+i%zones))}, Ready: true,
			AllocatableCPUMillis: 4000})
	}
	return out
}

// slicePod is testPod on Node node-(n mod nodes).
func slicePod(ns string, n int, ready bool, nPorts, nodes int) *kube.Pod {
	p := testPod(ns, n, ready, nPorts)
	p.PodIPs = []string{fmt.Sprintf("10.%d.%d.%d", n/65536%256, n/256%256, n%256)}
	p.NodeName = "node-" + strconv.Itoa(n%nodes)
	return p
}

// slicePods are n ready slicePods.
func slicePods(ns string, n, nodes int) []*kube.Pod {
	var out []*kube.Pod
	for i := range n {
		out = append(out, slicePod(ns, i, true, 1, nodes))
	}
	return out
}

// sliceService is testService with a cluster IP (not headless) of IPv4, and a label.
func sliceService(ns string) *kube.Service {
	svc := testService(ns)
	svc.ClusterIPs = []string{"10.96.0.10"}
	svc.IPFamilies = []string{kube.FamilyIPv4}
	svc.Labels = map[string]string{"app": "foo"}
	return svc
}

// ownSlice is a slice the controller would have written for svc, with the endpoints of
// pods (IPv4, on Nodes of zone-a), its numbered target ports (80 -> 8080) resolved and
// sorted as the controller writes them (EndpointPorts on a Pod without ports).
func ownSlice(svc *kube.Service, name string, pods []*kube.Pod) *kube.EndpointSlice {
	labels := map[string]string{}
	for k, v := range svc.Labels {
		if k != kube.LabelHeadless && k != kube.LabelServiceName && k != kube.LabelSliceManagedBy {
			labels[k] = v
		}
	}
	if svc.Headless() {
		labels[kube.LabelHeadless] = ""
	}
	labels[kube.LabelServiceName] = svc.Name
	labels[kube.LabelSliceManagedBy] = kube.SliceControllerName
	s := &kube.EndpointSlice{Namespace: svc.Namespace, Service: svc.Name, Name: name, Labels: labels,
		AddressType: kube.AddressTypeIPv4, ServiceUID: svc.UID,
		Ports: endpointslice.EndpointPorts(svc, &kube.Pod{})}
	for _, p := range pods {
		node := &kube.Node{Name: p.NodeName, Labels: map[string]string{kube.LabelZone: "zone-a"}}
		s.Endpoints = append(s.Endpoints, endpointslice.Endpoint(svc, p, node, kube.AddressTypeIPv4))
	}
	return s
}

// endpointNames returns the Pod names of the endpoints of every slice, sorted.
func endpointNames(sl []*kube.EndpointSlice) []string {
	var out []string
	for _, s := range sl {
		for _, e := range s.Endpoints {
			out = append(out, e.TargetRef.Name)
		}
	}
	slices.Sort(out)
	return out
}

// labelsOf returns the labels of every slice, which must be the same.
func labelsOf(t *testing.T, sl []*kube.EndpointSlice) map[string]string {
	t.Helper()
	for _, s := range sl[1:] {
		if !maps.Equal(s.Labels, sl[0].Labels) {
			t.Errorf("slices %s and %s have different labels: %v, %v", sl[0].Name, s.Name, sl[0].Labels,
				s.Labels)
		}
	}
	return sl[0].Labels
}
