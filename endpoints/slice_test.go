package endpoints

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/allocd/allocd/endpoints/endpointslice"
	"github.com/allocd/allocd/endpoints/kube"
	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// The cases of k8s.io/endpointslice's reconciler_test.go, run through
// the controller on a real etcd: existing slices stored before the term, snapshots
// pushed, the slices read back. "writes" are what the sync did to the stored slices,
// by name: created, updated (new revision), deleted.

// reconcileCase is one case: a Service, its Pods on one Node (zone-a), the slices
// stored before, and what the stored slices must be after.
type reconcileCase struct {
	name     string
	svc      *kube.Service
	pods     []*kube.Pod
	existing func(svc *kube.Service, pods []*kube.Pod) []*kube.EndpointSlice
	max      int
	// want: the endpoint counts of the slices, sorted; the writes.
	sizes                     []int
	created, updated, deleted int
}

func chunk(svc *kube.Service, pods []*kube.Pod, names []string, sizes ...int) []*kube.EndpointSlice {
	var out []*kube.EndpointSlice
	for i, n := range sizes {
		out = append(out, ownSlice(svc, names[i], pods[:n]))
		pods = pods[n:]
	}
	return out
}

func TestReconcileCases(t *testing.T) {
	svc := sliceService("ns")
	var names []string
	for i := range 10 {
		names = append(names, fmt.Sprintf("foo-x%04d", i))
	}
	for _, tc := range []reconcileCase{
		// TestReconcileEmpty: no Pods, one placeholder without ports or endpoints.
		{name: "empty", svc: svc, sizes: []int{0}, created: 1},
		// TestReconcile1Pod (ipv4 with cluster IP): one slice, one endpoint.
		{name: "one pod", svc: svc, pods: slicePods("ns", 1, 1), sizes: []int{1}, created: 1},
		// TestReconcileManyPods: 250 Pods, nothing stored: 100/100/50.
		{name: "many pods", svc: svc, pods: slicePods("ns", 250, 1), sizes: []int{50, 100, 100}, created: 3},
		// ...SomePreexisting: 62 and 61 stored and desired, 250 Pods: 127 new ones
		// fill a new slice and 27 go to the 62: 89/61/100, one create and one update.
		{name: "some preexisting", svc: svc, pods: slicePods("ns", 250, 1),
			existing: func(s *kube.Service, p []*kube.Pod) []*kube.EndpointSlice {
				return chunk(s, p, names, 62, 61)
			},
			sizes: []int{61, 89, 100}, created: 1, updated: 1},
		// ...SomePreexistingWorseAllocation: 74 and 74 stored, 300 Pods: 74/74/100/52.
		{name: "some preexisting worse allocation", svc: svc, pods: slicePods("ns", 300, 1),
			existing: func(s *kube.Service, p []*kube.Pod) []*kube.EndpointSlice {
				return chunk(s, p, names, 74, 74)
			},
			sizes: []int{52, 74, 74, 100}, created: 2},
		// ...UpdatePacking: 80 and 5 stored, 15 new Pods go to the fuller one (the
		// unchanged slice they fit best): 95/5.
		{name: "update packing", svc: svc, pods: slicePods("ns", 100, 1),
			existing: func(s *kube.Service, p []*kube.Pod) []*kube.EndpointSlice {
				return chunk(s, p, names, 80, 5)
			},
			sizes: []int{5, 95}, updated: 1},
		// TestReconcile1EndpointSlice: a stored placeholder and no Pods: nothing written.
		{name: "placeholder kept", svc: svc,
			existing: func(s *kube.Service, _ []*kube.Pod) []*kube.EndpointSlice {
				ph := ownSlice(s, "foo-x0000", nil)
				ph.Ports = nil
				return []*kube.EndpointSlice{ph}
			}, sizes: []int{0}},
		// ...Recreation: a slice of an earlier Service of the same name is deleted and
		// a new one created (never recycled: it is not the Service's).
		{name: "recreation", svc: svc, pods: slicePods("ns", 10, 1),
			existing: func(s *kube.Service, p []*kube.Pod) []*kube.EndpointSlice {
				old := *s
				old.UID = "an-earlier-uid"
				return []*kube.EndpointSlice{ownSlice(&old, "foo-x0000", p)}
			}, sizes: []int{10}, created: 1, deleted: 1},
		// ...Recycling: ten slices of 30 whose port changed: three updated to
		// 100/100/100 and seven deleted.
		{name: "recycling", svc: svc, pods: slicePods("ns", 300, 1),
			existing: func(s *kube.Service, p []*kube.Pod) []*kube.EndpointSlice {
				sl := chunk(s, p, names, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30)
				for _, x := range sl {
					x.Ports[0].Port = 9090
				}
				return sl
			}, sizes: []int{100, 100, 100}, updated: 3, deleted: 7},
		// TestReconcileMaxEndpointsPerSlice: 250 Pods under max 50, 80, 150, 250.
		{name: "max 50", svc: svc, pods: slicePods("ns", 250, 1), max: 50, sizes: []int{50, 50, 50, 50, 50},
			created: 5},
		{name: "max 80", svc: svc, pods: slicePods("ns", 250, 1), max: 80, sizes: []int{10, 80, 80, 80},
			created: 4},
		{name: "max 150", svc: svc, pods: slicePods("ns", 250, 1), max: 150, sizes: []int{100, 150},
			created: 2},
		{name: "max 250", svc: svc, pods: slicePods("ns", 250, 1), max: 250, sizes: []int{250}, created: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var existing []*kube.EndpointSlice
			if tc.existing != nil {
				existing = tc.existing(tc.svc, tc.pods)
			}
			h := newSliceHarness(t, Config{MaxEndpointsPerSlice: tc.max}, existing...)
			before := h.slices(tc.svc.Namespace, tc.svc.Name)
			h.sliceSnapshots(1, []*kube.Service{tc.svc}, testNodes(1, 1), tc.pods)
			h.settle()
			after := h.slices(tc.svc.Namespace, tc.svc.Name)
			if got := sizes(after); !slices.Equal(got, tc.sizes) {
				t.Errorf("slice sizes = %v; want %v", got, tc.sizes)
			}
			c, u, d := changes(before, after)
			if c != tc.created || u != tc.updated || d != tc.deleted {
				t.Errorf("writes: %d created, %d updated, %d deleted; want %d, %d, %d", c, u, d, tc.created,
					tc.updated, tc.deleted)
			}
			var want []string
			for _, p := range tc.pods {
				want = append(want, p.Name)
			}
			slices.Sort(want)
			if got := endpointNames(after); !slices.Equal(got, want) {
				t.Errorf("endpoints of %d Pods; want each of the %d Pods once", len(got), len(want))
			}
			checkSlices(t, tc.svc, after, cmpOr(tc.max, DefaultMaxEndpointsPerSlice))
		})
	}
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

