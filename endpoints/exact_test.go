package endpoints

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/allocd/allocd/endpoints/kube"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// sliceAPIForm is the API's message of s without its revisions, as the server converts
// a slice (every endpoint with its conditions, the optional strings left out when
// empty, every port with its name, number and protocol).
func sliceAPIForm(s *kube.EndpointSlice) *allocdv1.EndpointSlice {
	p := &allocdv1.EndpointSlice{Namespace: s.Namespace, Name: s.Name, Labels: s.Labels,
		Annotations: s.Annotations,
		AddressType: s.AddressType, ServiceUid: s.ServiceUID}
	opt := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	for _, e := range s.Endpoints {
		pe := &allocdv1.SliceEndpoint{Addresses: e.Addresses,
			Conditions: &allocdv1.EndpointConditions{Ready: e.Ready, Serving: e.Serving,
				Terminating: e.Terminating},
			Hostname: opt(e.Hostname), NodeName: opt(e.NodeName), Zone: opt(e.Zone)}
		if r := e.TargetRef; r != nil {
			pe.TargetRef = &allocdv1.ObjectReference{Kind: r.Kind, Namespace: r.Namespace, Name: r.Name,
				Uid: r.UID}
		}
		if h := e.Hints; h != nil {
			pe.Hints = &allocdv1.EndpointHints{}
			for _, z := range h.ForZones {
				pe.Hints.ForZones = append(pe.Hints.ForZones, &allocdv1.ForZone{Name: z})
			}
			for _, n := range h.ForNodes {
				pe.Hints.ForNodes = append(pe.Hints.ForNodes, &allocdv1.ForNode{Name: n})
			}
		}
		p.Endpoints = append(p.Endpoints, pe)
	}
	for _, pt := range s.Ports {
		p.Ports = append(p.Ports, &allocdv1.EndpointSlicePort{Name: proto.String(pt.Name),
			Port:     proto.Int32(pt.Port),
			Protocol: proto.String(pt.Protocol), AppProtocol: pt.AppProtocol})
	}
	return p
}

// randomSlice builds a slice as the controller writes them (every endpoint with at
// least its Ready condition), with every field used some of the time.
func randomSlice(r *rand.Rand) *kube.EndpointSlice {
	str := func(max int) string {
		b := make([]byte, r.IntN(max))
		for i := range b {
			b[i] = byte('a' + r.IntN(26))
		}
		return string(b)
	}
	s := &kube.EndpointSlice{Namespace: str(20), Name: str(60), AddressType: "IPv4", ServiceUID: str(36),
		Labels: map[string]string{kube.LabelServiceName: str(20), str(10): str(100)}}
	if r.IntN(2) == 0 {
		s.Annotations = map[string]string{kube.AnnotationTriggerTime: str(30)}
	}
	for range r.IntN(120) {
		ip := "10.0." + strconv.Itoa(r.IntN(256)) + "." + strconv.Itoa(r.IntN(256))
		e := kube.SliceEndpoint{Addresses: []string{ip},
			Ready: kube.Bool(r.IntN(2) == 0), Hostname: str(3), NodeName: str(10), Zone: str(4)}
		if r.IntN(3) > 0 {
			e.Serving, e.Terminating = kube.Bool(r.IntN(2) == 0), kube.Bool(r.IntN(2) == 0)
		}
		if r.IntN(2) == 0 {
			e.TargetRef = &kube.ObjectRef{Kind: "Pod", Namespace: str(5), Name: str(10), UID: str(36)}
		}
		if r.IntN(4) == 0 {
			e.Hints = &kube.Hints{ForZones: []string{str(4)}}
		}
		s.Endpoints = append(s.Endpoints, e)
	}
	for range r.IntN(3) {
		p := kube.Port{Name: str(8), Port: int32(r.IntN(70000)), Protocol: "TCP"}
		if r.IntN(2) == 0 {
			ap := str(3)
			p.AppProtocol = &ap
		}
		s.Ports = append(s.Ports, p)
	}
	return s
}

