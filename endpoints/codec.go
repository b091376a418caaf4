package endpoints

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// ToProto converts e to its wire (and stored) form.
func ToProto(e *Endpoints) *allocdv1.ServiceEndpoints {
	p := &allocdv1.ServiceEndpoints{
		Namespace:      e.Namespace,
		Name:           e.Name,
		Labels:         e.Labels,
		Annotations:    e.Annotations,
		Revision:       e.Revision,
		CreateRevision: e.CreateRevision,
		ServiceUid:     e.ServiceUID,
		ManagedBy:      e.ManagedBy,
		AddressCount:   int64(e.AddressCount),
	}
	if len(e.Subsets) > 0 {
		p.Subsets = make([]*allocdv1.ServiceEndpointSubset, len(e.Subsets))
		for i, s := range e.Subsets {
			ps := &allocdv1.ServiceEndpointSubset{
				Addresses:         addressesToProto(s.Addresses),
				NotReadyAddresses: addressesToProto(s.NotReadyAddresses),
			}
			if len(s.Ports) > 0 {
				ps.Ports = make([]*allocdv1.EndpointPort, len(s.Ports))
				for j, pt := range s.Ports {
					ps.Ports[j] = &allocdv1.EndpointPort{Name: pt.Name, Port: pt.Port, Protocol: pt.Protocol, AppProtocol: pt.AppProtocol}
				}
			}
			p.Subsets[i] = ps
		}
	}
	return p
}

func addressesToProto(as []Address) []*allocdv1.EndpointAddress {
	if len(as) == 0 {
		return nil
	}
	out := make([]*allocdv1.EndpointAddress, len(as))
	for i, a := range as {
		pa := &allocdv1.EndpointAddress{Ip: a.IP, Hostname: a.Hostname, NodeName: a.NodeName}
		if r := a.TargetRef; r != nil {
			pa.TargetRef = &allocdv1.ObjectReference{Kind: r.Kind, Namespace: r.Namespace, Name: r.Name, Uid: r.UID}
		}
		out[i] = pa
	}
	return out
}

// FromProto converts the wire (and stored) form.
func FromProto(p *allocdv1.ServiceEndpoints) *Endpoints {
	e := &Endpoints{
		Namespace:      p.GetNamespace(),
		Name:           p.GetName(),
		Labels:         p.GetLabels(),
		Annotations:    p.GetAnnotations(),
		Revision:       p.GetRevision(),
		CreateRevision: p.GetCreateRevision(),
		ServiceUID:     p.GetServiceUid(),
		ManagedBy:      p.GetManagedBy(),
		AddressCount:   int(p.GetAddressCount()),
	}
	if n := len(p.GetSubsets()); n > 0 {
		e.Subsets = make([]Subset, n)
		for i, ps := range p.GetSubsets() {
			s := Subset{
				Addresses:         addressesFromProto(ps.GetAddresses()),
				NotReadyAddresses: addressesFromProto(ps.GetNotReadyAddresses()),
			}
			if m := len(ps.GetPorts()); m > 0 {
				s.Ports = make([]Port, m)
				for j, pt := range ps.GetPorts() {
					s.Ports[j] = Port{Name: pt.GetName(), Port: pt.GetPort(), Protocol: pt.GetProtocol(), AppProtocol: pt.AppProtocol}
				}
			}
			e.Subsets[i] = s
		}
	}
	return e
}

func addressesFromProto(ps []*allocdv1.EndpointAddress) []Address {
	if len(ps) == 0 {
		return nil
	}
	out := make([]Address, len(ps))
	for i, pa := range ps {
		a := Address{IP: pa.GetIp(), Hostname: pa.GetHostname(), NodeName: pa.GetNodeName()}
		if r := pa.GetTargetRef(); r != nil {
			a.TargetRef = &ObjectRef{Kind: r.GetKind(), Namespace: r.GetNamespace(), Name: r.GetName(), UID: r.GetUid()}
		}
		out[i] = a
	}
	return out
}

// encode is the stored form of e: its proto, deterministic, without the revisions
// (etcd keeps those).
func encode(e *Endpoints) ([]byte, error) {
	p := ToProto(e)
	p.Revision, p.CreateRevision = 0, 0
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode endpoints %s: %w", e.Key(), err)
	}
	return b, nil
}

// decode reads a stored object and stamps it with its etcd revisions.
func decode(b []byte, modRev, createRev int64) (*Endpoints, error) {
	var p allocdv1.ServiceEndpoints
	if err := proto.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("decode stored endpoints: %w", err)
	}
	e := FromProto(&p)
	e.Revision, e.CreateRevision = modRev, createRev
	return e, nil
}