// checkSlices checks what every slice of svc must be: its labels, owner, address type,
// at most max endpoints, a name that starts with the Service's and a dash.
func checkSlices(t *testing.T, svc *kube.Service, sl []*kube.EndpointSlice, max int) {
	t.Helper()
	wantLabels := map[string]string{kube.LabelServiceName: svc.Name,
		kube.LabelSliceManagedBy: kube.SliceControllerName}
	for k, v := range svc.Labels {
		wantLabels[k] = v
	}
	if svc.Headless() {
		wantLabels[kube.LabelHeadless] = ""
	}
	for _, s := range sl {
		if !maps.Equal(s.Labels, wantLabels) || s.ServiceUID != svc.UID || len(s.Endpoints) > max ||
			len(s.Name) != len(svc.Name)+6 || s.Name[:len(svc.Name)+1] != svc.Name+"-" {
			t.Errorf("slice %s: labels %v, owner %s, %d endpoints; want %v, %s, at most %d, a name %s-xxxxx",
				s.Name, s.Labels, s.ServiceUID, len(s.Endpoints), wantLabels, svc.UID, max, svc.Name)
		}
	}
}

// TestReconcileNamedPorts: 300 Pods whose named target port resolves to five numbers
// make five groups of 60, one slice each.
func TestReconcileNamedPorts(t *testing.T) {
	svc := sliceService("ns")
	svc.Ports[0].TargetPort = kube.TargetPort{Name: "http"}
	var pods []*kube.Pod
	for i := range 300 {
		p := slicePod("ns", i, true, 0, 1)
		p.Containers = []kube.Container{{Name: "c", Ports: []kube.ContainerPort{{Name: "http",
			ContainerPort: int32(8080 + i%5), Protocol: kube.ProtocolTCP}}}}
		pods = append(pods, p)
	}
	h := newSliceHarness(t, Config{})
	h.sliceSnapshots(1, []*kube.Service{svc}, testNodes(1, 1), pods)
	h.settle()
	sl := h.slices("ns", "foo")
	if got := sizes(sl); !slices.Equal(got, []int{60, 60, 60, 60, 60}) {
		t.Fatalf("slice sizes = %v; want five of 60", got)
	}
	ports := map[int32]bool{}
	for _, s := range sl {
		if len(s.Ports) != 1 {
			t.Fatalf("slice %s ports %v; want one", s.Name, s.Ports)
		}
		ports[s.Ports[0].Port] = true
	}
	if len(ports) != 5 {
		t.Errorf("ports of the slices %v; want 8080-8084", ports)
	}
}

