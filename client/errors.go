package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// Sentinel errors that callers test with errors.Is. Every error a Client method returns
// for a failed call is an *Error; it matches the sentinel of its gRPC code (and, for
// FAILED_PRECONDITION, of its reason). A call that failed because its context ended
// matches context.Canceled or context.DeadlineExceeded instead.
var (
	// ErrInvalid is a malformed request or an address or port outside its range
	// (INVALID_ARGUMENT). errors.As with *InvalidError gives the field violations.
	ErrInvalid = errors.New("invalid argument")
	// ErrAlreadyAllocated is a specific address or port held by another owner
	// (ALREADY_EXISTS). errors.As with *AlreadyAllocatedError names the holder.
	ErrAlreadyAllocated = errors.New("already allocated")
	// ErrFull is a range with nothing left to allocate (RESOURCE_EXHAUSTED).
	// errors.As with *FullError names the range.
	ErrFull = errors.New("range is full")
	// ErrNotFound is a free address or port asked for by GetAllocation (NOT_FOUND).
	ErrNotFound = errors.New("not found")
	// ErrNotOwner is a Release of what another owner holds, without force, or a
	// Transfer of what its From does not hold (FAILED_PRECONDITION).
	ErrNotOwner = errors.New("held by another owner")
	// ErrStaleSnapshot is a Service snapshot older than the last one allocd accepted
	// (FAILED_PRECONDITION from PushServiceSnapshot).
	ErrStaleSnapshot = errors.New("stale snapshot")
	// ErrFailedPrecondition is any other FAILED_PRECONDITION; the *Error's Reason says
	// which (NOT_REPAIR_LEADER, NO_SNAPSHOT, RANGES_MISMATCH, SNAPSHOT_FILE_INVALID).
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrUnavailable is allocd (or its etcd) out of reach (UNAVAILABLE). Unary calls
	// were retried before this is returned; see RetryPolicy.
	ErrUnavailable = errors.New("unavailable")
	// ErrAborted is a write that lost too many compare-and-swap races (ABORTED); the
	// caller may retry the whole operation.
	ErrAborted = errors.New("aborted")
	// ErrUnimplemented is an RPC the server does not implement (UNIMPLEMENTED).
	ErrUnimplemented = errors.New("unimplemented")
	// ErrSnapshotRequired is an event pushed before the leader has a snapshot of its
	// kind in its term of leadership (FAILED_PRECONDITION, reason SNAPSHOT_REQUIRED):
	// push snapshots again, then the events. Feeder does.
	ErrSnapshotRequired = errors.New("snapshot required")
	// ErrCompacted is a watch from a revision etcd has compacted away (OUT_OF_RANGE):
	// list again and watch from the list's revision.
	ErrCompacted = errors.New("revision compacted")
	// ErrAlreadyExists is a ServiceCIDR name in use (ALREADY_EXISTS, reason
	// SERVICE_CIDR_EXISTS).
	ErrAlreadyExists = errors.New("already exists")
	// ErrTerminating is an address named that lies only in terminating ServiceCIDRs
	// (FAILED_PRECONDITION, reason SERVICE_CIDR_TERMINATING).
	ErrTerminating = errors.New("only in terminating ServiceCIDRs")
	// ErrPermissionDenied is a call the server's authorization policy does not allow
	// the client certificate's identity (PERMISSION_DENIED).
	ErrPermissionDenied = errors.New("permission denied")
	// ErrUnauthenticated is a call that needs a client certificate and was made
	// without one (UNAUTHENTICATED): see WithTLS.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrNoSpace is a write refused because etcd is out of space (RESOURCE_EXHAUSTED,
	// reason ETCD_NO_SPACE: its NOSPACE alarm is raised). Reads still work; writes
	// fail until an operator frees space and disarms the alarm. The write that raised
	// the alarm may have been applied (etcd applies it, then finds the quota
	// exceeded): OutcomeUnknown is true, retry it once space is freed.
	ErrNoSpace = errors.New("etcd out of space")
)

