package write

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

func TestEndpointsObject(t *testing.T) {
	ep := EndpointsObject(&allocdv1.ServiceEndpoints{
		Namespace: "ns", Name: "web",
		Labels:      map[string]string{LabelManagedBy: EndpointController, "tier": "front"},
		Annotations: map[string]string{AnnotationTriggerTime: "2026-01-02T03:04:05Z"},
		Subsets: []*allocdv1.ServiceEndpointSubset{{
			Addresses: []*allocdv1.EndpointAddress{{Ip: "10.0.0.1", NodeName: "n1",
				TargetRef: &allocdv1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "p1", Uid: "u1"}}},
			NotReadyAddresses: []*allocdv1.EndpointAddress{{Ip: "10.0.0.2", Hostname: "h",
				TargetRef: &allocdv1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "p2", Uid: "u2"}}},
			Ports: []*allocdv1.EndpointPort{{Name: "http", Port: 8080, Protocol: "TCP"}},
		}},
	})
	if ep.Namespace != "ns" || ep.Name != "web" || ep.Labels["tier"] != "front" || len(ep.OwnerReferences) != 0 {
		t.Fatalf("EndpointsObject meta = %+v", ep.ObjectMeta)
	}
	s := ep.Subsets[0]
	if a := s.Addresses[0]; a.IP != "10.0.0.1" || a.NodeName == nil || *a.NodeName != "n1" || a.TargetRef.UID != "u1" {
		t.Errorf("ready address = %+v", a)
	}
	// kube-controller-manager sets the node name of a Pod's address even when empty.
	if a := s.NotReadyAddresses[0]; a.NodeName == nil || *a.NodeName != "" || a.Hostname != "h" {
		t.Errorf("not-ready address = %+v; want an empty node name set, hostname h", a)
	}
	if p := s.Ports[0]; p.Name != "http" || p.Port != 8080 || p.Protocol != corev1.ProtocolTCP {
		t.Errorf("port = %+v", p)
	}
}

func TestEndpointsMatch(t *testing.T) {
	base := func() *corev1.Endpoints {
		return &corev1.Endpoints{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{LabelManagedBy: EndpointController},
				Annotations: map[string]string{AnnotationTriggerTime: "t1"}},
			Subsets: []corev1.EndpointSubset{{
				Addresses: []corev1.EndpointAddress{{IP: "10.0.0.1"}, {IP: "10.0.0.2"}},
				Ports:     []corev1.EndpointPort{{Name: "a", Port: 1}, {Name: "b", Port: 2}},
			}},
		}
	}
	tests := []struct {
		name   string
		change func(*corev1.Endpoints)
		match  bool
	}{
		{"same", func(*corev1.Endpoints) {}, true},
		{"addresses in another order", func(e *corev1.Endpoints) {
			a := e.Subsets[0].Addresses
			a[0], a[1] = a[1], a[0]
		}, true},
		{"ports in another order", func(e *corev1.Endpoints) {
			p := e.Subsets[0].Ports
			p[0], p[1] = p[1], p[0]
		}, true},
		{"another trigger time", func(e *corev1.Endpoints) { e.Annotations[AnnotationTriggerTime] = "t2" }, true},
		{"a foreign annotation", func(e *corev1.Endpoints) { e.Annotations["x"] = "y" }, true},
		{"trigger time removed", func(e *corev1.Endpoints) { delete(e.Annotations, AnnotationTriggerTime) }, false},
		{"over capacity", func(e *corev1.Endpoints) { e.Annotations[AnnotationOverCapacity] = "truncated" }, false},
		{"another label", func(e *corev1.Endpoints) { e.Labels["x"] = "y" }, false},
		{"address not ready", func(e *corev1.Endpoints) {
			s := &e.Subsets[0]
			s.NotReadyAddresses, s.Addresses = s.Addresses[1:], s.Addresses[:1]
		}, false},
		{"no subsets", func(e *corev1.Endpoints) { e.Subsets = nil }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cur := base()
			tt.change(cur)
			if got := EndpointsMatch(cur, base()); got != tt.match {
				t.Errorf("EndpointsMatch(%s) = %v; want %v", tt.name, got, tt.match)
			}
		})
	}
}