// TestReconcileDualStackAndConditions: a dual-stack Service gets IPv4 and IPv6 slices;
// conditions follow TestPodToEndpoint's table (ready T/T/F, unready F/F/F, terminating
// ready F/T/T, terminating unready F/F/T; with publishNotReadyAddresses ready is T);
// a Pod on an unknown Node is left out (and tried again), zones come from Nodes,
// hostnames from Pods that name the Service as subdomain.
func TestReconcileDualStackAndConditions(t *testing.T) {
	svc := sliceService("ns")
	svc.ClusterIPs = []string{"10.96.0.10", "fd00::10"}
	svc.IPFamilies = []string{kube.FamilyIPv4, kube.FamilyIPv6}
	pods := []*kube.Pod{
		slicePod("ns", 0, true, 1, 2), slicePod("ns", 1, false, 1, 2),
		slicePod("ns", 2, true, 1, 2), slicePod("ns", 3, false, 1, 2),
		slicePod("ns", 4, true, 1, 2),
	}
	pods[2].Deleting, pods[3].Deleting = true, true
	pods[4].NodeName = "node-unknown"
	pods[0].Hostname, pods[0].Subdomain = "h0", "foo"
	for i, p := range pods {
		p.PodIPs = append(p.PodIPs, fmt.Sprintf("fd00::%d", i+1))
	}
	h := newSliceHarness(t, Config{})
	h.sliceSnapshots(1, []*kube.Service{svc}, testNodes(2, 2), pods)
	// Not h.settle: the Service is retried (with backoff) while a Pod's Node is unknown.
	etcdtest.WaitFor(t, 5*time.Second, "the slices", func() bool {
		return len(endpointNames(h.slices("ns", "foo"))) == 8
	})
	sl := h.slices("ns", "foo")
	byType := map[string][]*kube.EndpointSlice{}
	for _, s := range sl {
		byType[s.AddressType] = append(byType[s.AddressType], s)
	}
	if len(byType[kube.AddressTypeIPv4]) != 1 || len(byType[kube.AddressTypeIPv6]) != 1 {
		t.Fatalf("slices by address type %v; want one IPv4 and one IPv6", sizes(sl))
	}
	want := map[string][3]bool{"pod0": {true, true, false}, "pod1": {false, false, false},
		"pod2": {false, true, true}, "pod3": {false, false, true}}
	for at, ss := range byType {
		eps := ss[0].Endpoints
		if len(eps) != 4 {
			t.Errorf("%s slice has %d endpoints; want 4 (the Pod on an unknown Node left out)", at, len(eps))
		}
		for _, e := range eps {
			name := e.TargetRef.Name
			w := want[name]
			if got := [3]bool{*e.Ready, *e.Serving, *e.Terminating}; got != w {
				t.Errorf("%s %s conditions (ready, serving, terminating) = %v; want %v", at, name, got, w)
			}
			if len(e.Addresses) != 1 || kube.IsIPv6(e.Addresses[0]) != (at == kube.AddressTypeIPv6) {
				t.Errorf("%s %s addresses %v; want one of its family", at, name, e.Addresses)
			}
			wantZone := "zone-" + string(rune('a'+int(name[3]-'0')%2))
			if e.Zone != wantZone || e.NodeName == "" {
				t.Errorf("%s %s zone %q node %q; want %s and its node", at, name, e.Zone, e.NodeName,
					wantZone)
			}
			if (e.Hostname == "h0") != (name == "pod0") {
				t.Errorf("%s %s hostname %q", at, name, e.Hostname)
			}
		}
	}
	// The Node arrives: the Service is synced again, without waiting for a retry.
	h.events(Event{Type: Upsert, Revision: 2, Node: &kube.Node{Name: "node-unknown", ResourceVersion: "2",
		Labels: map[string]string{kube.LabelZone: "zone-c"}, Ready: true, AllocatableCPUMillis: 1000}})
	etcdtest.WaitFor(t, 5*time.Second, "the Pod of the new Node in the slices", func() bool {
		return len(endpointNames(h.slices("ns", "foo"))) == 10
	})

	// publishNotReadyAddresses: every endpoint ready.
	svc2 := *svc
	svc2.PublishNotReadyAddresses = true
	h.events(Event{Type: Upsert, Revision: 3, Service: &svc2})
	etcdtest.WaitFor(t, 5*time.Second, "every endpoint ready", func() bool {
		for _, s := range h.slices("ns", "foo") {
			for _, e := range s.Endpoints {
				if !*e.Ready {
					return false
				}
			}
		}
		return true
	})
}

