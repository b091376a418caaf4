package client

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// statusErr builds a status error with details, as allocd's server does.
func statusErr(t *testing.T, c codes.Code, msg string, details ...protoadapt.MessageV1) error {
	t.Helper()
	st, err := status.New(c, msg).WithDetails(details...)
	if err != nil {
		t.Fatalf("WithDetails: %v", err)
	}
	return st.Err()
}

func TestMapErrorSentinels(t *testing.T) {
	sentinels := []error{
		ErrInvalid, ErrAlreadyAllocated, ErrFull, ErrNotFound, ErrNotOwner, ErrStaleSnapshot,
		ErrFailedPrecondition, ErrUnavailable, ErrAborted, ErrUnimplemented, ErrNoSpace,
		context.Canceled, context.DeadlineExceeded,
	}
	notOwner := &errdetails.ErrorInfo{Reason: reasonNotOwner, Domain: "allocd.io"}
	stale := &errdetails.ErrorInfo{Reason: reasonStaleSnapshot, Domain: "allocd.io"}
	other := &errdetails.ErrorInfo{Reason: "NOT_LEADER", Domain: "allocd.io"}
	noSpace := &errdetails.ErrorInfo{Reason: reasonNoSpace, Domain: "allocd.io"}
	const (
		allocate = allocdv1.AllocatorService_Allocate_FullMethodName
		release  = allocdv1.AllocatorService_Release_FullMethodName
		push     = allocdv1.RepairService_PushServiceSnapshot_FullMethodName
		repair   = allocdv1.RepairService_RunRepair_FullMethodName
	)
	tests := []struct {
		method string
		err    error
		want   error
	}{
		{allocate, statusErr(t, codes.InvalidArgument, "bad"), ErrInvalid},
		{allocate, statusErr(t, codes.AlreadyExists, "held"), ErrAlreadyAllocated},
		{allocate, statusErr(t, codes.ResourceExhausted, "full"), ErrFull},
		{allocate, statusErr(t, codes.ResourceExhausted, "etcd out of space", noSpace), ErrNoSpace},
		{allocate, statusErr(t, codes.NotFound, "free"), ErrNotFound},
		{release, statusErr(t, codes.FailedPrecondition, "not yours"), ErrNotOwner},
		{release, statusErr(t, codes.FailedPrecondition, "not yours", notOwner), ErrNotOwner},
		{repair, statusErr(t, codes.FailedPrecondition, "not yours", notOwner), ErrNotOwner},
		{push, statusErr(t, codes.FailedPrecondition, "old"), ErrStaleSnapshot},
		{repair, statusErr(t, codes.FailedPrecondition, "old", stale), ErrStaleSnapshot},
		{repair, statusErr(t, codes.FailedPrecondition, "no leader", other), ErrFailedPrecondition},
		{release, statusErr(t, codes.Unavailable, "down"), ErrUnavailable},
		{allocate, statusErr(t, codes.Aborted, "conflict"), ErrAborted},
		{allocate, statusErr(t, codes.Unimplemented, "later"), ErrUnimplemented},
		{allocate, statusErr(t, codes.Canceled, "canceled"), context.Canceled},
		{allocate, statusErr(t, codes.DeadlineExceeded, "late"), context.DeadlineExceeded},
		{allocate, statusErr(t, codes.Internal, "bug"), nil},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/%v", tc.method, status.Code(tc.err)), func(t *testing.T) {
			got := mapError(tc.method, tc.err)
			for _, s := range sentinels {
				if is, want := errors.Is(got, s), s == tc.want; is != want {
					t.Errorf("errors.Is(mapError(%q, %v), %v) = %v; want %v", tc.method, tc.err, s, is, want)
				}
			}
			if c := status.Code(got); c != status.Code(tc.err) {
				t.Errorf("status.Code(mapError(%q, %v)) = %v; want %v", tc.method, tc.err, c,
					status.Code(tc.err))
			}
			var e *Error
			if !errors.As(got, &e) {
				t.Fatalf("errors.As(mapError(%q, %v), *Error) = false; want true", tc.method, tc.err)
			}
			if e.GRPCStatus().Code() != status.Code(tc.err) {
				t.Errorf("GRPCStatus().Code() = %v; want %v", e.GRPCStatus().Code(), status.Code(tc.err))
			}
		})
	}
}

