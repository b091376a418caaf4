package server_test

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/allocd/allocd/endpoints"
	"github.com/allocd/allocd/endpoints/kube"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
	"github.com/allocd/allocd/server"
)

// storedEndpoints and storedSlices are stored values (the API's messages without their
// revisions, as allocd stores them): what allocd writes, and shapes it does not write
// that the watch must still send as the conversion of the decoded object would (a
// slice endpoint without conditions, an optional string present but empty, a port
// without its name).
func storedEndpoints() map[string]*allocdv1.ServiceEndpoints {
	ref := func(n string) *allocdv1.ObjectReference {
		return &allocdv1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: n, Uid: n + "-uid"}
	}
	return map[string]*allocdv1.ServiceEndpoints{
		"full": {Namespace: "ns", Name: "full", Labels: map[string]string{"app": "a",
			"endpoints.kubernetes.io/managed-by": "endpoint-controller"},
			Annotations: map[string]string{kube.AnnotationTriggerTime: "2026-11-26T00:00:00Z"},
			Subsets: []*allocdv1.ServiceEndpointSubset{{
				Addresses: []*allocdv1.EndpointAddress{{Ip: "10.0.0.1", NodeName: "n1",
					TargetRef: ref("p1")}, {Ip: "10.0.0.2", Hostname: "h"}},
				NotReadyAddresses: []*allocdv1.EndpointAddress{{Ip: "10.0.0.3",
					TargetRef: &allocdv1.ObjectReference{}}},
				Ports: []*allocdv1.EndpointPort{{Name: "http", Port: 8080, Protocol: "TCP",
					AppProtocol: proto.String("")},
					{Port: 53, Protocol: "UDP"}}}},
			ServiceUid: "svc-uid", ManagedBy: "endpoint-controller", AddressCount: 3},
		"bare": {Namespace: "ns", Name: "bare"},
		"empty-subset": {Namespace: "ns", Name: "empty-subset",
			Subsets: []*allocdv1.ServiceEndpointSubset{{}}},
		"unknown-field": withUnknown(&allocdv1.ServiceEndpoints{Namespace: "ns", Name: "unknown-field"},
			bytesField(11, []byte("from a newer allocd"))),
		"twice-ref": {Namespace: "ns", Name: "twice-ref",
			Subsets: []*allocdv1.ServiceEndpointSubset{{
				Addresses: []*allocdv1.EndpointAddress{withUnknown(
					&allocdv1.EndpointAddress{Ip: "10.0.0.9", TargetRef: ref("p9")},
					bytesField(4, marshal(&allocdv1.ObjectReference{Uid: "other"})))}}}},
	}
}

// withUnknown gives m the unknown-field bytes raw: marshalled after m's known fields,
// they make a field the API's message does not know, or a second copy of one it does.
func withUnknown[M proto.Message](m M, raw []byte) M {
	m.ProtoReflect().SetUnknown(raw)
	return m
}

func bytesField(num protowire.Number, v []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), v)
}

func marshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

