package endpoints

import (
	"errors"
	"fmt"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/allocd/allocd/endpoints/kube"
)

// The stored form of an Endpoints object is the protobuf encoding of the API's
// allocd.v1.ServiceEndpoints message, without the revisions (etcd keeps those), map
// entries sorted by key as protobuf's deterministic marshalling sorts them: what allocd
// has always stored, so that a store written by an older allocd reads the same. It is
// written and read here with protowire, field by field, so that the controller does not
// depend on the API's generated types (the server converts those) and spends no
// reflection on the hot path; TestCodecMatchesProto holds it to the generated code.
// This file also holds what the stored forms of both kinds share: the wire helpers,
// maps, object references and ports' decoding; slicecodec.go holds a slice's own.
//
// Field numbers, as in proto/allocd/v1/endpoints.proto and lease.proto:
//
//	ServiceEndpoints: 1 namespace, 2 name, 3 labels, 4 annotations, 5 subsets,
//	  6 revision (not stored), 7 service_uid, 8 managed_by, 9 address_count,
//	  10 create_revision (not stored)
//	ServiceEndpointSubset: 1 addresses, 2 not_ready_addresses, 3 ports
//	EndpointAddress: 1 ip, 2 hostname, 3 node_name, 4 target_ref
//	ObjectReference: 1 kind, 2 namespace, 3 name, 4 uid
//	EndpointPort: 1 name, 2 port, 3 protocol, 4 app_protocol (optional)

// encodeEndpoints is the stored form of e.
func encodeEndpoints(e *kube.Endpoints) []byte {
	b := make([]byte, 0, 256)
	b = appendString(b, 1, e.Namespace)
	b = appendString(b, 2, e.Name)
	b = appendMap(b, 3, e.Labels)
	b = appendMap(b, 4, e.Annotations)
	for _, s := range e.Subsets {
		b = appendMessage(b, 5, func(b []byte) []byte { return appendSubset(b, s) })
	}
	b = appendString(b, 7, e.ServiceUID)
	b = appendString(b, 8, e.ManagedBy)
	if e.AddressCount != 0 {
		b = protowire.AppendTag(b, 9, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(int64(e.AddressCount)))
	}
	return b
}

func appendSubset(b []byte, s kube.Subset) []byte {
	for _, a := range s.Addresses {
		b = appendMessage(b, 1, func(b []byte) []byte { return appendAddress(b, a) })
	}
	for _, a := range s.NotReadyAddresses {
		b = appendMessage(b, 2, func(b []byte) []byte { return appendAddress(b, a) })
	}
	for _, p := range s.Ports {
		b = appendMessage(b, 3, func(b []byte) []byte { return appendPort(b, p) })
	}
	return b
}

func appendAddress(b []byte, a kube.Address) []byte {
	b = appendString(b, 1, a.IP)
	b = appendString(b, 2, a.Hostname)
	b = appendString(b, 3, a.NodeName)
	return appendRef(b, 4, a.TargetRef)
}

// appendPort appends an EndpointPort. Its fields are proto3 scalars, left out when
// empty; a slice's port is another message (appendSlicePort).
func appendPort(b []byte, p kube.Port) []byte {
	b = appendString(b, 1, p.Name)
	if p.Port != 0 {
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(int64(p.Port)))
	}
	b = appendString(b, 3, p.Protocol)
	if p.AppProtocol != nil {
		b = protowire.AppendTag(b, 4, protowire.BytesType)
		b = protowire.AppendString(b, *p.AppProtocol)
	}
	return b
}