// TestReconcileLabels: a change of the Service's labels updates every slice;
// the reserved labels of a Service are not copied and change nothing.
func TestReconcileLabels(t *testing.T) {
	svc := sliceService("ns")
	h := newSliceHarness(t, Config{MaxEndpointsPerSlice: 10})
	h.sliceSnapshots(1, []*kube.Service{svc}, testNodes(1, 1), slicePods("ns", 30, 1))
	h.settle()
	before := h.slices("ns", "foo")
	if len(before) != 3 {
		t.Fatalf("%d slices; want 3", len(before))
	}
	reserved := *svc
	reserved.Labels = map[string]string{"app": "foo", kube.LabelServiceName: "evil",
		kube.LabelSliceManagedBy: "evil"}
	h.events(Event{Type: Upsert, Revision: 2, Service: &reserved})
	h.settle()
	if c, u, d := changes(before, h.slices("ns", "foo")); c+u+d != 0 {
		t.Errorf("reserved labels on the Service: %d, %d, %d writes; want none", c, u, d)
	}
	relabelled := *svc
	relabelled.Labels = map[string]string{"app": "foo", "tier": "web"}
	h.events(Event{Type: Upsert, Revision: 3, Service: &relabelled})
	h.settle()
	after := h.slices("ns", "foo")
	if c, u, d := changes(before, after); c != 0 || u != 3 || d != 0 {
		t.Errorf("a new Service label: %d created, %d updated, %d deleted; want 0, 3, 0", c, u, d)
	}
	if got := labelsOf(t, after); got["tier"] != "web" {
		t.Errorf("labels %v; want tier=web", got)
	}
}

// TestReconcileHeadlessNoPorts: a headless Service without ports gets one slice of no
// ports, and a second sync writes nothing (#133474).
func TestReconcileHeadlessNoPorts(t *testing.T) {
	svc := testService("ns")
	svc.ClusterIPs = []string{"None"}
	svc.IPFamilies = []string{kube.FamilyIPv4}
	svc.Ports = nil
	h := newSliceHarness(t, Config{})
	h.sliceSnapshots(1, []*kube.Service{svc}, testNodes(1, 1), slicePods("ns", 3, 1))
	h.settle()
	sl := h.slices("ns", "foo")
	if len(sl) != 1 || len(sl[0].Ports) != 0 || len(sl[0].Endpoints) != 3 ||
		sl[0].Labels[kube.LabelHeadless] != "" {
		t.Fatalf("slices %v; want one headless slice of 3 endpoints and no ports", sl)
	}
	rev := h.rev()
	h.sliceSnapshots(2, []*kube.Service{svc}, testNodes(1, 1), slicePods("ns", 3, 1))
	h.settle()
	if got := h.rev(); got != rev {
		t.Errorf("a second sync wrote (revision %d -> %d); want nothing", rev, got)
	}
}