func storedSlices() map[string]*allocdv1.EndpointSlice {
	t, f := proto.Bool(true), proto.Bool(false)
	port := &allocdv1.EndpointSlicePort{Name: proto.String("http"), Port: proto.Int32(8080),
		Protocol: proto.String("TCP")}
	ep := func(ip string) *allocdv1.SliceEndpoint {
		return &allocdv1.SliceEndpoint{Addresses: []string{ip},
			Conditions: &allocdv1.EndpointConditions{Ready: t, Serving: t, Terminating: f},
			NodeName:   proto.String("n1"), Zone: proto.String("z1"),
			TargetRef: &allocdv1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "p-" + ip,
				Uid: "u-" + ip}}
	}
	slice := func(name string, eps []*allocdv1.SliceEndpoint,
		ports ...*allocdv1.EndpointSlicePort) *allocdv1.EndpointSlice {
		return &allocdv1.EndpointSlice{Namespace: "ns", Name: name, AddressType: "IPv4",
			ServiceUid: "svc-uid",
			Labels: map[string]string{"kubernetes.io/service-name": "svc",
				"endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
			Annotations: map[string]string{kube.AnnotationTriggerTime: "2026-11-26T00:00:00Z"},
			Endpoints:   eps, Ports: ports}
	}
	hinted := ep("10.0.0.2")
	hinted.Hostname = proto.String("h")
	hinted.Hints = &allocdv1.EndpointHints{ForZones: []*allocdv1.ForZone{{Name: "z1"}},
		ForNodes: []*allocdv1.ForNode{{Name: "n1"}}}
	onlyReady := ep("10.0.0.3")
	onlyReady.Conditions = &allocdv1.EndpointConditions{Ready: t}
	noConditions := ep("10.0.0.4")
	noConditions.Conditions = nil
	emptyHost := ep("10.0.0.5")
	emptyHost.Hostname = proto.String("")
	appProto := &allocdv1.EndpointSlicePort{Name: proto.String(""), Port: proto.Int32(0),
		Protocol:    proto.String("SCTP"),
		AppProtocol: proto.String("x")}
	return map[string]*allocdv1.EndpointSlice{
		"svc-full": slice("svc-full", []*allocdv1.SliceEndpoint{ep("10.0.0.1"), hinted, onlyReady},
			port, appProto),
		"svc-placeholder":   slice("svc-placeholder", nil),
		"svc-no-conditions": slice("svc-no-conditions", []*allocdv1.SliceEndpoint{noConditions}, port),
		"svc-empty-host":    slice("svc-empty-host", []*allocdv1.SliceEndpoint{emptyHost}, port),
		"svc-unnamed-port": slice("svc-unnamed-port", []*allocdv1.SliceEndpoint{ep("10.0.0.6")},
			&allocdv1.EndpointSlicePort{Port: proto.Int32(80)}),
		// What allocd does not write either: a field the API does not know, at the top or
		// in a hint's zone; a target reference or hints twice in one endpoint.
		"svc-unknown": withUnknown(slice("svc-unknown", []*allocdv1.SliceEndpoint{ep("10.0.0.7")}, port),
			bytesField(12, []byte("x"))),
		"svc-zone-unknown": slice("svc-zone-unknown", []*allocdv1.SliceEndpoint{withHints(ep("10.0.0.8"),
			&allocdv1.EndpointHints{ForZones: []*allocdv1.ForZone{withUnknown(&allocdv1.ForZone{Name: "z1"},
				bytesField(2, []byte("z9")))}})}, port),
		"svc-twice-ref": slice("svc-twice-ref", []*allocdv1.SliceEndpoint{withUnknown(ep("10.0.0.9"),
			bytesField(6, marshal(&allocdv1.ObjectReference{Uid: "other"})))}, port),
		"svc-twice-hints": slice("svc-twice-hints", []*allocdv1.SliceEndpoint{withUnknown(
			withHints(ep("10.0.0.10"), &allocdv1.EndpointHints{ForZones: []*allocdv1.ForZone{{Name: "z1"}}}),
			bytesField(7, marshal(&allocdv1.EndpointHints{ForZones: []*allocdv1.ForZone{{Name: "z2"}}})))},
			port),
	}
}

func withHints(ep *allocdv1.SliceEndpoint, h *allocdv1.EndpointHints) *allocdv1.SliceEndpoint {
	ep.Hints = h
	return ep
}