// TestSliceCodecMatchesProto holds the stored form of slices to the generated code, as
// TestCodecMatchesProto does for Endpoints: the bytes of protobuf's deterministic
// encoding of the API's message, decoded back to the slice; and, as what the
// controller writes, sent to watchers as stored (exactSlice).
func TestSliceCodecMatchesProto(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 300 {
		s := randomSlice(r)
		got := encodeSlice(s)
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(sliceAPIForm(s))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("slice %d: encodeSlice() differs from the deterministic protobuf encoding "+
				"(%d vs %d bytes)", i, len(got), len(want))
		}
		back, err := decodeSlice(want, s.Service, 7, 3)
		if err != nil {
			t.Fatalf("slice %d: decodeSlice: %v", i, err)
		}
		s.Revision, s.CreateRevision = 7, 3
		if !reflect.DeepEqual(back, s) {
			t.Fatalf("slice %d: decodeSlice(encodeSlice(s)) = %+v; want %+v", i, back, s)
		}
		if !exactSlice(got) {
			t.Fatalf("slice %d: exactSlice(encodeSlice(s)) = false; want true", i)
		}
	}
}

// TestExactEndpoints: what the controller writes is sent as stored; a value that is
// malformed or has a string that is not UTF-8 is not.
func TestExactEndpoints(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 100 {
		b := encodeEndpoints(randomEndpoints(r))
		if !exactEndpoints(b) {
			t.Fatalf("object %d: exactEndpoints(encodeEndpoints(e)) = false; want true", i)
		}
	}
	bad := encodeEndpoints(&kube.Endpoints{Namespace: "ns", Name: "n",
		Labels: map[string]string{"k": "\xff"}})
	badRef := encodeEndpoints(&kube.Endpoints{Namespace: "ns", Name: "n",
		Subsets: []kube.Subset{{Addresses: []kube.Address{
			{IP: "10.0.0.1", TargetRef: &kube.ObjectRef{Name: "p\xfe"}}}}}})
	for name, b := range map[string][]byte{"label not UTF-8": bad, "reference not UTF-8": badRef,
		"truncated": {0x0a, 0x05, 'a'}, "wrong wire type": {0x08, 0x01}} {
		if exactEndpoints(b) {
			t.Errorf("exactEndpoints(%s) = true; want false", name)
		}
	}
}

// TestExactSliceRefuses: the shapes a watcher would parse differently from the
// conversion of the decoded slice are not sent as stored.
func TestExactSliceRefuses(t *testing.T) {
	ok := &allocdv1.EndpointSlice{Namespace: "ns", Name: "s", AddressType: "IPv4",
		Endpoints: []*allocdv1.SliceEndpoint{{Addresses: []string{"10.0.0.1"},
			Conditions: &allocdv1.EndpointConditions{Ready: proto.Bool(true)}, NodeName: proto.String("n")}},
		Ports: []*allocdv1.EndpointSlicePort{{Name: proto.String("http"), Port: proto.Int32(80),
			Protocol: proto.String("TCP")}}}
	for _, tc := range []struct {
		name   string
		change func(*allocdv1.EndpointSlice)
		want   bool
	}{
		{"as written", func(*allocdv1.EndpointSlice) {}, true},
		{"no conditions", func(s *allocdv1.EndpointSlice) { s.Endpoints[0].Conditions = nil }, false},
		{"empty conditions",
			func(s *allocdv1.EndpointSlice) { s.Endpoints[0].Conditions = &allocdv1.EndpointConditions{} },
			true},
		{"hostname present but empty",
			func(s *allocdv1.EndpointSlice) { s.Endpoints[0].Hostname = proto.String("") }, false},
		{"node name present but empty",
			func(s *allocdv1.EndpointSlice) { s.Endpoints[0].NodeName = proto.String("") }, false},
		{"zone present but empty", func(s *allocdv1.EndpointSlice) { s.Endpoints[0].Zone = proto.String("") },
			false},
		{"port without name", func(s *allocdv1.EndpointSlice) { s.Ports[0].Name = nil }, false},
		{"port without number", func(s *allocdv1.EndpointSlice) { s.Ports[0].Port = nil }, false},
		{"port without protocol", func(s *allocdv1.EndpointSlice) { s.Ports[0].Protocol = nil }, false},
		{"address not UTF-8", func(s *allocdv1.EndpointSlice) { s.Endpoints[0].Addresses[0] = "\xff" },
			false},
	} {
		s := proto.Clone(ok).(*allocdv1.EndpointSlice)
		tc.change(s)
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(s)
		if err != nil && tc.want {
			t.Fatal(err)
		}
		if err != nil {
			// protobuf-go refuses to encode invalid UTF-8: build the bytes by hand.
			b = encodeSlice(&kube.EndpointSlice{Namespace: "ns", Name: "s", Endpoints: []kube.SliceEndpoint{
				{Addresses: []string{"\xff"}, Ready: kube.Bool(true)}}})
		}
		if got := exactSlice(b); got != tc.want {
			t.Errorf("exactSlice(%s) = %v; want %v", tc.name, got, tc.want)
		}
	}
}