// appendString appends a proto3 string field, nothing when s is empty.
func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// appendPresentString appends an optional string field that is set, even when empty.
func appendPresentString(b []byte, num protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// appendRef appends an ObjectReference field, nothing when r is nil: an address's
// target, or a slice endpoint's.
func appendRef(b []byte, num protowire.Number, r *kube.ObjectRef) []byte {
	if r == nil {
		return b
	}
	return appendMessage(b, num, func(b []byte) []byte {
		b = appendString(b, 1, r.Kind)
		b = appendString(b, 2, r.Namespace)
		b = appendString(b, 3, r.Name)
		return appendString(b, 4, r.UID)
	})
}

// appendMessage appends an embedded message that body writes: its length is not known
// beforehand, so body writes after a one-byte length that is widened when needed.
func appendMessage(b []byte, num protowire.Number, body func([]byte) []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	at := len(b)
	b = append(b, 0)
	b = body(b)
	n := len(b) - at - 1
	if n < 0x80 {
		b[at] = byte(n)
		return b
	}
	size := protowire.SizeVarint(uint64(n))
	b = append(b, make([]byte, size-1)...)
	copy(b[at+size:], b[at+1:at+1+n])
	protowire.AppendVarint(b[:at], uint64(n))
	return b
}

// appendMap appends a map<string, string> field, its entries sorted by key.
func appendMap(b []byte, num protowire.Number, m map[string]string) []byte {
	if len(m) == 0 {
		return b
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := m[k]
		b = appendMessage(b, num, func(b []byte) []byte {
			// A map entry writes its key and value even when empty, as protobuf-go does.
			b = protowire.AppendTag(b, 1, protowire.BytesType)
			b = protowire.AppendString(b, k)
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			return protowire.AppendString(b, v)
		})
	}
	return b
}

// errMalformed is the cause of every stored value that does not decode.
var errMalformed = errors.New("malformed protobuf")

// decodeEndpoints reads a stored object and stamps it with its etcd revisions.
func decodeEndpoints(b []byte, modRev, createRev int64) (*kube.Endpoints, error) {
	e := &kube.Endpoints{Revision: modRev, CreateRevision: createRev}
	err := fields(b, endpointsSchema, func(num protowire.Number, v []byte, n uint64) error {
		switch num {
		case 1:
			e.Namespace = string(v)
		case 2:
			e.Name = string(v)
		case 3:
			return mapEntry(&e.Labels, v)
		case 4:
			return mapEntry(&e.Annotations, v)
		case 5:
			s, err := decodeSubset(v)
			e.Subsets = append(e.Subsets, s)
			return err
		case 7:
			e.ServiceUID = string(v)
		case 8:
			e.ManagedBy = string(v)
		case 9:
			e.AddressCount = int(int64(n))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("decode stored endpoints: %w", err)
	}
	return e, nil
}

func decodeSubset(b []byte) (kube.Subset, error) {
	var s kube.Subset
	err := fields(b, subsetSchema, func(num protowire.Number, v []byte, _ uint64) error {
		switch num {
		case 1, 2:
			a, err := decodeAddress(v)
			if num == 1 {
				s.Addresses = append(s.Addresses, a)
			} else {
				s.NotReadyAddresses = append(s.NotReadyAddresses, a)
			}
			return err
		case 3:
			p, err := decodePort(v)
			s.Ports = append(s.Ports, p)
			return err
		}
		return nil
	})
	return s, err
}

func decodeAddress(b []byte) (kube.Address, error) {
	var a kube.Address
	err := fields(b, stringsSchema, func(num protowire.Number, v []byte, _ uint64) error {
		switch num {
		case 1:
			a.IP = string(v)
		case 2:
			a.Hostname = string(v)
		case 3:
			a.NodeName = string(v)
		case 4:
			r, err := decodeRef(v)
			a.TargetRef = r
			return err
		}
		return nil
	})
	return a, err
}

// decodePort decodes an EndpointPort or an EndpointSlicePort (the same fields).
func decodePort(b []byte) (kube.Port, error) {
	var p kube.Port
	err := fields(b, portSchema, func(num protowire.Number, v []byte, n uint64) error {
		switch num {
		case 1:
			p.Name = string(v)
		case 2:
			p.Port = int32(n)
		case 3:
			p.Protocol = string(v)
		case 4:
			s := string(v)
			p.AppProtocol = &s
		}
		return nil
	})
	return p, err
}

// decodeRef decodes an ObjectReference.
func decodeRef(b []byte) (*kube.ObjectRef, error) {
	r := &kube.ObjectRef{}
	err := fields(b, stringsSchema, func(num protowire.Number, v []byte, _ uint64) error {
		switch num {
		case 1:
			r.Kind = string(v)
		case 2:
			r.Namespace = string(v)
		case 3:
			r.Name = string(v)
		case 4:
			r.UID = string(v)
		}
		return nil
	})
	return r, err
}

// mapEntry decodes one entry of a map<string, string> field into *m.
func mapEntry(m *map[string]string, b []byte) error {
	var k, v string
	err := fields(b, stringsSchema, func(num protowire.Number, val []byte, _ uint64) error {
		switch num {
		case 1:
			k = string(val)
		case 2:
			v = string(val)
		}
		return nil
	})
	if *m == nil {
		*m = map[string]string{}
	}
	(*m)[k] = v
	return err
}

// schema is the wire type of each field number of a message (index: the number); a
// number past its end is unknown.
type schema []protowire.Type

const (
	bytesField  = protowire.BytesType
	varintField = protowire.VarintType
)

// The stored messages' schemas.
var (
	endpointsSchema = schema{-1, bytesField, bytesField, bytesField, bytesField, bytesField,
		varintField, bytesField, bytesField, varintField, varintField}
	subsetSchema = schema{-1, bytesField, bytesField, bytesField}
	// stringsSchema decodes an address, a reference and a map entry.
	stringsSchema = schema{-1, bytesField, bytesField, bytesField, bytesField}
	portSchema    = schema{-1, bytesField, varintField, bytesField, bytesField}
)

// fields calls fn for every field of the message b that sc knows: for a
// length-delimited field with its bytes, for a varint with its value. Unknown fields are
// skipped; a known field of another wire type than sc's is malformed, as protobuf-go
// finds it.
func fields(b []byte, sc schema, fn func(num protowire.Number, v []byte, n uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errMalformed
		}
		b = b[n:]
		known := int(num) < len(sc) && sc[num] >= 0
		if known && sc[num] != typ {
			return fmt.Errorf("%w: field %d has wire type %d", errMalformed, num, typ)
		}
		var v []byte
		var x uint64
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return errMalformed
		}
		b = b[n:]
		if known {
			if err := fn(num, v, x); err != nil {
				return err
			}
		}
	}
	return nil
}