// ErrorInfo reasons that refine FAILED_PRECONDITION (allocd.v1.ErrorReason lists them
// all). allocd sends them in the google.rpc.ErrorInfo detail; when a server sends no
// reason the RPC decides (a refused Release is ErrNotOwner, a refused
// PushServiceSnapshot is ErrStaleSnapshot).
var (
	reasonNotOwner         = allocdv1.ErrorReason_NOT_OWNER.String()
	reasonStaleSnapshot    = allocdv1.ErrorReason_STALE_SNAPSHOT.String()
	reasonSnapshotRequired = allocdv1.ErrorReason_SNAPSHOT_REQUIRED.String()
	reasonCIDRExists       = allocdv1.ErrorReason_SERVICE_CIDR_EXISTS.String()
	reasonCIDRTerminating  = allocdv1.ErrorReason_SERVICE_CIDR_TERMINATING.String()
	reasonNoSpace          = allocdv1.ErrorReason_ETCD_NO_SPACE.String()
)

// Error is a failed allocd call: the gRPC status with its google.rpc details decoded.
// errors.Is matches it against the package's sentinels, errors.As finds the typed
// detail errors (*InvalidError, *AlreadyAllocatedError, *FullError) inside it, and
// status.FromError / status.Code still see the original status through GRPCStatus.
type Error struct {
	// Code is the gRPC status code.
	Code codes.Code
	// Message is the status message.
	Message string
	// Reason is the google.rpc.ErrorInfo reason ("" when the server sent none).
	Reason string
	// Metadata is the google.rpc.ErrorInfo metadata.
	Metadata map[string]string
	// RetryDelay is the google.rpc.RetryInfo delay the server suggested (0 when none).
	RetryDelay time.Duration
	// NotApplied is set when the call certainly changed nothing although its code
	// alone (UNAVAILABLE, DEADLINE_EXCEEDED) leaves that open: it never reached
	// allocd, or allocd says so (ErrorInfo metadata outcome=not_applied: it was not
	// ready, or etcd refused the write before proposing it). See OutcomeUnknown.
	NotApplied bool
	// MayHaveApplied is set when an earlier attempt of the call (the client retries
	// UNAVAILABLE) failed with an unknown outcome: whatever this error's code says, the
	// call may have taken effect. See OutcomeUnknown.
	MayHaveApplied bool

	status *status.Status
	kind   error // the sentinel, nil for codes without one
	detail error // *InvalidError, *AlreadyAllocatedError, *FullError or nil
}

// Error returns the status in gRPC's usual form: "rpc error: code = ... desc = ...".
func (e *Error) Error() string { return e.status.Err().Error() }

// GRPCStatus returns the original status, details included, so that status.FromError
// and status.Code work on the errors of this package.
func (e *Error) GRPCStatus() *status.Status { return e.status }

// Unwrap returns the sentinel of the error and its typed detail, so that errors.Is and
// errors.As see both.
func (e *Error) Unwrap() []error {
	var errs []error
	if e.kind != nil {
		errs = append(errs, e.kind)
	}
	if e.detail != nil {
		errs = append(errs, e.detail)
	}
	return errs
}

// InvalidError lists the bad fields of a request refused with INVALID_ARGUMENT, from
// the google.rpc.BadRequest detail. Violations is empty when the server sent none.
type InvalidError struct {
	// Violations are the bad fields, in the server's order.
	Violations []FieldViolation
}

// FieldViolation is one bad field of a request.
type FieldViolation struct {
	// Field is the path of the field, e.g. "owner.uid" or "cluster_ips[0]".
	Field string
	// Description says what is wrong with it.
	Description string
}

// Error lists the violations.
func (e *InvalidError) Error() string {
	if len(e.Violations) == 0 {
		return ErrInvalid.Error()
	}
	parts := make([]string, len(e.Violations))
	for i, v := range e.Violations {
		parts[i] = v.Field + ": " + v.Description
	}
	return "invalid argument: " + strings.Join(parts, "; ")
}

// Unwrap lets errors.Is(err, ErrInvalid) match.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