// TestWatchSendsWhatListSends: every Added, Modified and Deleted event of
// WatchServiceEndpoints and WatchEndpointSlices carries the object ListServiceEndpoints
// and ListEndpointSlices return for the same state (the conversion of the decoded
// object), whether the watch sends it as stored or decodes it.
func TestWatchSendsWhatListSends(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	c, err := endpoints.New(e.Client, endpoints.Config{Prefix: "/allocd"})
	if err != nil {
		t.Fatal(err)
	}
	conn := serve(t, func(ctx context.Context) error { <-ctx.Done(); return nil }, func(gs *grpc.Server) {
		allocdv1.RegisterEndpointsServiceServer(gs, server.NewEndpointsService(c, nil, nil, nil))
	})
	api := allocdv1.NewEndpointsServiceClient(conn)
	put := func(gen int) {
		for name, m := range storedEndpoints() {
			m.Labels = map[string]string{"gen": string(rune('0' + gen))}
			putProto(t, e, "/allocd/endpoints/ns/"+name, m)
		}
		for name, m := range storedSlices() {
			m.Annotations["gen"] = string(rune('0' + gen))
			putProto(t, e, "/allocd/endpointslices/ns/svc/"+name, m)
		}
	}
	put(1)
	rev0, listed := listBoth(ctx, t, api)
	checkWatch(ctx, t, api, 0, listed, allocdv1.WatchEventType_WATCH_EVENT_TYPE_ADDED)
	put(2)
	rev1, listed := listBoth(ctx, t, api)
	checkWatch(ctx, t, api, rev0, listed, allocdv1.WatchEventType_WATCH_EVENT_TYPE_MODIFIED)
	for _, p := range []string{"/allocd/endpoints/", "/allocd/endpointslices/"} {
		if _, err := e.Client.Delete(ctx, p, clientv3.WithPrefix()); err != nil {
			t.Fatal(err)
		}
	}
	checkWatch(ctx, t, api, rev1, listed, allocdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED)
}

func putProto(t *testing.T, e *etcdtest.Server, key string, m proto.Message) {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.Put(etcdtest.Context(t), key, string(b)); err != nil {
		t.Fatal(err)
	}
}

// listBoth lists every Endpoints object and slice, by kind and name, at one revision.
func listBoth(ctx context.Context, t *testing.T, api allocdv1.EndpointsServiceClient) (int64,
	map[string]proto.Message) {
	t.Helper()
	out := map[string]proto.Message{}
	eps, err := api.ListServiceEndpoints(ctx, &allocdv1.ListServiceEndpointsRequest{Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range eps.GetEndpoints() {
		out["endpoints/"+m.GetName()] = m
	}
	sl, err := api.ListEndpointSlices(ctx, &allocdv1.ListEndpointSlicesRequest{Namespace: "ns",
		PageSize: 5000})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range sl.GetEndpointSlices() {
		out["slice/"+m.GetName()] = m
	}
	if len(out) != len(storedEndpoints())+len(storedSlices()) {
		t.Fatalf("listed %d objects; want %d", len(out), len(storedEndpoints())+len(storedSlices()))
	}
	return max(eps.GetRevision(), sl.GetRevision()), out
}

// checkWatch watches both kinds from rev and checks that each object listed comes as
// one event of type typ carrying the listed object.
func checkWatch(ctx context.Context, t *testing.T, api allocdv1.EndpointsServiceClient, rev int64,
	want map[string]proto.Message, typ allocdv1.WatchEventType) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := map[string]proto.Message{}
	ew, err := api.WatchServiceEndpoints(ctx, &allocdv1.WatchServiceEndpointsRequest{Namespace: "ns",
		StartRevision: rev})
	if err != nil {
		t.Fatal(err)
	}
	for range storedEndpoints() {
		ev, err := ew.Recv()
		if err != nil {
			t.Fatalf("WatchServiceEndpoints: %v", err)
		}
		if ev.GetType() != typ {
			t.Errorf("WatchServiceEndpoints sent %v of %s; want %v", ev.GetType(),
				ev.GetEndpoints().GetName(), typ)
		}
		got["endpoints/"+ev.GetEndpoints().GetName()] = ev.GetEndpoints()
	}
	sw, err := api.WatchEndpointSlices(ctx, &allocdv1.WatchEndpointSlicesRequest{Namespace: "ns",
		StartRevision: rev})
	if err != nil {
		t.Fatal(err)
	}
	for range storedSlices() {
		ev, err := sw.Recv()
		if err != nil {
			t.Fatalf("WatchEndpointSlices: %v", err)
		}
		if ev.GetType() != typ {
			t.Errorf("WatchEndpointSlices sent %v of %s; want %v", ev.GetType(),
				ev.GetEndpointSlice().GetName(), typ)
		}
		got["slice/"+ev.GetEndpointSlice().GetName()] = ev.GetEndpointSlice()
	}
	for k, w := range want {
		if !proto.Equal(got[k], w) {
			t.Errorf("%v event of %s:\n %v\nwant what the listing has:\n %v", typ, k, got[k], w)
		}
	}
}
