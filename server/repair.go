package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/allocd/allocd/allocator"
	"github.com/allocd/allocd/endpoints"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
	"github.com/allocd/allocd/repair"
)

// Metadata of calls forwarded from a replica that is not the repair leader to the
// leader. A forwarded call is never forwarded again. The receipt keys carry the
// receipt of the replica that got the snapshot first, so that the leader judges with
// the earlier fence (it takes the earlier of its own and these; a caller can make the
// fence earlier, never later).
const (
	mdForwardedBy      = "allocd-forwarded-by"
	mdReceivedRevision = "allocd-received-revision"
	mdReceivedTime     = "allocd-received-time-unix-nano"
)

// RepairService implements allocdv1.RepairServiceServer over a repair.Controller.
//
// Snapshots of 100k Services: the server takes messages of up to MaxRecvMsgSize
// (16 MiB), and one message of 100k small Services is about 6 MiB, so it fits; larger
// snapshots are streamed in chunks (every chunk with the same revision), and the
// snapshot is taken when the stream closes.
//
// Behind a load balancer any replica may get a call: a replica that is not the repair
// leader forwards PushServiceSnapshot, RunRepair and GetRepairStatus to the leader (the
// election value is its gRPC address), keeps a copy of a snapshot the leader accepted,
// and answers UNAVAILABLE naming the leader if the leader cannot be reached.
type RepairService struct {
	allocdv1.UnimplementedRepairServiceServer
	c     *repair.Controller
	ec    *endpoints.Controller // nil: Service snapshots feed repair only
	log   *slog.Logger
	conns leaderConns
}

// NewRepairService returns the RepairService of c. Call Close at shutdown to close
// the connections to the leader.
func NewRepairService(c *repair.Controller, log *slog.Logger) *RepairService {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &RepairService{c: c, log: log}
}

// SetEndpoints makes the Service snapshots feed the Endpoints controller too (on the
// leader): one Service feed serves repair and the controller. Call it before serving.
func (s *RepairService) SetEndpoints(ec *endpoints.Controller) { s.ec = ec }

// SetPeerCredentials makes the calls forwarded to the leader use creds (with TLS on,
// the replica's own certificate as client certificate and the CA of the replicas';
// the leader authorizes the replica's identity). Without it they are plaintext. Call
// it before serving.
func (s *RepairService) SetPeerCredentials(creds credentials.TransportCredentials) {
	s.conns.creds = creds
}

// Close closes the connections opened to forward calls to the leader.
func (s *RepairService) Close() error { return s.conns.close() }

// PushServiceSnapshot takes a snapshot in one or more chunks of the same revision; the
// etcd revision at the first chunk is its receipt.
func (s *RepairService) PushServiceSnapshot(stream grpc.ClientStreamingServer[allocdv1.PushServiceSnapshotRequest, allocdv1.PushServiceSnapshotResponse]) error {
	ctx := stream.Context()
	var (
		chunks  []*allocdv1.PushServiceSnapshotRequest
		snap    repair.Snapshot
		receipt repair.Receipt
	)
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
			if receipt, err = s.c.Receive(ctx); err != nil {
				return Status(err)
			}
			snap.Revision = req.GetSnapshot().GetRevision()
		} else if r := req.GetSnapshot().GetRevision(); r != snap.Revision {
			return Status(Invalid("snapshot.revision", "chunk "+strconv.Itoa(len(chunks))+" has revision "+
				strconv.FormatInt(r, 10)+" but the first chunk had "+strconv.FormatInt(snap.Revision, 10)+
				": every chunk of one stream carries the same revision"))
		}
		chunks = append(chunks, req)
		snap.Services = repair.AppendServices(snap.Services, req.GetSnapshot().GetServices())
	}
	if len(chunks) == 0 {
		return Status(Invalid("snapshot", "the stream carried no chunk"))
	}
	receipt = receipt.Earlier(forwardedReceipt(ctx))
	if err := snap.Validate(); err != nil {
		return Status(err)
	}
	// What the Endpoints controller needs is validated too, before anything is
	// accepted: a malformed Service refuses the whole snapshot.
	var svcs []*endpoints.Service
	if s.ec != nil {
		var err error
		if svcs, err = endpointsServices(chunks); err != nil {
			return Status(err)
		}
	}
	resp := &allocdv1.PushServiceSnapshotResponse{Revision: snap.Revision, ServiceCount: int64(len(snap.Services))}

	leader, self, err := s.c.Leader(ctx)
	if err != nil {
		return Status(err)
	}
	if !self {
		fresp, err := s.forwardPush(ctx, leader, chunks, receipt)
		if err != nil {
			return err
		}
		// Keep a copy, for when this replica becomes leader.
		if err := s.c.Accept(ctx, snap, receipt); err != nil {
			s.log.WarnContext(ctx, "snapshot accepted by the leader but not kept here", "leader", leader, "error", err)
		}
		return stream.SendAndClose(fresp)
	}
	if err := s.c.Accept(ctx, snap, receipt); err != nil {
		return Status(err)
	}
	if s.ec != nil {
		if err := s.ec.ApplyServiceSnapshot(ctx, snap.Revision, svcs); err != nil {
			// Repair took it; the controller's term has not started yet (or just
			// ended): the caller pushes again, which repair takes again.
			return Status(fmt.Errorf("service snapshot accepted for repair but not by the Endpoints controller: %w", err))
		}
	}
	return stream.SendAndClose(resp)
}

