package endpoints

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/allocd/allocd/endpoints/kube"
)

// The stored form of an EndpointSlice is the protobuf encoding of the API's
// allocd.v1.EndpointSlice message without the revisions, written and read with
// protowire as codec.go does for Endpoints; TestSliceCodecMatchesProto holds it to the
// generated code. A port's name, number and protocol are always present (the
// controller sets them all); a string of an endpoint is present when it is not empty.
//
// Field numbers, as in proto/allocd/v1/endpoints.proto:
//
//	EndpointSlice: 1 namespace, 2 name, 3 labels, 4 annotations, 5 address_type,
//	  6 service_uid, 7 endpoints, 8 ports, 9 revision and 10 create_revision (not
//	  stored)
//	SliceEndpoint: 1 addresses, 2 conditions, 3 hostname, 4 node_name, 5 zone,
//	  6 target_ref, 7 hints
//	EndpointConditions: 1 ready, 2 serving, 3 terminating
//	EndpointHints: 1 for_zones, 2 for_nodes; ForZone, ForNode: 1 name
//	EndpointSlicePort: 1 name, 2 port, 3 protocol, 4 app_protocol

// encodeSlice is the stored form of s.
func encodeSlice(s *kube.EndpointSlice) []byte {
	b := make([]byte, 0, 64+len(s.Endpoints)*96)
	b = appendString(b, 1, s.Namespace)
	b = appendString(b, 2, s.Name)
	b = appendMap(b, 3, s.Labels)
	b = appendMap(b, 4, s.Annotations)
	b = appendString(b, 5, s.AddressType)
	b = appendString(b, 6, s.ServiceUID)
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		b = appendMessage(b, 7, func(b []byte) []byte { return appendSliceEndpoint(b, e) })
	}
	for _, p := range s.Ports {
		b = appendMessage(b, 8, func(b []byte) []byte { return appendSlicePort(b, p) })
	}
	return b
}

func appendSliceEndpoint(b []byte, e *kube.SliceEndpoint) []byte {
	for _, a := range e.Addresses {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, a)
	}
	if e.Ready != nil || e.Serving != nil || e.Terminating != nil {
		b = appendMessage(b, 2, func(b []byte) []byte {
			for i, c := range []*bool{e.Ready, e.Serving, e.Terminating} {
				if c != nil {
					b = protowire.AppendTag(b, protowire.Number(i+1), protowire.VarintType)
					b = protowire.AppendVarint(b, protowire.EncodeBool(*c))
				}
			}
			return b
		})
	}
	b = appendString(b, 3, e.Hostname)
	b = appendString(b, 4, e.NodeName)
	b = appendString(b, 5, e.Zone)
	b = appendRef(b, 6, e.TargetRef)
	if h := e.Hints; h != nil {
		b = appendMessage(b, 7, func(b []byte) []byte {
			for _, z := range h.ForZones {
				b = appendMessage(b, 1, func(b []byte) []byte { return appendString(b, 1, z) })
			}
			for _, n := range h.ForNodes {
				b = appendMessage(b, 2, func(b []byte) []byte { return appendString(b, 1, n) })
			}
			return b
		})
	}
	return b
}

// appendSlicePort appends an EndpointSlicePort: the same fields as an EndpointPort
// (appendPort, decodePort), but optional ones, present even when empty, as the API's
// conversion sends them, so that the stored form can go to a watcher as it is.
func appendSlicePort(b []byte, p kube.Port) []byte {
	b = appendPresentString(b, 1, p.Name)
	b = protowire.AppendTag(b, 2, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(int64(p.Port)))
	b = appendPresentString(b, 3, p.Protocol)
	if p.AppProtocol != nil {
		b = appendPresentString(b, 4, *p.AppProtocol)
	}
	return b
}

// The stored slice messages' schemas.
var (
	sliceSchema = schema{-1, bytesField, bytesField, bytesField, bytesField, bytesField,
		bytesField, bytesField, bytesField, varintField, varintField}
	sliceEndpointSchema = schema{-1, bytesField, bytesField, bytesField, bytesField, bytesField,
		bytesField, bytesField}
	conditionsSchema = schema{-1, varintField, varintField, varintField}
	hintsSchema      = schema{-1, bytesField, bytesField}
	nameSchema       = schema{-1, bytesField}
)

// decodeSlice reads a stored slice of the Service service and stamps it with its etcd
// revisions.
func decodeSlice(b []byte, service string, modRev, createRev int64) (*kube.EndpointSlice, error) {
	s := &kube.EndpointSlice{Service: service, Revision: modRev, CreateRevision: createRev}
	err := fields(b, sliceSchema, func(num protowire.Number, v []byte, _ uint64) error {
		switch num {
		case 1:
			s.Namespace = string(v)
		case 2:
			s.Name = string(v)
		case 3:
			return mapEntry(&s.Labels, v)
		case 4:
			return mapEntry(&s.Annotations, v)
		case 5:
			s.AddressType = string(v)
		case 6:
			s.ServiceUID = string(v)
		case 7:
			e, err := decodeSliceEndpoint(v)
			s.Endpoints = append(s.Endpoints, e)
			return err
		case 8:
			p, err := decodePort(v)
			s.Ports = append(s.Ports, p)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("decode stored endpoint slice: %w", err)
	}
	return s, nil
}

func decodeSliceEndpoint(b []byte) (kube.SliceEndpoint, error) {
	var e kube.SliceEndpoint
	err := fields(b, sliceEndpointSchema, func(num protowire.Number, v []byte, _ uint64) error {
		switch num {
		case 1:
			e.Addresses = append(e.Addresses, string(v))
		case 2:
			return fields(v, conditionsSchema, func(num protowire.Number, _ []byte, n uint64) error {
				c := kube.Bool(protowire.DecodeBool(n))
				switch num {
				case 1:
					e.Ready = c
				case 2:
					e.Serving = c
				case 3:
					e.Terminating = c
				}
				return nil
			})
		case 3:
			e.Hostname = string(v)
		case 4:
			e.NodeName = string(v)
		case 5:
			e.Zone = string(v)
		case 6:
			r, err := decodeRef(v)
			e.TargetRef = r
			return err
		case 7:
			h, err := decodeHints(v)
			e.Hints = h
			return err
		}
		return nil
	})
	return e, err
}

func decodeHints(b []byte) (*kube.Hints, error) {
	h := &kube.Hints{}
	err := fields(b, hintsSchema, func(num protowire.Number, v []byte, _ uint64) error {
		var name string
		err := fields(v, nameSchema, func(_ protowire.Number, v []byte, _ uint64) error {
			name = string(v)
			return nil
		})
		if num == 1 {
			h.ForZones = append(h.ForZones, name)
		} else {
			h.ForNodes = append(h.ForNodes, name)
		}
		return err
	})
	return h, err
}