// TestReconcileTrafficDistribution: PreferClose hints every ready endpoint with its
// zone, PreferSameNode also with its node; the Auto annotation wins over
// trafficDistribution; with neither, hints are removed.
func TestReconcileTrafficDistribution(t *testing.T) {
	svc := sliceService("ns")
	svc.TrafficDistribution = kube.TrafficPreferClose
	pods := slicePods("ns", 12, 3)
	pods[0].Ready = false
	h := newSliceHarness(t, Config{})
	h.sliceSnapshots(1, []*kube.Service{svc}, testNodes(3, 3), pods)
	h.settle()
	check := func(stage string, want func(e *kube.SliceEndpoint) *kube.Hints) {
		t.Helper()
		for _, s := range h.slices("ns", "foo") {
			for i := range s.Endpoints {
				e := &s.Endpoints[i]
				w := want(e)
				if (e.Hints == nil) != (w == nil) || w != nil &&
					(!slices.Equal(e.Hints.ForZones, w.ForZones) ||
						!slices.Equal(e.Hints.ForNodes, w.ForNodes)) {
					t.Errorf("%s: %s hints %+v; want %+v", stage, e.TargetRef.Name, e.Hints, w)
				}
			}
		}
	}
	check("PreferClose", func(e *kube.SliceEndpoint) *kube.Hints {
		if !endpointslice.EndpointReady(e) {
			return nil
		}
		return &kube.Hints{ForZones: []string{e.Zone}}
	})
	sameNode := *svc
	sameNode.TrafficDistribution = kube.TrafficPreferSameNode
	h.events(Event{Type: Upsert, Revision: 2, Service: &sameNode})
	h.settle()
	check("PreferSameNode", func(e *kube.SliceEndpoint) *kube.Hints {
		if !endpointslice.EndpointReady(e) {
			return nil
		}
		return &kube.Hints{ForZones: []string{e.Zone}, ForNodes: []string{e.NodeName}}
	})
	none := *svc
	none.TrafficDistribution = ""
	h.events(Event{Type: Upsert, Revision: 3, Service: &none})
	h.settle()
	check("none", func(*kube.SliceEndpoint) *kube.Hints { return nil })
}

// TestReconcileTopology: the Auto annotation with three zones of equal CPU and 12 ready
// endpoints, 4 a zone: every ready endpoint is hinted for its zone, 4 per zone.
func TestReconcileTopology(t *testing.T) {
	svc := sliceService("ns")
	svc.Annotations = map[string]string{kube.AnnotationTopologyMode: "Auto"}
	svc.TrafficDistribution = kube.TrafficPreferSameNode // Auto wins
	h := newSliceHarness(t, Config{})
	h.sliceSnapshots(1, []*kube.Service{svc}, testNodes(3, 3), slicePods("ns", 12, 3))
	h.settle()
	perZone := map[string]int{}
	for _, s := range h.slices("ns", "foo") {
		for _, e := range s.Endpoints {
			if e.Hints == nil || len(e.Hints.ForZones) != 1 || len(e.Hints.ForNodes) != 0 {
				t.Fatalf("%s hints %+v; want one zone", e.TargetRef.Name, e.Hints)
			}
			perZone[e.Hints.ForZones[0]]++
		}
	}
	if !maps.Equal(perZone, map[string]int{"zone-a": 4, "zone-b": 4, "zone-c": 4}) {
		t.Errorf("hints per zone %v; want 4 each", perZone)
	}
	// One zone's Nodes lose their zone label: not enough information, hints removed.
	h.events(Event{Type: Upsert, Revision: 2, Node: &kube.Node{Name: "node-2", ResourceVersion: "2",
		Ready: true, AllocatableCPUMillis: 4000}})
	etcdtest.WaitFor(t, 5*time.Second, "hints removed", func() bool {
		for _, s := range h.slices("ns", "foo") {
			for _, e := range s.Endpoints {
				if e.Hints != nil {
					return false
				}
			}
		}
		return true
	})
}