// AlreadyAllocatedError names what was asked for and who holds it, from the
// google.rpc.ResourceInfo detail of an ALREADY_EXISTS status.
type AlreadyAllocatedError struct {
	// ResourceType is the kind of resource, as allocd names it.
	ResourceType string
	// Resource is the address or port asked for, e.g. "10.96.0.10" or "30080".
	Resource string
	// Holder is the owner holding it, as allocd writes it ("namespace/name uid").
	Holder string
	// HolderUID is the holder's UID, from the ErrorInfo metadata ("" if absent).
	HolderUID string
	// Description is the server's description, if any.
	Description string
}

// Error names the resource and its holder.
func (e *AlreadyAllocatedError) Error() string {
	return fmt.Sprintf("%s is already allocated to %s", e.Resource, e.Holder)
}

// Unwrap lets errors.Is(err, ErrAlreadyAllocated) match.
func (e *AlreadyAllocatedError) Unwrap() error { return ErrAlreadyAllocated }

// FullError says which range is full, from the google.rpc.QuotaFailure detail of a
// RESOURCE_EXHAUSTED status.
type FullError struct {
	// Violations are the exhausted quotas; Subject is the range.
	Violations []QuotaViolation
}

// QuotaViolation is one exhausted quota.
type QuotaViolation struct {
	// Subject is what ran out, usually a range ("10.96.0.0/24", "30000-32767").
	Subject string
	// Description says more.
	Description string
}

// Error names the full ranges.
func (e *FullError) Error() string {
	if len(e.Violations) == 0 {
		return ErrFull.Error()
	}
	parts := make([]string, len(e.Violations))
	for i, v := range e.Violations {
		parts[i] = v.Subject
	}
	return "range is full: " + strings.Join(parts, ", ")
}

// Unwrap lets errors.Is(err, ErrFull) match.
func (e *FullError) Unwrap() error { return ErrFull }

// failedPreconditionByMethod is the sentinel of a FAILED_PRECONDITION that carries no
// ErrorInfo reason this package knows, by RPC.
var failedPreconditionByMethod = map[string]error{
	allocdv1.AllocatorService_Release_FullMethodName:          ErrNotOwner,
	allocdv1.AllocatorService_Transfer_FullMethodName:         ErrNotOwner,
	allocdv1.RepairService_PushServiceSnapshot_FullMethodName: ErrStaleSnapshot,
	allocdv1.EndpointsService_PushPodSnapshot_FullMethodName:  ErrStaleSnapshot,
}

// mapError is the one place that turns the error of an RPC into this package's errors.
// method is the full gRPC method name; it refines codes that mean different things for
// different RPCs. An error without a gRPC status passes through unchanged.
func mapError(method string, err error) error {
	if err == nil {
		return nil
	}
	if e := (*Error)(nil); errors.As(err, &e) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	e := &Error{Code: st.Code(), Message: st.Message(), status: st}
	e.decodeDetails(st)
	e.NotApplied = e.Metadata["outcome"] == "not_applied" || errors.As(err, new(*notSentError))
	e.kind = kindOf(method, e)
	// Each code has its typed detail, present even when the server sent none.
	switch e.Code {
	case codes.InvalidArgument:
		if _, ok := e.detail.(*InvalidError); !ok {
			e.detail = &InvalidError{}
		}
	case codes.AlreadyExists:
		if _, ok := e.detail.(*AlreadyAllocatedError); !ok {
			e.detail = &AlreadyAllocatedError{}
		}
	case codes.ResourceExhausted:
		if _, ok := e.detail.(*FullError); !ok && e.kind == ErrFull {
			e.detail = &FullError{}
		}
	}
	// A detail that does not belong to the code (a BadRequest on ABORTED, say) is
	// still reachable with errors.As; only the sentinel depends on the code.
	return e
}

