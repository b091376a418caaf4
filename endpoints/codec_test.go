package endpoints

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/allocd/allocd/endpoints/kube"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// apiForm is the allocd.v1.ServiceEndpoints message of e as the server builds it: the
// stored form must be its deterministic protobuf encoding (without the revisions).
func apiForm(e *kube.Endpoints) *allocdv1.ServiceEndpoints {
	p := &allocdv1.ServiceEndpoints{Namespace: e.Namespace, Name: e.Name, Labels: e.Labels,
		Annotations: e.Annotations, ServiceUid: e.ServiceUID, ManagedBy: e.ManagedBy,
		AddressCount: int64(e.AddressCount)}
	addrs := func(as []kube.Address) []*allocdv1.EndpointAddress {
		var out []*allocdv1.EndpointAddress
		for _, a := range as {
			pa := &allocdv1.EndpointAddress{Ip: a.IP, Hostname: a.Hostname, NodeName: a.NodeName}
			if r := a.TargetRef; r != nil {
				pa.TargetRef = &allocdv1.ObjectReference{Kind: r.Kind, Namespace: r.Namespace, Name: r.Name,
					Uid: r.UID}
			}
			out = append(out, pa)
		}
		return out
	}
	for _, s := range e.Subsets {
		ps := &allocdv1.ServiceEndpointSubset{Addresses: addrs(s.Addresses),
			NotReadyAddresses: addrs(s.NotReadyAddresses)}
		for _, pt := range s.Ports {
			ps.Ports = append(ps.Ports, &allocdv1.EndpointPort{Name: pt.Name, Port: pt.Port,
				Protocol: pt.Protocol, AppProtocol: pt.AppProtocol})
		}
		p.Subsets = append(p.Subsets, ps)
	}
	return p
}

// randomEndpoints builds an object with every field used some of the time, long values
// included (lengths past one varint byte).
func randomEndpoints(r *rand.Rand) *kube.Endpoints {
	str := func(max int) string {
		b := make([]byte, r.IntN(max))
		for i := range b {
			b[i] = byte('a' + r.IntN(26))
		}
		return string(b)
	}
	e := &kube.Endpoints{Namespace: str(20), Name: str(300), ServiceUID: str(40), ManagedBy: str(20),
		AddressCount: r.IntN(3000)}
	if r.IntN(2) == 0 {
		e.Labels = map[string]string{}
		for range r.IntN(5) {
			e.Labels[str(30)] = str(200)
		}
	}
	if r.IntN(2) == 0 {
		e.Annotations = map[string]string{"": "", str(10): str(10)}
	}
	for range r.IntN(3) {
		var s kube.Subset
		for range r.IntN(150) {
			a := kube.Address{IP: "10.0." + strconv.Itoa(r.IntN(256)) + "." + strconv.Itoa(r.IntN(256)),
				Hostname: str(5), NodeName: str(10)}
			if r.IntN(2) == 0 {
				a.TargetRef = &kube.ObjectRef{Kind: "Pod", Namespace: str(5), Name: str(10), UID: str(36)}
			}
			if r.IntN(3) == 0 {
				s.NotReadyAddresses = append(s.NotReadyAddresses, a)
			} else {
				s.Addresses = append(s.Addresses, a)
			}
		}
		for range r.IntN(4) {
			p := kube.Port{Name: str(8), Port: int32(r.IntN(70000)), Protocol: "TCP"}
			if r.IntN(2) == 0 {
				ap := str(3)
				p.AppProtocol = &ap
			}
			s.Ports = append(s.Ports, p)
		}
		e.Subsets = append(e.Subsets, s)
	}
	return e
}

// TestCodecMatchesProto holds the hand-written stored form to the generated code: the
// same bytes as protobuf's deterministic encoding, and each decodes the other's.
func TestCodecMatchesProto(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		e := randomEndpoints(r)
		got := encodeEndpoints(e)
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(apiForm(e))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("object %d: encodeEndpoints() differs from the deterministic protobuf encoding "+
				"(%d vs %d bytes)", i, len(got), len(want))
		}
		back, err := decodeEndpoints(want, 7, 3)
		if err != nil {
			t.Fatalf("object %d: decode: %v", i, err)
		}
		e.Revision, e.CreateRevision = 7, 3
		if !reflect.DeepEqual(normalizeEmpty(back), normalizeEmpty(e)) {
			t.Fatalf("object %d: decodeEndpoints(encodeEndpoints(e)) = %+v; want %+v", i, back, e)
		}
	}
}

// normalizeEmpty makes empty maps nil: the encoding does not tell them apart.
func normalizeEmpty(e *kube.Endpoints) *kube.Endpoints {
	cp := *e
	if len(cp.Labels) == 0 {
		cp.Labels = nil
	}
	if len(cp.Annotations) == 0 {
		cp.Annotations = nil
	}
	return &cp
}

// FuzzDecode: any bytes decode to an object or an error, never a panic, and agree with
// protobuf on whether they are well-formed.
func FuzzDecode(f *testing.F) {
	b := encodeEndpoints(randomEndpoints(rand.New(rand.NewPCG(3, 4))))
	f.Add(b)
	f.Add([]byte{0x2a, 0x03, 0x0a, 0x01, 0x41})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, err := decodeEndpoints(b, 1, 1)
		var p allocdv1.ServiceEndpoints
		perr := proto.UnmarshalOptions{}.Unmarshal(b, &p)
		// protobuf also refuses strings that are not UTF-8, which decode does not check:
		// the stored form never holds them (every string came through a protobuf request).
		if err == nil && perr != nil && utf8.Valid(b) {
			t.Fatalf("decode accepted what protobuf refuses: %v", perr)
		}
	})
}
