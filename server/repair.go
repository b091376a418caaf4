package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/allocd/allocd/endpoints"
	"github.com/allocd/allocd/endpoints/kube"
	"github.com/allocd/allocd/leader"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
	"github.com/allocd/allocd/repair"
)

// controllerRepair names repair in *leader.NotLeaderError.
const controllerRepair = "repair"

// RepairService implements allocdv1.RepairServiceServer over a repair.Controller.
//
// Snapshots of 100k Services: the server takes messages of up to MaxRecvMsgSize
// (16 MiB), and one message of 100k small Services is about 6 MiB, so it fits; larger
// snapshots are streamed in chunks (every chunk with the same revision), and the
// snapshot is taken when the stream closes.
//
// Behind a load balancer any replica may get a call: a replica that does not lead
// forwards PushServiceSnapshot, RunRepair and GetRepairStatus to the leader (through
// its Forwarder), keeps a copy of a snapshot the leader accepted, and answers
// UNAVAILABLE naming the leader if the leader cannot be reached.
type RepairService struct {
	allocdv1.UnimplementedRepairServiceServer
	c   *repair.Controller
	ec  *endpoints.Controller // nil: Service snapshots feed repair only
	fw  *Forwarder
	log *slog.Logger
}

// NewRepairService returns the RepairService of c, forwarding through fw.
func NewRepairService(c *repair.Controller, fw *Forwarder, log *slog.Logger) *RepairService {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &RepairService{c: c, fw: fw, log: log}
}

// SetEndpoints makes the Service snapshots feed the Endpoints controller too (on the
// leader): one Service feed serves repair and the controller. Call it before serving.
func (s *RepairService) SetEndpoints(ec *endpoints.Controller) { s.ec = ec }

// PushServiceSnapshot takes a snapshot in one or more chunks of the same revision; the
// etcd revision at the first chunk is its receipt.
func (s *RepairService) PushServiceSnapshot(stream grpc.ClientStreamingServer[
	allocdv1.PushServiceSnapshotRequest, allocdv1.PushServiceSnapshotResponse]) error {
	ctx := stream.Context()
	var receipt repair.Receipt
	chunks, rev, err := receiveChunks(stream, func(r *allocdv1.PushServiceSnapshotRequest) (int64, bool) {
		return r.GetSnapshot().GetRevision(), r.GetSnapshot() != nil
	}, func() (err error) {
		receipt, err = s.c.Receive(ctx)
		return err
	})
	if err != nil {
		return err
	}
	snap := repair.Snapshot{Revision: rev}
	for _, ch := range chunks {
		snap.Services = appendRepairServices(snap.Services, ch.GetSnapshot().GetServices())
	}
	receipt = receipt.Earlier(forwardedReceipt(ctx))
	if err := snap.Validate(); err != nil {
		return Status(err)
	}
	// What the Endpoints controller needs is validated too, before anything is
	// accepted: a malformed Service refuses the whole snapshot.
	var svcs []*kube.Service
	if s.ec != nil {
		if svcs, err = endpointsServices(chunks); err != nil {
			return Status(err)
		}
	}
	resp := &allocdv1.PushServiceSnapshotResponse{Revision: snap.Revision,
		ServiceCount: int64(len(snap.Services))}
	fresp, forwarded, err := toLeader(ctx, s.fw, controllerRepair, chunks,
		streamVia(allocdv1.NewRepairServiceClient, allocdv1.RepairServiceClient.PushServiceSnapshot),
		mdReceivedRevision, strconv.FormatInt(receipt.Revision, 10),
		mdReceivedTime, strconv.FormatInt(receipt.Time.UnixNano(), 10))
	if err != nil {
		return err
	}
	if forwarded {
		// Keep a copy, for when this replica becomes leader.
		if err := s.c.Accept(ctx, snap, receipt); err != nil {
			s.log.WarnContext(ctx, "snapshot accepted by the leader but not kept here", "error", err)
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
			return Status(fmt.Errorf(
				"service snapshot accepted for repair but not by the Endpoints controller: %w", err))
		}
	}
	return stream.SendAndClose(resp)
}

// RunRepair runs a pass on the leader (here, or forwarded).
func (s *RepairService) RunRepair(ctx context.Context,
	req *allocdv1.RunRepairRequest) (*allocdv1.RunRepairResponse, error) {
	rep, err := s.c.RunRepair(ctx, req.GetDryRun())
	var nl *leader.NotLeaderError
	if errors.As(err, &nl) {
		return forwardUnary(ctx, s.fw, controllerRepair, nl.Leader, req,
			unaryVia(allocdv1.NewRepairServiceClient, allocdv1.RepairServiceClient.RunRepair))
	}
	if err != nil {
		return nil, Status(err)
	}
	return &allocdv1.RunRepairResponse{Report: reportProto(rep)}, nil
}

// GetRepairStatus returns the leader's status (here, or forwarded). With no leader
// elected it returns this replica's own, with an empty leader; so it does while the
// election names this replica but its term has not started yet (or just ended).
func (s *RepairService) GetRepairStatus(ctx context.Context,
	req *allocdv1.GetRepairStatusRequest) (*allocdv1.GetRepairStatusResponse, error) {
	st, err := s.c.Status(ctx)
	if err != nil {
		return nil, Status(err)
	}
	if !st.Leading && st.Leader != "" && st.Leader != s.fw.lead.Identity() {
		return forwardUnary(ctx, s.fw, controllerRepair, st.Leader, req,
			unaryVia(allocdv1.NewRepairServiceClient, allocdv1.RepairServiceClient.GetRepairStatus))
	}
	return statusProto(st), nil
}

// forwardedReceipt reads the receipt a forwarding replica sent (zero when none).
func forwardedReceipt(ctx context.Context) repair.Receipt {
	var r repair.Receipt
	if !isForwarded(ctx) {
		return r
	}
	r.Revision = parseInt64(metadata.ValueFromIncomingContext(ctx, mdReceivedRevision))
	if n := parseInt64(metadata.ValueFromIncomingContext(ctx, mdReceivedTime)); n > 0 {
		r.Time = time.Unix(0, n)
	}
	return r
}
