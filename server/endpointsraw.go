package server

import (
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/allocd/allocd/endpoints"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// The watches send an object as it is stored when they can (endpoints.Stored: the
// encoding of the API's message without its revisions): the response's object field is
// written as the stored bytes with the revisions appended, among the response's
// unknown fields, which protobuf-go marshals verbatim; the watcher parses them as the
// object field they are. No decode, conversion and encoding again per event: the
// watch's cost was mostly that.

// The field numbers the stored bytes go under, from the generated descriptors.
var (
	epField       = fieldNumber(&allocdv1.WatchServiceEndpointsResponse{}, "endpoints")
	epRevision    = fieldNumber(&allocdv1.ServiceEndpoints{}, "revision")
	epCreated     = fieldNumber(&allocdv1.ServiceEndpoints{}, "create_revision")
	sliceField    = fieldNumber(&allocdv1.WatchEndpointSlicesResponse{}, "endpoint_slice")
	sliceRevision = fieldNumber(&allocdv1.EndpointSlice{}, "revision")
	sliceCreated  = fieldNumber(&allocdv1.EndpointSlice{}, "create_revision")
)

func fieldNumber(m proto.Message, name protoreflect.Name) protowire.Number {
	return m.ProtoReflect().Descriptor().Fields().ByName(name).Number()
}

// storedField is field num of a message holding st, its revisions under rev and created.
func storedField(num, rev, created protowire.Number, st *endpoints.Stored) protoreflect.RawFields {
	n := len(st.Value) + revisionSize(rev, st.ModRevision) + revisionSize(created, st.CreateRevision)
	b := make([]byte, 0, protowire.SizeTag(num)+protowire.SizeVarint(uint64(n))+n)
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	b = append(b, st.Value...)
	b = appendRevision(b, rev, st.ModRevision)
	return appendRevision(b, created, st.CreateRevision)
}

// appendRevision appends an int64 field, nothing for 0 (as proto3 leaves it out).
func appendRevision(b []byte, num protowire.Number, v int64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(v))
}

func revisionSize(num protowire.Number, v int64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(uint64(v))
}

// endpointsWatchResponse is the API's message of one change of an Endpoints object.
func endpointsWatchResponse(ev endpoints.WatchEvent) *allocdv1.WatchServiceEndpointsResponse {
	resp := &allocdv1.WatchServiceEndpointsResponse{Type: allocdv1.WatchEventType(ev.Type),
		Revision: ev.Revision}
	if ev.Stored != nil {
		resp.ProtoReflect().SetUnknown(storedField(epField, epRevision, epCreated, ev.Stored))
	} else {
		resp.Endpoints = endpointsToProto(ev.Endpoints)
	}
	return resp
}

// sliceWatchResponse is the API's message of one change of a slice.
func sliceWatchResponse(ev endpoints.SliceWatchEvent) *allocdv1.WatchEndpointSlicesResponse {
	resp := &allocdv1.WatchEndpointSlicesResponse{Type: allocdv1.WatchEventType(ev.Type),
		Revision: ev.Revision}
	if ev.Stored != nil {
		resp.ProtoReflect().SetUnknown(storedField(sliceField, sliceRevision, sliceCreated, ev.Stored))
	} else {
		resp.EndpointSlice = sliceToProto(ev.Slice)
	}
	return resp
}
