package client

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/internal/loopback"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// A call to an address where no allocd listens never left the client: it fails
// UNAVAILABLE, and says that nothing was applied.
func TestNotSentIsNotApplied(t *testing.T) {
	addr, err := loopback.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(addr, WithRetry(RetryPolicy{MaxAttempts: 1}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = c.Allocate(ctx,
		&allocdv1.AllocateRequest{Owner: &allocdv1.Owner{Namespace: "ns", Name: "a", Uid: "u"}})
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.Unavailable || !e.NotApplied || OutcomeUnknown(err) {
		t.Fatalf("Allocate to %s with nothing listening = %v (NotApplied %v, OutcomeUnknown %v); want "+
			"UNAVAILABLE, not applied",
			addr, err, e != nil && e.NotApplied, OutcomeUnknown(err))
	}
}

// The server's word decides otherwise: UNAVAILABLE is of unknown outcome unless its
// ErrorInfo says outcome=not_applied; the codes answered before any write are not.
func TestOutcomeUnknown(t *testing.T) {
	const allocate = allocdv1.AllocatorService_Allocate_FullMethodName
	notApplied := &errdetails.ErrorInfo{Reason: "ETCD_UNAVAILABLE", Domain: "allocd.io",
		Metadata: map[string]string{"outcome": "not_applied"}}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{statusErr(t, codes.Unavailable, "etcd unavailable"), true},
		{statusErr(t, codes.DeadlineExceeded, "deadline"), true},
		{statusErr(t, codes.Unavailable, "etcd unavailable, nothing applied", notApplied), false},
		{statusErr(t, codes.InvalidArgument, "bad"), false},
		{statusErr(t, codes.AlreadyExists, "taken"), false},
		// etcd applies a write, then finds its quota exceeded and answers NOSPACE.
		{statusErr(t, codes.ResourceExhausted, "etcd out of space",
			&errdetails.ErrorInfo{Reason: "ETCD_NO_SPACE", Domain: "allocd.io"}), true},
		{nil, false},
	} {
		if got := OutcomeUnknown(mapError(allocate, tc.err)); got != tc.want {
			t.Errorf("OutcomeUnknown(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// A call whose first attempt reached allocd and failed with an unknown outcome stays
// unknown when a later attempt never left the client: that attempt changed nothing,
// the first may have.
func TestNotAppliedNeedsEveryAttempt(t *testing.T) {
	c := &Client{retry: RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond,
		MaxBackoff: time.Millisecond}}
	for _, tc := range []struct {
		name    string
		sent    []bool       // per attempt: did it reach allocd
		codes   []codes.Code // per attempt
		unknown bool         // OutcomeUnknown of the call
	}{
		{"sent, then not sent", []bool{true, false}, []codes.Code{codes.Unavailable, codes.Unavailable},
			true},
		{"never sent", []bool{false, false}, []codes.Code{codes.Unavailable, codes.Unavailable}, false},
		// A Release whose first attempt committed, and whose retry finds the address
		// taken by another owner meanwhile: the call did take effect.
		{"sent, then refused", []bool{true, true}, []codes.Code{codes.Unavailable, codes.FailedPrecondition},
			true},
		{"not sent, then refused", []bool{false, true},
			[]codes.Code{codes.Unavailable, codes.FailedPrecondition}, false},
	} {
		n := 0
		rpc := func(ctx context.Context, req *allocdv1.AllocateRequest,
			opts ...grpc.CallOption) (*allocdv1.AllocateResponse, error) {
			for _, o := range opts {
				if p, ok := o.(grpc.PeerCallOption); ok && tc.sent[n] {
					p.PeerAddr.Addr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}
				}
			}
			n++
			return nil, status.Error(tc.codes[n-1], "attempt failed")
		}
		_, err := unary(context.Background(), c, allocdv1.AllocatorService_Release_FullMethodName,
			&allocdv1.AllocateRequest{}, rpc)
		if got := OutcomeUnknown(err); got != tc.unknown {
			t.Errorf("%s: %v: OutcomeUnknown %v, want %v", tc.name, err, got, tc.unknown)
		}
	}
}