// TestSliceRewritesNothing: a leader change, a re-pushed snapshot and a readiness flip:
// the new term writes nothing that did not change; the flip writes one slice, once.
func TestSliceRewritesNothing(t *testing.T) {
	svc := sliceService("ns")
	pods := slicePods("ns", 250, 1)
	h := newSliceHarness(t, Config{})
	h.sliceSnapshots(1, []*kube.Service{svc}, testNodes(1, 1), pods)
	h.settle()
	rev := h.rev()
	if err := h.stop(); err != nil {
		t.Fatalf("Lead() = %v", err)
	}
	h.lead()
	rev = h.rev() // lead writes its election key
	h.sliceSnapshots(2, []*kube.Service{svc}, testNodes(1, 1), pods)
	h.settle()
	h.sliceSnapshots(3, []*kube.Service{svc}, testNodes(1, 1), pods)
	h.settle()
	if got := h.rev(); got != rev {
		t.Errorf("a new term and two snapshots wrote (revision %d -> %d); want nothing", rev, got)
	}
	before := h.slices("ns", "foo")
	flip := *pods[7]
	flip.Ready, flip.ResourceVersion = false, "2"
	h.events(Event{Type: Upsert, Revision: 4, Pod: &flip})
	h.settle()
	if c, u, d := changes(before, h.slices("ns", "foo")); c != 0 || u != 1 || d != 0 {
		t.Errorf("a readiness flip: %d created, %d updated, %d deleted; want one update", c, u, d)
	}
	if got := h.rev(); got != rev+1 {
		t.Errorf("a readiness flip took %d revisions; want 1", got-rev)
	}
}

// TestSliceServiceDeleted: deleting the Service deletes its slices, in one revision;
// slices of Services gone while no leader ran are swept by the next term.
func TestSliceServiceDeleted(t *testing.T) {
	svc, other := sliceService("ns"), sliceService("ns")
	other.Name, other.UID = "bar", "uid-bar"
	h := newSliceHarness(t, Config{MaxEndpointsPerSlice: 10})
	h.sliceSnapshots(1, []*kube.Service{svc, other}, testNodes(1, 1), slicePods("ns", 30, 1))
	h.settle()
	if len(h.slices("ns", "foo")) != 3 || len(h.slices("ns", "bar")) != 3 {
		t.Fatalf("slices of foo and bar: %d, %d; want 3 each", len(h.slices("ns", "foo")),
			len(h.slices("ns", "bar")))
	}
	rev := h.rev()
	h.events(Event{Type: Delete, Revision: 2, Service: &kube.Service{Namespace: "ns", Name: "foo"}})
	h.settle()
	if n := len(h.slices("ns", "foo")); n != 0 || h.rev() != rev+1 {
		t.Errorf("after the Service's delete: %d slices, %d revisions; want 0 in one", n, h.rev()-rev)
	}
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	h.lead()
	h.sliceSnapshots(3, nil, testNodes(1, 1), slicePods("ns", 30, 1))
	h.settle()
	if n := len(h.slices("ns", "bar")); n != 0 {
		t.Errorf("%d slices of bar, gone while no term ran; want the sweep to delete them", n)
	}
}

// TestSliceNodeEventsNeedSnapshot: a Node event before a Node snapshot, and a heartbeat
// while the slices lack one, are SnapshotRequiredError of kind Node.
func TestSliceNodeEventsNeedSnapshot(t *testing.T) {
	h := newSliceHarness(t, Config{})
	ctx := etcdtest.Context(t)
	if err := h.c.ApplyServiceSnapshot(ctx, 1, nil); err != nil {
		t.Fatal(err)
	}
	if err := h.c.ApplyPodSnapshot(ctx, 1, nil); err != nil {
		t.Fatal(err)
	}
	for _, evs := range [][]Event{nil, {{Type: Upsert, Revision: 2, Node: &kube.Node{Name: "n"}}}} {
		_, err := h.c.ApplyEvents(ctx, evs)
		var req *SnapshotRequiredError
		if !errors.As(err, &req) || req.Kind != KindNode {
			t.Errorf("ApplyEvents(%d events) = %v; want a SnapshotRequiredError of Node", len(evs), err)
		}
	}
}

