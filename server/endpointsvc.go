package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/endpoints"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
	"github.com/allocd/allocd/repair"
)

// EndpointsService implements allocdv1.EndpointsServiceServer over an
// endpoints.Controller. The controller runs on the repair leader: a replica that is
// not the leader forwards PushPodSnapshot and PushEvents to it (the election value is
// its gRPC address) and answers UNAVAILABLE naming it when it cannot be reached. Get,
// List and Watch are answered by every replica from etcd.
type EndpointsService struct {
	allocdv1.UnimplementedEndpointsServiceServer
	c     *endpoints.Controller
	rep   *repair.Controller
	log   *slog.Logger
	conns leaderConns
}

// NewEndpointsService returns the EndpointsService of c, whose leader is rep's. Call
// Close at shutdown.
func NewEndpointsService(c *endpoints.Controller, rep *repair.Controller, log *slog.Logger) *EndpointsService {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &EndpointsService{c: c, rep: rep, log: log}
}

// SetPeerCredentials makes the calls forwarded to the leader use creds, as
// RepairService.SetPeerCredentials. Call it before serving.
func (s *EndpointsService) SetPeerCredentials(creds credentials.TransportCredentials) {
	s.conns.creds = creds
}

// Close closes the connections opened to forward calls to the leader.
func (s *EndpointsService) Close() error { return s.conns.close() }

// PushPodSnapshot takes a Pod snapshot in one or more chunks of one revision; it is
// applied (or forwarded) when the stream closes, whole or not at all.
func (s *EndpointsService) PushPodSnapshot(stream grpc.ClientStreamingServer[allocdv1.PushPodSnapshotRequest, allocdv1.PushPodSnapshotResponse]) error {
	ctx := stream.Context()
	var chunks []*allocdv1.PushPodSnapshotRequest
	var rev int64
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if req.GetSnapshot() == nil {
			return Status(Invalid("snapshot", "required in every chunk"))
		}
		if len(chunks) == 0 {
			rev = req.GetSnapshot().GetRevision()
		} else if r := req.GetSnapshot().GetRevision(); r != rev {
			return Status(Invalid("snapshot.revision", fmt.Sprintf("chunk %d has revision %d but the first chunk had %d: every chunk of one stream carries the same revision",
				len(chunks), r, rev)))
		}
		chunks = append(chunks, req)
	}
	if len(chunks) == 0 {
		return Status(Invalid("snapshot", "the stream carried no chunk"))
	}
	pods, err := podSnapshot(rev, chunks)
	if err != nil {
		return Status(err)
	}
	resp := &allocdv1.PushPodSnapshotResponse{Revision: rev, PodCount: int64(len(pods))}
	fresp, forwarded, err := toLeader(s, ctx, chunks, allocdv1.EndpointsServiceClient.PushPodSnapshot)
	if err != nil || forwarded {
		if err != nil {
			return err
		}
		return stream.SendAndClose(fresp)
	}
	if err := s.c.ApplyPodSnapshot(ctx, rev, pods); err != nil {
		return Status(err)
	}
	return stream.SendAndClose(resp)
}