func TestMapErrorDetails(t *testing.T) {
	invalid := mapError("", statusErr(t, codes.InvalidArgument, "bad request",
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: "owner.uid", Description: "required"},
			{Field: "cluster_ips[0]", Description: "not an IP address"},
		}},
		&errdetails.ErrorInfo{Reason: "INVALID_ARGUMENT", Domain: "allocd.io"}))
	var inv *InvalidError
	if !errors.As(invalid, &inv) {
		t.Fatalf("errors.As(%v, *InvalidError) = false; want true", invalid)
	}
	wantViolations := []FieldViolation{{"owner.uid", "required"}, {"cluster_ips[0]", "not an IP address"}}
	if fmt.Sprint(inv.Violations) != fmt.Sprint(wantViolations) {
		t.Errorf("Violations = %v; want %v", inv.Violations, wantViolations)
	}
	var e *Error
	if errors.As(invalid, &e); e.Reason != "INVALID_ARGUMENT" {
		t.Errorf("Reason = %q; want %q", e.Reason, "INVALID_ARGUMENT")
	}

	held := mapError("", statusErr(t, codes.AlreadyExists, "held",
		&errdetails.ResourceInfo{ResourceType: "allocd.v1.Allocation", ResourceName: "10.96.0.10",
			Owner: "default/web uid-1"},
		&errdetails.ErrorInfo{Reason: "ALREADY_ALLOCATED", Domain: "allocd.io",
			Metadata: map[string]string{"holder_uid": "uid-1"}}))
	var aae *AlreadyAllocatedError
	if !errors.As(held, &aae) {
		t.Fatalf("errors.As(%v, *AlreadyAllocatedError) = false; want true", held)
	}
	if aae.Resource != "10.96.0.10" || aae.Holder != "default/web uid-1" || aae.HolderUID != "uid-1" ||
		aae.ResourceType != "allocd.v1.Allocation" {
		t.Errorf("AlreadyAllocatedError = %+v; want 10.96.0.10 held by default/web uid-1", aae)
	}

	full := mapError("", statusErr(t, codes.ResourceExhausted, "full",
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: "10.96.0.0/29",
			Description: "no free address"}}}))
	var fe *FullError
	if !errors.As(full, &fe) || len(fe.Violations) != 1 || fe.Violations[0].Subject != "10.96.0.0/29" {
		t.Errorf("errors.As(%v, *FullError) gives %+v; want subject 10.96.0.0/29", full, fe)
	}

	// A code whose detail is missing still gives its typed error, empty.
	bare := mapError("", statusErr(t, codes.AlreadyExists, "held"))
	if !errors.As(bare, &aae) || aae.Holder != "" {
		t.Errorf("errors.As(%v, *AlreadyAllocatedError) gives %+v; want an empty one", bare, aae)
	}

	unavailable := mapError("", statusErr(t, codes.Unavailable, "etcd down",
		&errdetails.RetryInfo{RetryDelay: durationpb.New(1500 * time.Millisecond)}))
	if d := suggestedDelay(unavailable); d != 1500*time.Millisecond {
		t.Errorf("suggestedDelay(%v) = %v; want 1.5s", unavailable, d)
	}
}

func TestMapErrorPassThrough(t *testing.T) {
	plain := errors.New("not a status")
	if got := mapError("", plain); got != plain {
		t.Errorf("mapError(%v) = %v; want it unchanged", plain, got)
	}
	if got := mapError("", nil); got != nil {
		t.Errorf("mapError(nil) = %v; want nil", got)
	}
	once := mapError("", statusErr(t, codes.NotFound, "free"))
	if got := mapError("", once); got != once {
		t.Errorf("mapError(mapped) = %v; want it unchanged", got)
	}
	wrapped := fmt.Errorf("context: %w", once)
	if !errors.Is(wrapped, ErrNotFound) {
		t.Errorf("errors.Is(%v, ErrNotFound) = false; want true", wrapped)
	}
	if got := status.Code(wrapped); got != codes.NotFound {
		t.Errorf("status.Code(%v) = %v; want %v", wrapped, got, codes.NotFound)
	}
}
