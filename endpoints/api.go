package endpoints

import (
	"time"

	"github.com/allocd/allocd/endpoints/kube"
)

// EventType is what happened to an object of a feed.
type EventType int

// The types of events.
const (
	// Upsert is an object created or changed.
	Upsert EventType = iota + 1
	// Delete is an object deleted.
	Delete
)

// Event is one change of a Service, a Pod or a Node in the caller's store. Exactly
// one of Service, Pod and Node is set; for a Delete only their namespace and name
// matter.
type Event struct {
	Type     EventType
	Revision int64
	Service  *kube.Service
	Pod      *kube.Pod
	Node     *kube.Node
}

// kind is the kind of the event's object.
func (ev Event) kind() Kind {
	switch {
	case ev.Service != nil:
		return KindService
	case ev.Pod != nil:
		return KindPod
	}
	return KindNode
}

// EventsResult tells what ApplyEvents did.
type EventsResult struct {
	// Applied events changed the inputs; Ignored ones were not newer than what was
	// applied for their kind, or changed nothing the Endpoints depend on.
	Applied, Ignored int
	// ServiceRevision, PodRevision and NodeRevision applied after the events.
	ServiceRevision, PodRevision, NodeRevision int64
}

// WatchType is the kind of a change of a stored Endpoints object.
type WatchType int

// The types of watch events.
const (
	// Added is an object stored anew (or, at the start of a watch, stored already).
	Added WatchType = iota + 1
	// Modified is a stored object changed.
	Modified
	// Deleted is a stored object deleted.
	Deleted
)

// WatchEvent is one change of a stored Endpoints object. For Deleted, Endpoints is the
// last state and Revision the revision of the delete. From WatchStored, Stored instead
// of Endpoints when the stored form can be sent as it is.
type WatchEvent struct {
	Type      WatchType
	Endpoints *kube.Endpoints
	Stored    *Stored
	Revision  int64
}

// SliceWatchEvent is one change of a stored slice. For Deleted, Slice is the last
// state and Revision the revision of the delete. From WatchSlicesStored, Stored instead
// of Slice when the stored form can be sent as it is.
type SliceWatchEvent struct {
	Type     WatchType
	Slice    *kube.EndpointSlice
	Stored   *Stored
	Revision int64
}

// Stored is an object in its stored form, the encoding of the API's message without
// its revisions (ServiceEndpoints, EndpointSlice: see codec.go), with its revisions.
// WatchStored and WatchSlicesStored send one when what a watcher parses from it, with
// the revisions appended, is what the API's conversion of the decoded object would
// send (see exact.go); the server then passes it on without decoding it.
type Stored struct {
	Value                       []byte
	ModRevision, CreateRevision int64
}

// Defaults of Config, as kube-controller-manager's.
const (
	// DefaultWorkers is --concurrent-endpoint-syncs' default.
	DefaultWorkers = 5
	// DefaultBatchPeriod is --endpoint-updates-batch-period's default: no batching.
	DefaultBatchPeriod = time.Duration(0)
	// DefaultMasterResync is kube-apiserver's endpoint reconcile interval.
	DefaultMasterResync = 10 * time.Second
	// DefaultMaxEndpointsPerSlice is --max-endpoints-per-slice's default.
	DefaultMaxEndpointsPerSlice = 100
	// MaxMaxEndpointsPerSlice is the most --max-endpoints-per-slice takes.
	MaxMaxEndpointsPerSlice = 1000
	// DefaultPageSize is the page size of List and ListSlices when none is asked for.
	DefaultPageSize = 500
	// MaxPageSize is the largest page of List and ListSlices.
	MaxPageSize = 5000
)