// endpointsServices converts the Services of a snapshot's chunks for the Endpoints
// controller, refusing a malformed one or two of one namespace and name.
func endpointsServices(chunks []*allocdv1.PushServiceSnapshotRequest) ([]*endpoints.Service, error) {
	inv := &endpoints.InvalidError{}
	var out []*endpoints.Service
	seen := map[string]int{}
	i := 0
	for _, ch := range chunks {
		for _, p := range ch.GetSnapshot().GetServices() {
			f := "snapshot.services[" + strconv.Itoa(i) + "]"
			svc := endpoints.ServiceFromProto(p, f, inv)
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

// RunRepair runs a pass on the leader (here, or forwarded).
func (s *RepairService) RunRepair(ctx context.Context, req *allocdv1.RunRepairRequest) (*allocdv1.RunRepairResponse, error) {
	rep, err := s.c.RunRepair(ctx, req.GetDryRun())
	var nl *repair.NotLeaderError
	if errors.As(err, &nl) {
		cc, ferr := s.forwardTarget(ctx, nl.Leader)
		if ferr != nil {
			return nil, ferr
		}
		resp, err := allocdv1.NewRepairServiceClient(cc).RunRepair(s.forwardCtx(ctx), req)
		if err != nil {
			return nil, s.forwardErr(nl.Leader, err)
		}
		return resp, nil
	}
	if err != nil {
		return nil, Status(err)
	}
	return &allocdv1.RunRepairResponse{Report: reportProto(rep)}, nil
}

// GetRepairStatus returns the leader's status (here, or forwarded). With no leader
// elected it returns this replica's own, with an empty leader.
func (s *RepairService) GetRepairStatus(ctx context.Context, req *allocdv1.GetRepairStatusRequest) (*allocdv1.GetRepairStatusResponse, error) {
	st, err := s.c.Status(ctx)
	if err != nil {
		return nil, Status(err)
	}
	if !st.Leading && st.Leader != "" {
		cc, ferr := s.forwardTarget(ctx, st.Leader)
		if ferr != nil {
			return nil, ferr
		}
		resp, err := allocdv1.NewRepairServiceClient(cc).GetRepairStatus(s.forwardCtx(ctx), req)
		if err != nil {
			return nil, s.forwardErr(st.Leader, err)
		}
		return resp, nil
	}
	resp := &allocdv1.GetRepairStatusResponse{
		Leader:           st.Leader,
		SnapshotRevision: st.SnapshotRevision,
	}
	if st.LastReport != nil {
		resp.LastReport = reportProto(st.LastReport)
	}
	for _, cd := range st.Candidates {
		lc := &allocdv1.LeakCandidate{
			Range:              cd.Allocation.Range,
			Owner:              ownerProto(cd.Allocation.Owner),
			Strikes:            int32(cd.Strikes),
			StrikesLeft:        int32(cd.StrikesLeft),
			Age:                durationpb.New(cd.Age),
			AllocationRevision: cd.Allocation.ModRevision,
		}
		if cd.Allocation.Kind == allocator.KindClusterIP {
			lc.ClusterIp = cd.Allocation.Addr.String()
		} else {
			lc.NodePort = int32(cd.Allocation.Port)
		}
		resp.LeakCandidates = append(resp.LeakCandidates, lc)
	}
	return resp, nil
}

// forwardPush replays the chunks to the leader with this replica's receipt.
func (s *RepairService) forwardPush(ctx context.Context, leader string, chunks []*allocdv1.PushServiceSnapshotRequest, r repair.Receipt) (*allocdv1.PushServiceSnapshotResponse, error) {
	cc, err := s.forwardTarget(ctx, leader)
	if err != nil {
		return nil, err
	}
	fctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(s.forwardCtx(ctx),
		mdReceivedRevision, strconv.FormatInt(r.Revision, 10),
		mdReceivedTime, strconv.FormatInt(r.Time.UnixNano(), 10)))
	defer cancel()
	st, err := allocdv1.NewRepairServiceClient(cc).PushServiceSnapshot(fctx)
	if err != nil {
		return nil, s.forwardErr(leader, err)
	}
	for _, ch := range chunks {
		if err := st.Send(ch); err != nil {
			if err == io.EOF {
				break // the leader ended the stream: CloseAndRecv has its status
			}
			return nil, s.forwardErr(leader, err)
		}
	}
	resp, err := st.CloseAndRecv()
	if err != nil {
		return nil, s.forwardErr(leader, err)
	}
	return resp, nil
}

// forwardTarget returns a connection to the leader, or the error to answer when there
// is no leader to forward to (none elected, this call was forwarded already, or the
// election still names this replica while it is not leading).
func (s *RepairService) forwardTarget(ctx context.Context, leader string) (*grpc.ClientConn, error) {
	switch {
	case leader == "":
		return nil, Status(&repair.NotLeaderError{})
	case isForwarded(ctx):
		return nil, Status(&repair.NotLeaderError{Leader: leader})
	case leader == s.c.Identity():
		return nil, Status(&repair.NotLeaderError{Leader: leader, Err: errors.New("leadership is changing")})
	}
	cc, err := s.conns.get(leader)
	if err != nil {
		return nil, Status(&repair.NotLeaderError{Leader: leader, Err: err})
	}
	return cc, nil
}

// forwardCtx marks a call as forwarded (the deadline of ctx goes along).
func (s *RepairService) forwardCtx(ctx context.Context) context.Context {
	return forwardedBy(ctx, s.c.Identity())
}

// forwardErr passes the leader's answer through, and turns a leader that cannot be
// reached into UNAVAILABLE naming it.
func (s *RepairService) forwardErr(leader string, err error) error {
	if st, ok := status.FromError(err); ok && st.Code() != codes.Unavailable {
		return err
	}
	s.log.Warn("repair leader unreachable", "leader", leader, "error", err)
	return Status(&repair.NotLeaderError{Leader: leader, Err: err})
}

func isForwarded(ctx context.Context) bool {
	return len(metadata.ValueFromIncomingContext(ctx, mdForwardedBy)) > 0
}

// forwardedReceipt reads the receipt a forwarding replica sent (zero when none).
func forwardedReceipt(ctx context.Context) repair.Receipt {
	var r repair.Receipt
	if !isForwarded(ctx) {
		return r
	}
	if v := metadata.ValueFromIncomingContext(ctx, mdReceivedRevision); len(v) == 1 {
		if n, err := strconv.ParseInt(v[0], 10, 64); err == nil && n > 0 {
			r.Revision = n
		}
	}
	if v := metadata.ValueFromIncomingContext(ctx, mdReceivedTime); len(v) == 1 {
		if n, err := strconv.ParseInt(v[0], 10, 64); err == nil && n > 0 {
			r.Time = time.Unix(0, n)
		}
	}
	return r
}

func reportProto(r *repair.Report) *allocdv1.RepairReport {
	p := &allocdv1.RepairReport{
		StartTime:        timestamppb.New(r.Start),
		Duration:         durationpb.New(r.Duration),
		SnapshotRevision: r.SnapshotRevision,
		DryRun:           r.DryRun,
		Counts:           make(map[string]int64, len(r.Counts)),
		Findings:         make([]*allocdv1.Finding, 0, len(r.Findings)),
	}
	for k, v := range r.Counts {
		p.Counts[string(k)] = v
	}
	for _, f := range r.Findings {
		p.Findings = append(p.Findings, &allocdv1.Finding{
			Reason:    string(f.Reason),
			Range:     f.Range,
			ClusterIp: f.ClusterIP,
			NodePort:  int32(f.NodePort),
			Service:   ownerProto(f.Service),
			Message:   f.Message,
			Repaired:  f.Repaired,
		})
	}
	if r.Err != nil {
		p.Error = r.Err.Error()
	}
	return p
}

func ownerProto(o allocator.Owner) *allocdv1.Owner {
	return &allocdv1.Owner{Namespace: o.Namespace, Name: o.Name, Uid: o.UID}
}
