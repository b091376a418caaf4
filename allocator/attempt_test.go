package allocator

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

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

// TestAttemptTimeout: a transaction waits longer only when every op in it timed out
// twice already, so that one unlucky op cannot keep a batch on a stalled member.
func TestAttemptTimeout(t *testing.T) {
	ops := func(timeouts ...int) []*op {
		var out []*op
		for _, n := range timeouts {
			out = append(out, &op{timeouts: n})
		}
		return out
	}
	for _, tc := range []struct {
		timeouts []int
		want     time.Duration
	}{
		{[]int{0}, time.Second},
		{[]int{1}, time.Second},
		{[]int{2}, 2 * time.Second},
		{[]int{9, 0}, time.Second},
		{[]int{3, 3}, 4 * time.Second},
		{[]int{20}, 8 * time.Second},
	} {
		if got := attemptTimeout(ops(tc.timeouts...)); got != tc.want {
			t.Errorf("attemptTimeout(timeouts %v) = %v; want %v", tc.timeouts, got, tc.want)
		}
	}
}
