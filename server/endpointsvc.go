package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"

	"google.golang.org/grpc"

	"github.com/allocd/allocd/endpoints"
	"github.com/allocd/allocd/endpoints/kube"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
	"github.com/allocd/allocd/repair"
)

// controllerEndpoints names the Endpoints controller in *leader.NotLeaderError.
const controllerEndpoints = "endpoints"

// EndpointsService implements allocdv1.EndpointsServiceServer over an
// endpoints.Controller. The controller runs on the leader: a replica that does not
// lead forwards PushPodSnapshot and PushEvents to it (through its Forwarder) and
// answers UNAVAILABLE naming it when it cannot be reached. Get, List and Watch are
// answered by every replica from etcd.
type EndpointsService struct {
	allocdv1.UnimplementedEndpointsServiceServer
	c   *endpoints.Controller
	rep *repair.Controller
	fw  *Forwarder
	log *slog.Logger
}

// NewEndpointsService returns the EndpointsService of c; the Service events it takes
// feed rep too. It forwards through fw.
func NewEndpointsService(c *endpoints.Controller, rep *repair.Controller, fw *Forwarder,
	log *slog.Logger) *EndpointsService {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &EndpointsService{c: c, rep: rep, fw: fw, log: log}
}

// PushPodSnapshot takes a Pod snapshot in one or more chunks of one revision; it is
// applied (or forwarded) when the stream closes, whole or not at all.
func (s *EndpointsService) PushPodSnapshot(stream grpc.ClientStreamingServer[
	allocdv1.PushPodSnapshotRequest, allocdv1.PushPodSnapshotResponse]) error {
	ctx := stream.Context()
	chunks, rev, err := receiveChunks(stream, func(r *allocdv1.PushPodSnapshotRequest) (int64, bool) {
		return r.GetSnapshot().GetRevision(), r.GetSnapshot() != nil
	}, nil)
	if err != nil {
		return err
	}
	pods, err := podSnapshot(rev, chunks)
	if err != nil {
		return Status(err)
	}
	fresp, forwarded, err := toLeader(ctx, s.fw, controllerEndpoints, chunks,
		streamVia(allocdv1.NewEndpointsServiceClient, allocdv1.EndpointsServiceClient.PushPodSnapshot))
	switch {
	case err != nil:
		return err
	case forwarded:
		return stream.SendAndClose(fresp)
	}
	if err := s.c.ApplyPodSnapshot(ctx, rev, pods); err != nil {
		return Status(err)
	}
	return stream.SendAndClose(&allocdv1.PushPodSnapshotResponse{Revision: rev, PodCount: int64(len(pods))})
}

// podSnapshot converts and validates a Pod snapshot: a positive revision, well-formed
// Pods, no two of one namespace and name.
func podSnapshot(rev int64, chunks []*allocdv1.PushPodSnapshotRequest) ([]*kube.Pod, error) {
	inv := &endpoints.InvalidError{}
	if rev <= 0 {
		inv.Add("snapshot.revision", "must be positive (the revision of the Pod store the list was taken at)")
	}
	n := 0
	for _, ch := range chunks {
		n += len(ch.GetSnapshot().GetPods())
	}
	pods := make([]*kube.Pod, 0, n)
	seen := make(map[string]int, n)
	for _, ch := range chunks {
		for _, p := range ch.GetSnapshot().GetPods() {
			i := len(pods)
			f := "snapshot.pods[" + strconv.Itoa(i) + "]"
			pod := podFromProto(p, f, inv)
			if j, dup := seen[pod.Key()]; dup {
				inv.Add(f+".name", fmt.Sprintf("%s is also snapshot.pods[%d]", pod.Key(), j))
			}
			seen[pod.Key()] = i
			pods = append(pods, pod)
		}
	}
	if err := inv.OrNil(); err != nil {
		return nil, err
	}
	return pods, nil
}

