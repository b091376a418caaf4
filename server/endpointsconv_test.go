package server

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/allocd/allocd/endpoints"
	"github.com/allocd/allocd/endpoints/kube"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// FuzzPodFromProto: any Pod the wire can carry is refused with field violations or
// accepted with canonical IPs and a known phase; never a panic.
func FuzzPodFromProto(f *testing.F) {
	for _, p := range []*allocdv1.Pod{
		{Namespace: "ns", Name: "p", Uid: "u", PodIps: []string{"10.0.0.1", "fd00::1"}, Phase: "Running",
			Ready: true,
			Containers: []*allocdv1.Container{{Name: "c",
				Ports: []*allocdv1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
		{Namespace: "ns", Name: "p", Uid: "u", PodIps: []string{"010.000.000.001"}, Phase: "Pending"},
		{Namespace: "", Name: "p", PodIps: []string{"not-an-ip"}, Phase: "Runing"},
	} {
		b, err := proto.Marshal(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var p allocdv1.Pod
		if proto.Unmarshal(data, &p) != nil {
			return
		}
		inv := &endpoints.InvalidError{}
		pod := podFromProto(&p, "pod", inv)
		if inv.OrNil() != nil {
			if len(inv.Violations) == 0 {
				t.Fatal("an error without violations")
			}
			return
		}
		if pod.Namespace == "" || pod.Name == "" || pod.UID == "" {
			t.Fatalf("accepted a kube.Pod without namespace, name or uid: %+v", pod)
		}
		switch pod.Phase {
		case kube.PhasePending, kube.PhaseRunning, kube.PhaseSucceeded, kube.PhaseFailed, kube.PhaseUnknown:
		default:
			t.Fatalf("accepted phase %q", pod.Phase)
		}
		for _, ip := range pod.PodIPs {
			if c, ok := kube.CanonicalIP(ip); !ok || c != ip {
				t.Fatalf("accepted IP %q is not canonical (%q, %v)", ip, c, ok)
			}
		}
		// What the controller does with an accepted Pod must not panic either.
		svc := &kube.Service{Namespace: pod.Namespace, Name: "foo", UID: "svc-uid", Type: kube.TypeClusterIP,
			Ports: []kube.ServicePort{{Port: 80, Protocol: kube.ProtocolTCP}}}
		svc.Selector = map[string]string{}
		svc.Ports[0].TargetPort = kube.TargetPort{Name: "http"}
		endpoints.Repack(endpoints.ComputeSubsets(svc, []*kube.Pod{pod}))
	})
}

// FuzzEventsFromProto: a PushEvents message is refused whole with field violations or
// accepted with every event typed, carrying one object, at a positive revision not
// above the message's; never a panic.
func FuzzEventsFromProto(f *testing.F) {
	for _, m := range []*allocdv1.PushEventsRequest{
		{Revision: 3, Events: []*allocdv1.Event{
			{Type: allocdv1.EventType_EVENT_TYPE_UPSERT,
				Object: &allocdv1.Event_Pod{Pod: &allocdv1.Pod{Namespace: "ns", Name: "p", Uid: "u",
					PodIps: []string{"10.0.0.1"}}}},
			{Type: allocdv1.EventType_EVENT_TYPE_DELETE, Revision: 2,
				Object: &allocdv1.Event_Service{Service: &allocdv1.Service{Namespace: "ns", Name: "s"}}},
		}},
		{Revision: 0, Events: []*allocdv1.Event{{Type: allocdv1.EventType_EVENT_TYPE_UNSPECIFIED}}},
		{Revision: 5, Events: []*allocdv1.Event{{Type: allocdv1.EventType_EVENT_TYPE_UPSERT, Revision: 9,
			Object: &allocdv1.Event_Service{Service: &allocdv1.Service{Namespace: "ns", Name: "s", Uid: "u",
				Ports: []*allocdv1.ServicePortSpec{{Port: 80, Protocol: "HTTP"}}}}}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var m allocdv1.PushEventsRequest
		if proto.Unmarshal(data, &m) != nil {
			return
		}
		evs, err := eventsFromProto(&m)
		if err != nil {
			if evs != nil {
				t.Fatalf("an error (%v) with %d events", err, len(evs))
			}
			return
		}
		if len(evs) != len(m.GetEvents()) {
			t.Fatalf("%d events accepted of %d", len(evs), len(m.GetEvents()))
		}
		for i, ev := range evs {
			if ev.Type != endpoints.Upsert && ev.Type != endpoints.Delete {
				t.Fatalf("event %d: type %v", i, ev.Type)
			}
			if (ev.Service == nil) == (ev.Pod == nil) {
				t.Fatalf("event %d: service %v, pod %v; want exactly one", i, ev.Service, ev.Pod)
			}
			if ev.Revision <= 0 || ev.Revision > m.GetRevision() {
				t.Fatalf("event %d: revision %d with the message's %d", i, ev.Revision, m.GetRevision())
			}
		}
	})
}
