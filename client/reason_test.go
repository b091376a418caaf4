package client

import (
	"errors"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// The server answers a PushServiceSnapshot forwarded to a replica that is no longer the
// repair leader with FAILED_PRECONDITION reason NOT_REPAIR_LEADER (the server's
// Forwarder.target refuses to forward it again; leaderStatus in server/errors.go maps
// the *leader.NotLeaderError): a failed precondition, not a stale snapshot.
func TestNotLeaderIsNotStale(t *testing.T) {
	st, _ := status.New(codes.FailedPrecondition, "not the repair leader").WithDetails(
		&errdetails.ErrorInfo{Reason: "NOT_REPAIR_LEADER", Domain: "allocd.io",
			Metadata: map[string]string{"leader": "10.0.0.2:8080"}})
	err := mapError(allocdv1.RepairService_PushServiceSnapshot_FullMethodName, st.Err())
	if errors.Is(err, ErrStaleSnapshot) {
		t.Errorf("NOT_REPAIR_LEADER from PushServiceSnapshot matches ErrStaleSnapshot: %v", err)
	}
	if !errors.Is(err, ErrFailedPrecondition) {
		t.Errorf("NOT_REPAIR_LEADER does not match ErrFailedPrecondition")
	}
}

// A Transfer of what its From does not hold is ErrNotOwner, named by its reason or, from
// a server that sends none, by the RPC; the metadata says who holds it, or that nobody
// does.
func TestTransferNotOwner(t *testing.T) {
	const transfer = allocdv1.AllocatorService_Transfer_FullMethodName
	free, _ := status.New(codes.FailedPrecondition, "NodePort 30051 is free").WithDetails(
		&errdetails.ErrorInfo{Reason: "NOT_OWNER", Domain: "allocd.io",
			Metadata: map[string]string{"item": "30051", "holder_uid": "", "free": "true"}})
	for _, st := range []*status.Status{free, status.New(codes.FailedPrecondition, "not held")} {
		err := mapError(transfer, st.Err())
		var e *Error
		if !errors.Is(err, ErrNotOwner) || !errors.As(err, &e) || OutcomeUnknown(err) {
			t.Errorf("Transfer refused with %v = %v; want ErrNotOwner, nothing applied", st.Err(), err)
		}
		if st == free && e.Metadata["free"] != "true" {
			t.Errorf("Transfer of a free item: metadata %v; want free=true", e.Metadata)
		}
	}
}