// podSnapshot converts and validates a Pod snapshot: a positive revision, well-formed
// Pods, no two of one namespace and name.
func podSnapshot(rev int64, chunks []*allocdv1.PushPodSnapshotRequest) ([]*endpoints.Pod, error) {
	inv := &endpoints.InvalidError{}
	if rev <= 0 {
		inv.Add("snapshot.revision", "must be positive (the revision of the Pod store the list was taken at)")
	}
	n := 0
	for _, ch := range chunks {
		n += len(ch.GetSnapshot().GetPods())
	}
	pods := make([]*endpoints.Pod, 0, n)
	seen := make(map[string]int, n)
	for _, ch := range chunks {
		for _, p := range ch.GetSnapshot().GetPods() {
			i := len(pods)
			f := "snapshot.pods[" + strconv.Itoa(i) + "]"
			pod := endpoints.PodFromProto(p, f, inv)
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

// PushEvents applies every message of the stream in order (or forwards them all to the
// leader); a malformed message is refused before anything of it is applied, and ends
// the stream with the messages before it applied.
func (s *EndpointsService) PushEvents(stream grpc.ClientStreamingServer[allocdv1.PushEventsRequest, allocdv1.PushEventsResponse]) error {
	ctx := stream.Context()
	var msgs []*allocdv1.PushEventsRequest
	var batches [][]endpoints.Event
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		evs, err := endpoints.EventsFromProto(req)
		if err != nil {
			return Status(prefixViolations(err, "message "+strconv.Itoa(len(msgs))))
		}
		msgs = append(msgs, req)
		batches = append(batches, evs)
	}
	fresp, forwarded, err := toLeader(s, ctx, msgs, allocdv1.EndpointsServiceClient.PushEvents)
	if err != nil || forwarded {
		if err != nil {
			return err
		}
		// Keep repair's copy current too, for when this replica leads.
		for _, m := range msgs {
			s.rep.ApplyServiceEvents(repairEvents(m))
		}
		return stream.SendAndClose(fresp)
	}
	resp := &allocdv1.PushEventsResponse{}
	for i, evs := range batches {
		res, err := s.c.ApplyEvents(ctx, evs)
		if err != nil {
			return Status(err)
		}
		// One Service feed: repair's passes judge against what the controller sees.
		s.rep.ApplyServiceEvents(repairEvents(msgs[i]))
		resp.Applied += int64(res.Applied)
		resp.Ignored += int64(res.Ignored)
		resp.ServiceRevision, resp.PodRevision = res.ServiceRevision, res.PodRevision
	}
	if len(batches) == 0 {
		// An empty stream is a heartbeat: it answers SNAPSHOT_REQUIRED while the
		// leader's term lacks a snapshot, so that a feeder learns of a new leader.
		res, err := s.c.ApplyEvents(ctx, nil)
		if err != nil {
			return Status(err)
		}
		resp.ServiceRevision, resp.PodRevision = res.ServiceRevision, res.PodRevision
	}
	return stream.SendAndClose(resp)
}

// repairEvents is the Service part of one validated message, in repair's form.
func repairEvents(m *allocdv1.PushEventsRequest) []repair.ServiceEvent {
	var out []repair.ServiceEvent
	for _, ev := range m.GetEvents() {
		svc := ev.GetService()
		if svc == nil {
			continue
		}
		rev := ev.GetRevision()
		if rev == 0 {
			rev = m.GetRevision()
		}
		out = append(out, repair.ServiceEvent{
			Revision: rev,
			Deleted:  ev.GetType() == allocdv1.EventType_EVENT_TYPE_DELETE,
			Service:  repair.AppendServices(nil, []*allocdv1.Service{svc})[0],
		})
	}
	return out
}

// prefixViolations leaves err as it is: the field paths of EventsFromProto are those
// of one message, and the message is named in the status message.
func prefixViolations(err error, msg string) error {
	return fmt.Errorf("%s: %w", msg, err)
}

// GetServiceEndpoints returns one stored object.
func (s *EndpointsService) GetServiceEndpoints(ctx context.Context, req *allocdv1.GetServiceEndpointsRequest) (*allocdv1.GetServiceEndpointsResponse, error) {
	e, err := s.c.Get(ctx, req.GetNamespace(), req.GetName())
	if err != nil {
		return nil, Status(err)
	}
	return &allocdv1.GetServiceEndpointsResponse{Endpoints: endpoints.ToProto(e)}, nil
}

// ListServiceEndpoints returns one page.
func (s *EndpointsService) ListServiceEndpoints(ctx context.Context, req *allocdv1.ListServiceEndpointsRequest) (*allocdv1.ListServiceEndpointsResponse, error) {
	eps, next, rev, err := s.c.List(ctx, req.GetNamespace(), int(req.GetPageSize()), req.GetPageToken())
	if err != nil {
		return nil, Status(err)
	}
	resp := &allocdv1.ListServiceEndpointsResponse{NextPageToken: next, Revision: rev,
		Endpoints: make([]*allocdv1.ServiceEndpoints, len(eps))}
	for i, e := range eps {
		resp.Endpoints[i] = endpoints.ToProto(e)
	}
	return resp, nil
}

// WatchServiceEndpoints streams changes until the client goes away or the server stops.
func (s *EndpointsService) WatchServiceEndpoints(req *allocdv1.WatchServiceEndpointsRequest, stream grpc.ServerStreamingServer[allocdv1.WatchServiceEndpointsResponse]) error {
	err := s.c.Watch(stream.Context(), req.GetNamespace(), req.GetStartRevision(), func(ev endpoints.WatchEvent) error {
		return stream.Send(&allocdv1.WatchServiceEndpointsResponse{
			Type:      allocdv1.WatchEventType(ev.Type),
			Endpoints: endpoints.ToProto(ev.Endpoints),
			Revision:  ev.Revision,
		})
	})
	if err != nil && stream.Context().Err() == nil {
		return Status(err)
	}
	return nil
}

// target is the connection to forward to the leader, or the error to answer.
func (s *EndpointsService) target(ctx context.Context, leader string) (*grpc.ClientConn, error) {
	switch {
	case leader == "":
		return nil, Status(&endpoints.NotLeaderError{})
	case isForwarded(ctx), leader == s.rep.Identity():
		// Forwarded already, or the election still names this replica while its term
		// is over: leadership is changing.
		return nil, Status(&endpoints.NotLeaderError{Leader: leader})
	}
	cc, err := s.conns.get(leader)
	if err != nil {
		s.log.Warn("cannot dial the endpoints leader", "leader", leader, "error", err)
		return nil, Status(&endpoints.NotLeaderError{Leader: leader})
	}
	return cc, nil
}

// forwardErr passes the leader's answer through, and turns a leader that cannot be
// reached into UNAVAILABLE naming it.
func (s *EndpointsService) forwardErr(leader string, err error) error {
	if st, ok := status.FromError(err); ok && st.Code() != codes.Unavailable {
		return err
	}
	s.log.Warn("endpoints leader unreachable", "leader", leader, "error", err)
	return Status(fmt.Errorf("forwarding to the leader failed (%v): %w", err, &endpoints.NotLeaderError{Leader: leader}))
}

// toLeader forwards msgs to the leader with the client stream method open, unless
// this replica leads: forwarded is false then, and the caller applies msgs itself.
func toLeader[Req, Resp any](s *EndpointsService, ctx context.Context, msgs []*Req,
	open func(allocdv1.EndpointsServiceClient, context.Context, ...grpc.CallOption) (grpc.ClientStreamingClient[Req, Resp], error)) (resp *Resp, forwarded bool, err error) {
	leader, self, err := s.rep.Leader(ctx)
	if err != nil {
		return nil, false, Status(err)
	}
	if self {
		return nil, false, nil
	}
	cc, err := s.target(ctx, leader)
	if err != nil {
		return nil, true, err
	}
	cli := allocdv1.NewEndpointsServiceClient(cc)
	resp, err = forwardClientStream(forwardedBy(ctx, s.rep.Identity()), msgs,
		func(ctx context.Context, opts ...grpc.CallOption) (grpc.ClientStreamingClient[Req, Resp], error) {
			return open(cli, ctx, opts...)
		})
	if err != nil {
		return nil, true, s.forwardErr(leader, err)
	}
	return resp, true, nil
}

// forwardClientStream replays msgs on a client stream opened by open and returns its
// answer.
func forwardClientStream[Req, Resp any](ctx context.Context, msgs []*Req,
	open func(context.Context, ...grpc.CallOption) (grpc.ClientStreamingClient[Req, Resp], error)) (*Resp, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := open(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range msgs {
		if err := st.Send(m); err != nil {
			if err == io.EOF {
				break // the leader ended the stream: CloseAndRecv has its status
			}
			return nil, err
		}
	}
	return st.CloseAndRecv()
}
