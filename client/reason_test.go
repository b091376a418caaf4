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