// PushNodeSnapshot takes a Node snapshot in one or more chunks of one revision; it is
// applied (or forwarded) when the stream closes, whole or not at all.
func (s *EndpointsService) PushNodeSnapshot(stream grpc.ClientStreamingServer[
	allocdv1.PushNodeSnapshotRequest, allocdv1.PushNodeSnapshotResponse]) error {
	ctx := stream.Context()
	chunks, rev, err := receiveChunks(stream, func(r *allocdv1.PushNodeSnapshotRequest) (int64, bool) {
		return r.GetSnapshot().GetRevision(), r.GetSnapshot() != nil
	}, nil)
	if err != nil {
		return err
	}
	nodes, err := nodeSnapshot(rev, chunks)
	if err != nil {
		return Status(err)
	}
	fresp, forwarded, err := toLeader(ctx, s.fw, controllerEndpoints, chunks,
		streamVia(allocdv1.NewEndpointsServiceClient, allocdv1.EndpointsServiceClient.PushNodeSnapshot))
	switch {
	case err != nil:
		return err
	case forwarded:
		return stream.SendAndClose(fresp)
	}
	if err := s.c.ApplyNodeSnapshot(ctx, rev, nodes); err != nil {
		return Status(err)
	}
	return stream.SendAndClose(&allocdv1.PushNodeSnapshotResponse{Revision: rev,
		NodeCount: int64(len(nodes))})
}

// nodeSnapshot converts and validates a Node snapshot: a positive revision,
// well-formed Nodes, no two of one name.
func nodeSnapshot(rev int64, chunks []*allocdv1.PushNodeSnapshotRequest) ([]*kube.Node, error) {
	inv := &endpoints.InvalidError{}
	if rev <= 0 {
		inv.Add("snapshot.revision",
			"must be positive (the revision of the Node store the list was taken at)")
	}
	var nodes []*kube.Node
	seen := map[string]int{}
	for _, ch := range chunks {
		for _, p := range ch.GetSnapshot().GetNodes() {
			i := len(nodes)
			f := "snapshot.nodes[" + strconv.Itoa(i) + "]"
			n := nodeFromProto(p, f, inv)
			if j, dup := seen[n.Name]; dup {
				inv.Add(f+".name", fmt.Sprintf("%s is also snapshot.nodes[%d]", n.Name, j))
			}
			seen[n.Name] = i
			nodes = append(nodes, n)
		}
	}
	if err := inv.OrNil(); err != nil {
		return nil, err
	}
	return nodes, nil
}

// endpointsServices converts the Services of a snapshot's chunks for the Endpoints
// controller, refusing a malformed one or two of one namespace and name.
func endpointsServices(chunks []*allocdv1.PushServiceSnapshotRequest) ([]*kube.Service, error) {
	inv := &endpoints.InvalidError{}
	var out []*kube.Service
	seen := map[string]int{}
	i := 0
	for _, ch := range chunks {
		for _, p := range ch.GetSnapshot().GetServices() {
			f := "snapshot.services[" + strconv.Itoa(i) + "]"
			svc := serviceFromProto(p, f, inv)
			if j, dup := seen[svc.Key()]; dup {
				inv.Add(f+".name", fmt.Sprintf("%s is also snapshot.services[%d]", svc.Key(), j))
			}
			seen[svc.Key()] = i
			out = append(out, svc)
			i++
		}
	}
	if err := inv.OrNil(); err != nil {
		return nil, err
	}
	return out, nil
}

// PushEvents applies every message of the stream in order (or forwards them all to the
// leader); a malformed message is refused before anything of it is applied, and ends
// the stream with the messages before it applied.
func (s *EndpointsService) PushEvents(stream grpc.ClientStreamingServer[
	allocdv1.PushEventsRequest, allocdv1.PushEventsResponse]) error {
	ctx := stream.Context()
	var msgs []*allocdv1.PushEventsRequest
	var batches [][]endpoints.Event
	for {
		req, err := stream.Recv()
		if err != nil {
			if err == io.EOF {
				break
			}
			return err
		}
		evs, err := eventsFromProto(req)
		if err != nil {
			return Status(fmt.Errorf("message %d: %w", len(msgs), err))
		}
		msgs = append(msgs, req)
		batches = append(batches, evs)
	}
	fresp, forwarded, err := toLeader(ctx, s.fw, controllerEndpoints, msgs,
		streamVia(allocdv1.NewEndpointsServiceClient, allocdv1.EndpointsServiceClient.PushEvents))
	switch {
	case err != nil:
		return err
	case forwarded:
		// Keep repair's copy current too, for when this replica leads.
		for _, m := range msgs {
			s.rep.ApplyServiceEvents(repairEvents(m))
		}
		return stream.SendAndClose(fresp)
	}
	resp, err := s.apply(ctx, msgs, batches)
	if err != nil {
		return Status(err)
	}
	return stream.SendAndClose(resp)
}

