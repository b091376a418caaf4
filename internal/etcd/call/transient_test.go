package call_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/internal/etcd/call"
)

// Transient: a timeout, a lost connection, a leader that changed are tried again (and
// leave a write's outcome unknown); what etcd refused is not. NotApplied: only what
// proves that nothing was written.
func TestTransientAndNotApplied(t *testing.T) {
	for _, tc := range []struct {
		err                   error
		transient, notApplied bool
	}{
		{context.DeadlineExceeded, true, false},
		{fmt.Errorf("txn: %w", context.DeadlineExceeded), true, false},
		{status.Error(codes.Unavailable, "connection reset"), true, false},
		{status.Error(codes.DeadlineExceeded, "deadline"), true, false},
		{rpctypes.ErrTimeout, true, false},
		{rpctypes.ErrTimeoutDueToLeaderFail, true, false},
		{rpctypes.ErrLeaderChanged, true, false},
		{rpctypes.ErrNoLeader, true, true},
		{fmt.Errorf("txn: %w", rpctypes.ErrNoLeader), true, true},
		{rpctypes.ErrTooManyRequests, false, true},
		{status.Error(codes.Unknown, "raft proposal dropped"), true, true},
		{call.Unapplied(rpctypes.ErrTimeout), true, true},
		{call.MayHaveApplied(rpctypes.ErrNoLeader), true, false},
		{rpctypes.ErrTooManyOps, false, false},
		{rpctypes.ErrNoSpace, false, false},
		{rpctypes.ErrDuplicateKey, false, false},
		{rpctypes.ErrPermissionDenied, false, false},
		{status.Error(codes.InvalidArgument, "bad"), false, false},
		// An error that says nothing may have come after the request was sent.
		{errors.New("something else"), true, false},
	} {
		if got := call.Transient(tc.err); got != tc.transient {
			t.Errorf("Transient(%v) = %v; want %v", tc.err, got, tc.transient)
		}
		if got := call.NotApplied(tc.err); got != tc.notApplied {
			t.Errorf("NotApplied(%v) = %v; want %v", tc.err, got, tc.notApplied)
		}
	}
	if call.Unapplied(nil) != nil {
		t.Error("Unapplied(nil) != nil")
	}
}
