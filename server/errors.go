package server

import (
	"context"
	"errors"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// errorDomain is the ErrorInfo domain of every allocd error.
const errorDomain = "allocd.io"

// ErrInvalid is the sentinel of InvalidError.
var ErrInvalid = errors.New("invalid argument")

// InvalidError is a request that fails validation: one violation per bad field. It maps
// to INVALID_ARGUMENT with a google.rpc.BadRequest detail.
type InvalidError struct {
	Violations []Violation
}

// Violation is one bad field of a request.
type Violation struct {
	Field       string
	Description string
}

// Invalid returns an InvalidError for one field.
func Invalid(field, description string) *InvalidError {
	return &InvalidError{Violations: []Violation{{Field: field, Description: description}}}
}

// Add adds a violation and returns e, so that validation can collect every bad field.
func (e *InvalidError) Add(field, description string) *InvalidError {
	e.Violations = append(e.Violations, Violation{Field: field, Description: description})
	return e
}

// OrNil returns nil when e holds no violation (so that it can be returned as an error).
func (e *InvalidError) OrNil() error {
	if e == nil || len(e.Violations) == 0 {
		return nil
	}
	return e
}

func (e *InvalidError) Error() string {
	if len(e.Violations) == 0 {
		return "invalid argument"
	}
	s := e.Violations[0].Field + ": " + e.Violations[0].Description
	for _, v := range e.Violations[1:] {
		s += "; " + v.Field + ": " + v.Description
	}
	return s
}

// Unwrap lets errors.Is(err, ErrInvalid) match.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

// ErrUnavailable is returned while allocd cannot serve (etcd unreachable, state not
// loaded). It maps to UNAVAILABLE with a RetryInfo detail.
var ErrUnavailable = errors.New("unavailable")

// retryDelay is the RetryInfo delay suggested with UNAVAILABLE.
const retryDelay = time.Second

// Status maps an error of any allocd package to a gRPC status error with google.rpc
// details. It is the one place where that mapping happens: domain packages return
// sentinels and typed errors, wrapped with %w as they like; this switch matches them
// with errors.Is and errors.As. Context errors pass through as CANCELED and
// DEADLINE_EXCEEDED; an error that is already a status is kept; anything unknown
// becomes INTERNAL.
func Status(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var inv *InvalidError
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.As(err, &inv):
		br := &errdetails.BadRequest{}
		for _, v := range inv.Violations {
			br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{
				Field: v.Field, Description: v.Description,
			})
		}
		return withDetails(codes.InvalidArgument, err.Error(), br, errorInfo("INVALID_ARGUMENT", nil))
	case errors.Is(err, ErrUnavailable):
		return withDetails(codes.Unavailable, err.Error(),
			&errdetails.RetryInfo{RetryDelay: durationpb.New(retryDelay)}, errorInfo("UNAVAILABLE", nil))
	}
	if st := domainStatus(err); st != nil {
		return st
	}
	if isEtcdUnavailable(err) {
		return withDetails(codes.Unavailable, "etcd unavailable: "+err.Error(),
			&errdetails.RetryInfo{RetryDelay: durationpb.New(retryDelay)}, errorInfo("ETCD_UNAVAILABLE", nil))
	}
	return status.Error(codes.Internal, err.Error())
}

// isEtcdUnavailable reports whether err comes from an etcd client call that could not
// reach a member, so the caller can retry.
func isEtcdUnavailable(err error) bool {
	st, ok := status.FromError(errors.Unwrap(err))
	for e := err; !ok && e != nil; e = errors.Unwrap(e) {
		st, ok = status.FromError(e)
	}
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return false
}

// withDetails builds a status with details; if a detail cannot be attached the status
// goes out without it rather than failing.
func withDetails(c codes.Code, msg string, details ...proto.Message) error {
	st := status.New(c, msg)
	var ds []protoadapt.MessageV1
	for _, d := range details {
		if d != nil {
			ds = append(ds, protoadapt.MessageV1Of(d))
		}
	}
	if with, err := st.WithDetails(ds...); err == nil {
		st = with
	}
	return st.Err()
}

// errorInfo is the ErrorInfo detail with a stable reason (UPPER_SNAKE_CASE).
func errorInfo(reason string, metadata map[string]string) *errdetails.ErrorInfo {
	return &errdetails.ErrorInfo{Reason: reason, Domain: errorDomain, Metadata: metadata}
}

// domainStatus maps the sentinels and typed errors of the domain packages (allocator,
// masterlease, repair). It returns nil for an error it does not know.
func domainStatus(err error) error {
	switch {
	// Cases of the domain packages go here, one block per package, e.g.:
	//   case errors.As(err, &allocated): return withDetails(codes.AlreadyExists, ...)

	// allocator: full, held by another owner, not in range, no range of the family,
	// not the owner, conflict, not found, invalid request (mapped by allocatorStatus
	// in server/allocator.go).
	case isAllocatorError(err):
		return allocatorStatus(err)

	// repair: stale snapshot, not the leader, bad snapshot or snapshot file, no
	// snapshot (mapped by repairStatus in server/repair.go).
	case isRepairError(err):
		return repairStatus(err)

	// masterlease: bad ip/ttl_seconds, state not ready, CAS retries exhausted (mapped
	// by leaseStatus in server/lease.go).
	case isLeaseError(err):
		return leaseStatus(err)
	}
	return nil
}