// TestSliceAcceptance is issue 21's acceptance scenario: a dual-stack Service with a
// named target port, 250 ready Pods on Nodes in two zones, some terminating: three
// IPv4 and three IPv6 slices of at most 100, zones filled, terminating endpoints
// ready=false, serving=<Ready>, terminating=true. A Pod turning not ready is exactly
// one slice MODIFIED on a running watch; no endpoint is ever in two slices of a group.
func TestSliceAcceptance(t *testing.T) {
	svc := sliceService("ns")
	svc.ClusterIPs = []string{"10.96.0.10", "fd00::10"}
	svc.IPFamilies = []string{kube.FamilyIPv4, kube.FamilyIPv6}
	svc.Ports[0].TargetPort = kube.TargetPort{Name: "http"}
	var pods []*kube.Pod
	for i := range 250 {
		p := slicePod("ns", i, true, 0, 4)
		p.PodIPs = append(p.PodIPs, fmt.Sprintf("fd00::%x", i+1))
		p.Containers = []kube.Container{{Name: "c", Ports: []kube.ContainerPort{{Name: "http",
			ContainerPort: 8080, Protocol: kube.ProtocolTCP}}}}
		p.Deleting = i%25 == 0
		p.Ready = !(i%50 == 0) // half of the terminating ones still ready
		pods = append(pods, p)
	}
	h := newSliceHarness(t, Config{})
	h.sliceSnapshots(1, []*kube.Service{svc}, testNodes(4, 2), pods)
	h.settle()
	sl := h.slices("ns", "foo")
	perType := map[string][]int{}
	for _, s := range sl {
		perType[s.AddressType] = append(perType[s.AddressType], len(s.Endpoints))
		if len(s.Ports) != 1 || s.Ports[0].Port != 8080 || s.Ports[0].Name != "" {
			t.Errorf("slice %s ports %+v; want the named port resolved to 8080", s.Name, s.Ports)
		}
		for _, e := range s.Endpoints {
			i := 0
			fmt.Sscanf(e.TargetRef.Name, "pod%d", &i)
			if e.Zone != "zone-"+string(rune('a'+i%4%2)) {
				t.Errorf("%s zone %q", e.TargetRef.Name, e.Zone)
			}
			if pods[i].Deleting && (*e.Ready || *e.Serving != pods[i].Ready || !*e.Terminating) {
				t.Errorf("terminating %s: ready %v serving %v terminating %v; want false, %v, true",
					e.TargetRef.Name, *e.Ready, *e.Serving, *e.Terminating, pods[i].Ready)
			}
		}
	}
	for _, at := range []string{kube.AddressTypeIPv4, kube.AddressTypeIPv6} {
		if n := perType[at]; len(n) != 3 || slices.Max(n) > 100 || n[0]+n[1]+n[2] != 250 {
			t.Errorf("%s slices %v; want three of at most 100, 250 endpoints", at, n)
		}
	}
	checkSlices(t, svc, sl, 100)

	// A running watch from now: one Pod turns not ready.
	ctx, cancel := context.WithCancel(etcdtest.Context(t))
	defer cancel()
	events := make(chan SliceWatchEvent, 100)
	go h.c.WatchSlices(ctx, "ns", h.rev(), func(ev SliceWatchEvent) error { events <- ev; return nil })
	flip := *pods[101]
	flip.Ready, flip.ResourceVersion = false, "2"
	h.events(Event{Type: Upsert, Revision: 2, Pod: &flip})
	h.settle()
	var got []SliceWatchEvent
	for done := false; !done; {
		select {
		case ev := <-events:
			got = append(got, ev)
		case <-time.After(300 * time.Millisecond):
			done = true
		}
	}
	// Dual-stack: the Pod is an endpoint of an IPv4 and of an IPv6 slice.
	if len(got) != 2 || got[0].Type != Modified || got[1].Type != Modified ||
		got[0].Slice.AddressType == got[1].Slice.AddressType ||
		got[0].Revision != got[1].Revision {
		t.Errorf("watch after one readiness flip: %d events; "+
			"want two MODIFIED (its IPv4 and IPv6 slices) of one revision", len(got))
	}
	noDuplicates(t, h.slices("ns", "foo"))
}

// noDuplicates fails when an endpoint (a Pod) is in two slices of one address type.
func noDuplicates(t *testing.T, sl []*kube.EndpointSlice) {
	t.Helper()
	seen := map[string]string{}
	for _, s := range sl {
		for _, e := range s.Endpoints {
			k := s.AddressType + "/" + e.TargetRef.Name
			if other, dup := seen[k]; dup {
				t.Errorf("%s is in slices %s and %s", k, other, s.Name)
			}
			seen[k] = s.Name
		}
	}
}
