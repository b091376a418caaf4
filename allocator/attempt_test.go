package allocator

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestOutcomeUnknown: what may have taken effect (a timeout, a lost connection, a
// leader that changed) is read back and retried; what etcd refused is not.
func TestOutcomeUnknown(t *testing.T) {
	for _, tc := range []struct {
		err     error
		unknown bool
	}{
		{context.DeadlineExceeded, true},
		{fmt.Errorf("txn: %w", context.DeadlineExceeded), true},
		{status.Error(codes.Unavailable, "connection reset"), true},
		{status.Error(codes.DeadlineExceeded, "deadline"), true},
		{rpctypes.ErrTimeout, true},
		{rpctypes.ErrTimeoutDueToLeaderFail, true},
		{rpctypes.ErrNoLeader, true},
		{rpctypes.ErrLeaderChanged, true},
		{rpctypes.ErrTooManyOps, false},
		{rpctypes.ErrNoSpace, false},
		{rpctypes.ErrDuplicateKey, false},
		{rpctypes.ErrPermissionDenied, false},
		{status.Error(codes.InvalidArgument, "bad"), false},
		// An error that says nothing may have come after the request was sent: read
		// back, as a timeout.
		{errors.New("something else"), true},
	} {
		if got := outcomeUnknown(tc.err); got != tc.unknown {
			t.Errorf("outcomeUnknown(%v) = %v; want %v", tc.err, got, tc.unknown)
		}
	}
}
