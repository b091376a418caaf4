package endpointslice

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/allocd/allocd/endpoints/kube"
)

// The cases of k8s.io/endpointslice's reconciler_test.go run against a real etcd,
// through the controller, in package endpoints (slice_test.go). These tests hold the
// planning alone, in memory: what it promises whatever stores the slices.

// planned is a Service "web" of 250 ready Pods on 5 of 6 Nodes in 3 zones (zone-c has
// half the Pods of the others for a third of the CPU: the hints move endpoints to it),
// and a reconciler of it over the slices stored.
func planned(stored []*kube.EndpointSlice) *Reconciler {
	svc := &kube.Service{Namespace: "shop", Name: "web", UID: "u-web", Type: kube.TypeClusterIP,
		ClusterIPs: []string{"10.96.0.10"}, IPFamilies: []string{kube.FamilyIPv4},
		Selector:    map[string]string{"app": "web"},
		Annotations: map[string]string{kube.AnnotationTopologyMode: "Auto"},
		Ports: []kube.ServicePort{{Name: "http", Port: 80, TargetPort: kube.TargetPort{Name: "http"},
			Protocol: kube.ProtocolTCP}}}
	nodes := map[string]*kube.Node{}
	for i := range 6 {
		n := &kube.Node{Name: fmt.Sprintf("node-%d", i), Ready: true, AllocatableCPUMillis: 4000,
			Labels: map[string]string{kube.LabelZone: fmt.Sprintf("zone-%c", 'a'+i%3)}}
		nodes[n.Name] = n
	}
	var pods []*kube.Pod
	for i := range 250 {
		pods = append(pods, &kube.Pod{Namespace: "shop", Name: fmt.Sprintf("web-%d", i),
			UID: fmt.Sprintf("u-%d", i), Labels: map[string]string{"app": "web"},
			NodeName: fmt.Sprintf("node-%d", i%5), PodIPs: []string{fmt.Sprintf("10.1.%d.%d", i/250, i%250)},
			Phase: kube.PhaseRunning, Ready: true,
			Containers: []kube.Container{{Name: "c", Ports: []kube.ContainerPort{{Name: "http",
				ContainerPort: 8080, Protocol: kube.ProtocolTCP}}}}})
	}
	lookup := func(name string) (*kube.Node, bool) { n, ok := nodes[name]; return n, ok }
	taken := map[string]bool{}
	for _, s := range stored {
		taken[s.Name] = true
	}
	return &Reconciler{Service: svc, Desired: Desire(svc, pods, lookup), Existing: stored, Taken: taken,
		MaxEndpointsPerSlice: 100, TriggerTime: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Topology: CPURatiosByZone(nodes)}
}

// TestReconcileDeterministic: the same inputs give the same plan, names and hints
// included (upstream picks from maps; allocd does not), and 250 endpoints make three
// new slices of at most 100, every endpoint with a hint for a zone.
func TestReconcileDeterministic(t *testing.T) {
	first := planned(nil).Reconcile()
	if len(first.Creates) != 3 || len(first.Updates)+len(first.Deletes) != 0 {
		t.Fatalf("Reconcile() = %d creates, %d updates, %d deletes; want 3, 0, 0", len(first.Creates),
			len(first.Updates), len(first.Deletes))
	}
	n := 0
	for _, s := range first.Creates {
		if len(s.Endpoints) > 100 {
			t.Errorf("slice %s has %d endpoints; want at most 100", s.Name, len(s.Endpoints))
		}
		for _, e := range s.Endpoints {
			if e.Hints == nil || len(e.Hints.ForZones) != 1 {
				t.Errorf("endpoint %s of %s has hints %+v; want one zone", e.TargetRef.Name, s.Name, e.Hints)
			}
		}
		n += len(s.Endpoints)
	}
	if n != 250 {
		t.Errorf("Reconcile() places %d endpoints; want 250", n)
	}
	for i := range 20 {
		if again := planned(nil).Reconcile(); !reflect.DeepEqual(again, first) {
			t.Fatalf("Reconcile() #%d differs from the first with the same inputs", i+2)
		}
	}
}

// TestReconcileStoredPlanWritesNothing: once its plan is stored, a Service whose
// inputs did not change is not written again (the trigger time alone changes nothing).
func TestReconcileStoredPlanWritesNothing(t *testing.T) {
	var stored []*kube.EndpointSlice
	for i, s := range planned(nil).Reconcile().Creates {
		cp := *s
		cp.Revision, cp.CreateRevision = int64(10+i), int64(10+i)
		stored = append(stored, &cp)
	}
	r := planned(stored)
	r.TriggerTime = r.TriggerTime.Add(time.Hour)
	if p := r.Reconcile(); p.Writes() != 0 {
		t.Errorf("Reconcile() over its own stored plan = %d creates, %d updates, %d deletes; want none",
			len(p.Creates), len(p.Updates), len(p.Deletes))
	}
}