// decodeDetails fills e from st's google.rpc details.
func (e *Error) decodeDetails(st *status.Status) {
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			e.Reason, e.Metadata = d.GetReason(), d.GetMetadata()
		case *errdetails.RetryInfo:
			e.RetryDelay = d.GetRetryDelay().AsDuration()
		case *errdetails.BadRequest:
			inv := &InvalidError{}
			for _, v := range d.GetFieldViolations() {
				inv.Violations = append(inv.Violations,
					FieldViolation{Field: v.GetField(), Description: v.GetDescription()})
			}
			e.detail = inv
		case *errdetails.ResourceInfo:
			e.detail = &AlreadyAllocatedError{
				ResourceType: d.GetResourceType(), Resource: d.GetResourceName(),
				Holder: d.GetOwner(), Description: d.GetDescription(),
			}
		case *errdetails.QuotaFailure:
			full := &FullError{}
			for _, v := range d.GetViolations() {
				full.Violations = append(full.Violations,
					QuotaViolation{Subject: v.GetSubject(), Description: v.GetDescription()})
			}
			e.detail = full
		}
	}
	if held, ok := e.detail.(*AlreadyAllocatedError); ok {
		held.HolderUID = e.Metadata["holder_uid"]
	}
}

// kindOf returns the sentinel of e's code (and, for FAILED_PRECONDITION, of its
// reason or, with none, of the RPC); nil for a code with none.
func kindOf(method string, e *Error) error {
	switch e.Code {
	case codes.InvalidArgument:
		return ErrInvalid
	case codes.AlreadyExists:
		if e.Reason == reasonCIDRExists {
			return ErrAlreadyExists
		}
		return ErrAlreadyAllocated
	case codes.ResourceExhausted:
		if e.Reason == reasonNoSpace {
			return ErrNoSpace
		}
		return ErrFull
	case codes.NotFound:
		return ErrNotFound
	case codes.FailedPrecondition:
		switch e.Reason {
		case reasonNotOwner:
			return ErrNotOwner
		case reasonStaleSnapshot:
			return ErrStaleSnapshot
		case reasonSnapshotRequired:
			return ErrSnapshotRequired
		case reasonCIDRTerminating:
			return ErrTerminating
		case "":
			// A server that names no reason: the RPC says which precondition it is.
			if k := failedPreconditionByMethod[method]; k != nil {
				return k
			}
		}
		// A reason this client does not know (NOT_REPAIR_LEADER, say) is not one of
		// the kinds above, whatever the RPC.
		return ErrFailedPrecondition
	case codes.OutOfRange:
		return ErrCompacted
	case codes.Unavailable:
		return ErrUnavailable
	case codes.Aborted:
		return ErrAborted
	case codes.Unimplemented:
		return ErrUnimplemented
	case codes.PermissionDenied:
		return ErrPermissionDenied
	case codes.Unauthenticated:
		return ErrUnauthenticated
	case codes.Canceled:
		return context.Canceled
	case codes.DeadlineExceeded:
		return context.DeadlineExceeded
	}
	return nil
}

// isPermanent reports whether retrying the same call later cannot help: the request
// or the client is wrong, not the server's state.
func isPermanent(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.Unimplemented, codes.PermissionDenied, codes.Unauthenticated:
		return true
	}
	return false
}

// OutcomeUnknown reports whether a failed call may have taken effect, or may yet:
// UNAVAILABLE, DEADLINE_EXCEEDED, CANCELED, UNKNOWN or INTERNAL (the call timed out or
// lost its connection after it was sent) unless the error says that nothing was
// applied; etcd out of space (ErrNoSpace: etcd may have applied the write before it
// found the quota exceeded); and any error of a call an earlier attempt of which had
// an unknown outcome. A caller retries such a call with the same request (every allocd write is
// idempotent) or reads the state back; any other error means nothing changed.
func OutcomeUnknown(err error) bool {
	if err == nil {
		return false
	}
	var e *Error
	if errors.As(err, &e) {
		switch {
		case e.MayHaveApplied:
			return true
		case e.NotApplied:
			return false
		case e.Reason == reasonNoSpace:
			// etcd applies a write, then finds the quota exceeded and answers NOSPACE.
			return true
		}
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unknown, codes.Internal:
		return true
	}
	return false
}

// notSentError is the error of a call that never reached allocd: gRPC made no stream
// for it (no connection). It keeps the call's status.
type notSentError struct{ err error }

func (e *notSentError) Error() string { return e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }

func (e *notSentError) GRPCStatus() *status.Status {
	if st, ok := status.FromError(e.err); ok {
		return st
	}
	return status.FromContextError(e.err)
}