// apply applies the validated batches of events of msgs on the leader.
func (s *EndpointsService) apply(ctx context.Context, msgs []*allocdv1.PushEventsRequest,
	batches [][]endpoints.Event) (*allocdv1.PushEventsResponse, error) {
	resp := &allocdv1.PushEventsResponse{}
	for i, evs := range batches {
		res, err := s.c.ApplyEvents(ctx, evs)
		if err != nil {
			return nil, err
		}
		// One Service feed: repair's passes judge against what the controller sees.
		s.rep.ApplyServiceEvents(repairEvents(msgs[i]))
		resp.Applied += int64(res.Applied)
		resp.Ignored += int64(res.Ignored)
		setRevisions(resp, res)
	}
	if len(batches) == 0 {
		// An empty stream is a heartbeat: it answers SNAPSHOT_REQUIRED while the
		// leader's term lacks a snapshot, so that a feeder learns of a new leader.
		res, err := s.c.ApplyEvents(ctx, nil)
		if err != nil {
			return nil, err
		}
		setRevisions(resp, res)
	}
	return resp, nil
}

// setRevisions copies the feeds' revisions after a batch of events into resp.
func setRevisions(resp *allocdv1.PushEventsResponse, res endpoints.EventsResult) {
	resp.ServiceRevision, resp.PodRevision, resp.NodeRevision = res.ServiceRevision, res.PodRevision,
		res.NodeRevision
}

// GetServiceEndpoints returns one stored object.
func (s *EndpointsService) GetServiceEndpoints(ctx context.Context,
	req *allocdv1.GetServiceEndpointsRequest) (*allocdv1.GetServiceEndpointsResponse, error) {
	e, err := s.c.Get(ctx, req.GetNamespace(), req.GetName())
	if err != nil {
		return nil, Status(err)
	}
	return &allocdv1.GetServiceEndpointsResponse{Endpoints: endpointsToProto(e)}, nil
}

// ListServiceEndpoints returns one page.
func (s *EndpointsService) ListServiceEndpoints(ctx context.Context,
	req *allocdv1.ListServiceEndpointsRequest) (*allocdv1.ListServiceEndpointsResponse, error) {
	eps, next, rev, err := s.c.List(ctx, req.GetNamespace(), int(req.GetPageSize()), req.GetPageToken())
	if err != nil {
		return nil, Status(err)
	}
	resp := &allocdv1.ListServiceEndpointsResponse{NextPageToken: next, Revision: rev,
		Endpoints: make([]*allocdv1.ServiceEndpoints, len(eps))}
	for i, e := range eps {
		resp.Endpoints[i] = endpointsToProto(e)
	}
	return resp, nil
}

// WatchServiceEndpoints streams changes until the client goes away or the server stops.
func (s *EndpointsService) WatchServiceEndpoints(req *allocdv1.WatchServiceEndpointsRequest,
	stream grpc.ServerStreamingServer[allocdv1.WatchServiceEndpointsResponse]) error {
	err := s.c.WatchStored(stream.Context(), req.GetNamespace(), req.GetStartRevision(),
		func(ev endpoints.WatchEvent) error { return stream.Send(endpointsWatchResponse(ev)) })
	if err != nil && stream.Context().Err() == nil {
		return Status(err)
	}
	return nil
}

// ListEndpointSlices returns one page of slices.
func (s *EndpointsService) ListEndpointSlices(ctx context.Context,
	req *allocdv1.ListEndpointSlicesRequest) (*allocdv1.ListEndpointSlicesResponse, error) {
	sl, next, rev, err := s.c.ListSlices(ctx, req.GetNamespace(), req.GetServiceName(),
		int(req.GetPageSize()), req.GetPageToken())
	if err != nil {
		return nil, Status(err)
	}
	resp := &allocdv1.ListEndpointSlicesResponse{NextPageToken: next, Revision: rev,
		EndpointSlices: make([]*allocdv1.EndpointSlice, len(sl))}
	for i, es := range sl {
		resp.EndpointSlices[i] = sliceToProto(es)
	}
	return resp, nil
}

// WatchEndpointSlices streams changes of slices until the client goes away or the
// server stops.
func (s *EndpointsService) WatchEndpointSlices(req *allocdv1.WatchEndpointSlicesRequest,
	stream grpc.ServerStreamingServer[allocdv1.WatchEndpointSlicesResponse]) error {
	err := s.c.WatchSlicesStored(stream.Context(), req.GetNamespace(), req.GetStartRevision(),
		func(ev endpoints.SliceWatchEvent) error { return stream.Send(sliceWatchResponse(ev)) })
	if err != nil && stream.Context().Err() == nil {
		return Status(err)
	}
	return nil
}
