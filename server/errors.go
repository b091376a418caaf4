package server

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/allocd/allocd/allocator"
	"github.com/allocd/allocd/endpoints"
	"github.com/allocd/allocd/leader"
	"github.com/allocd/allocd/masterlease"
	"github.com/allocd/allocd/repair"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/allocd/allocd/internal/badrequest"
	"github.com/allocd/allocd/internal/etcd/call"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// errorDomain is the ErrorInfo domain of every allocd error.
const errorDomain = "allocd.io"

// ErrInvalid is the sentinel of InvalidError.
var ErrInvalid = badrequest.ErrInvalid

// InvalidError is a request that fails validation: one violation per bad field. It maps
// to INVALID_ARGUMENT with a google.rpc.BadRequest detail. It is the shape every allocd
// package returns (package badrequest).
type InvalidError = badrequest.Error

// violation is one bad field of a request.
type violation = badrequest.FieldViolation

// Invalid returns an InvalidError for one field.
func Invalid(field, description string) *InvalidError { return badrequest.New(field, description) }

// ErrUnavailable is returned while allocd cannot serve (etcd unreachable, state not
// loaded). It maps to UNAVAILABLE with a RetryInfo detail.
var ErrUnavailable = errors.New("unavailable")

// ErrNotReady is returned for calls that arrive before allocd serves (state not
// loaded yet): UNAVAILABLE, and certainly not applied.
var ErrNotReady = errors.New("not ready")

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
	if errors.Is(err, rpctypes.ErrNoSpace) {
		// Before NotApplied: etcd refused the write for lack of space, which is
		// certain too, but no retry helps until an operator frees space.
		return noSpace(err)
	}
	if call.NotApplied(err) {
		// Before the context's errors: a write that waited for a connection to etcd
		// until its deadline was still never sent.
		return unavailableWith("etcd unavailable, nothing applied: "+err.Error(),
			allocdv1.ErrorReason_ETCD_UNAVAILABLE,
			map[string]string{"outcome": outcomeNotApplied})
	}
	var inv *InvalidError
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, ErrNotReady):
		return unavailableWith(err.Error(), allocdv1.ErrorReason_UNAVAILABLE,
			map[string]string{"outcome": outcomeNotApplied})
	case errors.Is(err, ErrUnavailable):
		return unavailable(err.Error(), allocdv1.ErrorReason_UNAVAILABLE)
	case errors.Is(err, ErrForceReleaseRequired):
		return withDetails(codes.PermissionDenied, err.Error(),
			errorInfo(allocdv1.ErrorReason_FORCE_RELEASE_REQUIRED, nil))
	}
	// The domain packages first: a bad snapshot file wraps an invalid snapshot, but is
	// not the caller's bad input.
	if st := domainStatus(err); st != nil {
		return st
	}
	if errors.As(err, &inv) {
		return badRequest(err.Error(), inv.Violations...)
	}
	if errors.Is(err, rpctypes.ErrCompacted) {
		// A read at a revision etcd compacted meanwhile (a repair pass's list, say),
		// where no caller's token or revision is to blame: reading again works.
		return unavailable("etcd compacted the revision this read needed; retry: "+err.Error(),
			allocdv1.ErrorReason_ETCD_UNAVAILABLE)
	}
	if retryableEtcdError(err) {
		return unavailable("etcd unavailable: "+err.Error(), allocdv1.ErrorReason_ETCD_UNAVAILABLE)
	}
	if st, ok := status.FromError(err); ok {
		// A status from further down (a forwarded call, etcd): kept, but a retryable
		// one gets its RetryInfo.
		if st.Code() == codes.Unavailable {
			return unavailable(st.Message(), allocdv1.ErrorReason_UNAVAILABLE)
		}
		// INTERNAL from down here is gRPC's client transport, not a server's answer:
		// grpc-go turns a stream the peer reset (RST_STREAM, save REFUSED_STREAM,
		// CANCEL and the flow-control codes: its http2ErrConvTab) and a response it
		// could not read (no trailers, a frame or message it cannot decode) into
		// INTERNAL. etcd never answers INTERNAL itself (rpctypes has no such error),
		// and the etcd client retries it as a failure "in the middle of send"
		// (isHaltErr); a leader's answers are forwarded without this function. The
		// call's outcome is unknown and a retry may succeed: it is not allocd's
		// internal error.
		if st.Code() == codes.Internal {
			return unavailable(st.Message(), allocdv1.ErrorReason_UNAVAILABLE)
		}
		return st.Err()
	}
	return status.Error(codes.Internal, err.Error())
}

// outcomeNotApplied is the value of the ErrorInfo metadata "outcome" of an UNAVAILABLE
// error that certainly changed nothing: allocd was not ready, or etcd refused the
// write before proposing it (no member reached, no leader). Without it, the outcome
// of a write that failed UNAVAILABLE is unknown.
const outcomeNotApplied = "not_applied"

// noSpaceHelp is where etcd says how to free space and disarm the NOSPACE alarm.
const noSpaceHelp = "https://etcd.io/docs/v3.6/op-guide/maintenance/#space-quota"

// noSpace is etcd's refusal of a write while it is out of space (the NOSPACE alarm):
// RESOURCE_EXHAUSTED, as etcd answers it and as gRPC defines it ("the entire file
// system is out of space"); FAILED_PRECONDITION is the caller's own precondition in
// allocd, and UNAVAILABLE would make clients retry what cannot succeed until an
// operator acts. No QuotaFailure: clients read that as a full range. The outcome of
// the write is unknown, not refused: etcd applies a write, then finds the quota
// exceeded and answers NOSPACE for it (the write that raised the alarm); the writes
// after it are refused before they are proposed, and clients cannot tell the two
// apart (metadata outcome=unknown; the Go client's OutcomeUnknown says so).
func noSpace(err error) error {
	return withDetails(codes.ResourceExhausted,
		"etcd is out of space (NOSPACE alarm); reads still work, writes fail until an operator frees space "+
			"and disarms the alarm (etcdctl compact, etcdctl defrag, etcdctl alarm disarm); the write that "+
			"filled etcd was applied, so retry the same request once space is freed: "+err.Error(),
		errorInfo(allocdv1.ErrorReason_ETCD_NO_SPACE,
			map[string]string{"alarm": "NOSPACE", "outcome": "unknown"}),
		&errdetails.Help{Links: []*errdetails.Help_Link{{
			Description: "etcd maintenance: space quota (compact, defragment, disarm the NOSPACE alarm)",
			Url:         noSpaceHelp}}})
}

// unavailable is UNAVAILABLE with a RetryInfo detail.
func unavailable(msg string, reason allocdv1.ErrorReason) error {
	return unavailableWith(msg, reason, nil)
}

// unavailableWith is unavailable with ErrorInfo metadata.
func unavailableWith(msg string, reason allocdv1.ErrorReason, metadata map[string]string) error {
	return withDetails(codes.Unavailable, msg,
		&errdetails.RetryInfo{RetryDelay: durationpb.New(retryDelay)}, errorInfo(reason, metadata))
}

// badRequest is INVALID_ARGUMENT with a BadRequest detail naming every bad field.
func badRequest(msg string, vs ...violation) error {
	br := &errdetails.BadRequest{}
	for _, v := range vs {
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{
			Field: v.Field, Description: v.Description,
		})
	}
	return withDetails(codes.InvalidArgument, msg, br, errorInfo(allocdv1.ErrorReason_INVALID_ARGUMENT, nil))
}

// retryableEtcdError reports whether err comes from an etcd call that failed for a
// reason a retry can fix: no member reachable, no leader, leader changed, request timed
// out (its outcome unknown: Allocate is idempotent, so the caller retries the same
// request), too many requests. The etcd client turns etcd's own errors into
// rpctypes.EtcdError values, which are not gRPC statuses.
func retryableEtcdError(err error) bool {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		switch ee.Code() {
		case codes.Unavailable, codes.ResourceExhausted:
			return true
		}
		return false
	}
	if st, ok := status.FromError(err); ok {
		return st.Code() == codes.Unavailable
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
func errorInfo(reason allocdv1.ErrorReason, metadata map[string]string) *errdetails.ErrorInfo {
	return &errdetails.ErrorInfo{Reason: reason.String(), Domain: errorDomain, Metadata: metadata}
}

// domainStatus maps the sentinels and typed errors of the domain packages (allocator,
// masterlease, repair). It returns nil for an error it does not know.
func domainStatus(err error) error {
	// allocator: full, held by another owner, not in range, no range of the family,
	// not the owner, conflict, not found, invalid request, not ready.
	// repair: stale snapshot, not the leader, bad snapshot or snapshot file, no snapshot.
	// masterlease: bad ip/ttl_seconds, state not ready, CAS retries exhausted.
	// leader: not the leader of the controller called.
	// Each returns nil for an error that is not its package's.
	mappers := []func(error) error{allocatorStatus, leaderStatus, repairStatus, leaseStatus, endpointsStatus}
	for _, m := range mappers {
		if st := m(err); st != nil {
			return st
		}
	}
	return nil
}

// allocatorStatus maps package allocator's errors (see the design's error table).
func allocatorStatus(err error) error {
	var (
		notIn     *allocator.NotInRangeError
		allocated *allocator.AllocatedError
		notOwner  *allocator.NotOwnerError
		full      *allocator.FullError
		// ServiceCIDRs
		cidrExists   *allocator.CIDRExistsError
		cidrNotFound *allocator.CIDRNotFoundError
		terminating  *allocator.TerminatingError
	)
	msg := err.Error()
	switch {
	case errors.As(err, &notIn):
		field := "cluster_ips"
		if notIn.Item.Kind == allocator.KindNodePort {
			field = "node_ports"
		}
		return withDetails(codes.InvalidArgument, msg,
			&errdetails.BadRequest{
				FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: msg}}},
			errorInfo(allocdv1.ErrorReason_NOT_IN_RANGE,
				map[string]string{"item": notIn.Item.String(), "range": notIn.Range}))
	case errors.Is(err, allocator.ErrNoRange):
		return withDetails(codes.InvalidArgument, msg,
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
				{Field: "ip_families", Description: msg}}},
			errorInfo(allocdv1.ErrorReason_NO_RANGE, nil))
	case errors.As(err, &allocated):
		return withDetails(codes.AlreadyExists, msg,
			&errdetails.ResourceInfo{ResourceType: "allocd.v1.Allocation",
				ResourceName: allocated.Item.String(),
				Owner:        allocated.Holder.String(), Description: msg},
			errorInfo(allocdv1.ErrorReason_ALREADY_ALLOCATED,
				map[string]string{"item": allocated.Item.String(),
					"holder_namespace": allocated.Holder.Namespace, "holder_name": allocated.Holder.Name,
					"holder_uid": allocated.Holder.UID}))
	case errors.Is(err, allocator.ErrFull):
		subject := ""
		if errors.As(err, &full) {
			subject = full.Range
		}
		return withDetails(codes.ResourceExhausted, msg,
			&errdetails.QuotaFailure{
				Violations: []*errdetails.QuotaFailure_Violation{{Subject: subject, Description: msg}}},
			errorInfo(allocdv1.ErrorReason_RANGE_FULL, map[string]string{"range": subject}))
	case errors.As(err, &notOwner):
		return notOwnerStatus(msg, notOwner)
	case errors.Is(err, allocator.ErrConflict):
		return withDetails(codes.Aborted, msg, errorInfo(allocdv1.ErrorReason_CONFLICT, nil))
	case errors.Is(err, allocator.ErrNotFound):
		return withDetails(codes.NotFound, msg, errorInfo(allocdv1.ErrorReason_NOT_ALLOCATED, nil))
	case errors.Is(err, allocator.ErrNotRunning), errors.Is(err, allocator.ErrNotSynced):
		return unavailable(msg, allocdv1.ErrorReason_UNAVAILABLE)
	case errors.As(err, &cidrExists):
		return withDetails(codes.AlreadyExists, msg,
			errorInfo(allocdv1.ErrorReason_SERVICE_CIDR_EXISTS, map[string]string{"name": cidrExists.Name}))
	case errors.As(err, &cidrNotFound):
		return withDetails(codes.NotFound, msg, errorInfo(allocdv1.ErrorReason_SERVICE_CIDR_NOT_FOUND,
			map[string]string{"name": cidrNotFound.Name}))
	case errors.As(err, &terminating):
		return withDetails(codes.FailedPrecondition, msg,
			errorInfo(allocdv1.ErrorReason_SERVICE_CIDR_TERMINATING, map[string]string{
				"item": terminating.Item.String(), "cidrs": strings.Join(terminating.CIDRs, ", ")}),
			&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
				Type: "SERVICE_CIDR", Subject: terminating.Item.String(), Description: msg}}})
	case errors.Is(err, allocator.ErrRangesMismatch):
		return withDetails(codes.FailedPrecondition, msg,
			errorInfo(allocdv1.ErrorReason_RANGES_MISMATCH, nil))
	}
	return nil
}

// notOwnerStatus is FAILED_PRECONDITION for an item that is not the requester's (a
// Release without force, a Transfer): ErrorInfo names the holder (holder_uid and holder
// empty, free "true", when nobody holds it), the PreconditionFailure says what to do.
func notOwnerStatus(msg string, e *allocator.NotOwnerError) error {
	md := map[string]string{"item": e.Item.String(), "holder_uid": e.Holder.UID, "holder": e.Holder.String()}
	if e.Free {
		md["holder"], md["free"] = "", "true"
	}
	desc := msg
	if e.Hint != "" {
		desc += "; " + e.Hint
	}
	return withDetails(codes.FailedPrecondition, msg, errorInfo(allocdv1.ErrorReason_NOT_OWNER, md),
		&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
			Type: "OWNER", Subject: e.Item.String(), Description: desc}}})
}

// leaseStatus maps masterlease's errors: a bad ip or ttl_seconds is INVALID_ARGUMENT
// with BadRequest, a state not (yet) current UNAVAILABLE with RetryInfo, a key that
// kept changing under a Renew or RemoveLease ABORTED.
func leaseStatus(err error) error {
	switch {
	case errors.Is(err, masterlease.ErrNotReady):
		return unavailable(err.Error(), allocdv1.ErrorReason_MASTER_LEASES_NOT_READY)
	case errors.Is(err, masterlease.ErrConflict):
		return withDetails(codes.Aborted, err.Error(),
			errorInfo(allocdv1.ErrorReason_MASTER_LEASE_CONFLICT, nil))
	}
	return nil
}

// leaderStatus maps a call that only the leader serves, on a replica that does not
// lead and could not forward it: UNAVAILABLE naming the leader (a caller retries, or
// calls the leader), except a repair call whose leader is known and was not tried,
// which is FAILED_PRECONDITION naming it.
func leaderStatus(err error) error {
	var nl *leader.NotLeaderError
	if !errors.As(err, &nl) {
		return nil
	}
	md := map[string]string{"leader": nl.Leader}
	if nl.Controller != controllerRepair {
		return unavailableWith(err.Error(), allocdv1.ErrorReason_ENDPOINTS_LEADER_UNAVAILABLE, md)
	}
	if nl.Leader == "" || nl.Err != nil {
		return unavailableWith(err.Error(), allocdv1.ErrorReason_REPAIR_LEADER_UNAVAILABLE, md)
	}
	return withDetails(codes.FailedPrecondition, err.Error(),
		errorInfo(allocdv1.ErrorReason_NOT_REPAIR_LEADER, md))
}

// repairStatus maps the errors of package repair (the repair case of domainStatus).
func repairStatus(err error) error {
	var (
		stale *repair.StaleSnapshotError
		file  *repair.SnapshotFileError
	)
	switch {
	// A bad file wraps its cause (which may be an invalid or stale snapshot): it is
	// not the caller's bad input, so it is matched first.
	case errors.As(err, &file):
		return withDetails(codes.FailedPrecondition, err.Error(),
			errorInfo(allocdv1.ErrorReason_SNAPSHOT_FILE_INVALID, map[string]string{"path": file.Path}))
	case errors.As(err, &stale):
		return withDetails(codes.FailedPrecondition, err.Error(),
			&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
				Type: "STALE_SNAPSHOT", Subject: "snapshot.revision",
				Description: "the revision must not be older than the last accepted revision " +
					strconv.FormatInt(stale.Accepted, 10),
			}}},
			errorInfo(allocdv1.ErrorReason_STALE_SNAPSHOT, map[string]string{
				"revision":          strconv.FormatInt(stale.Revision, 10),
				"accepted_revision": strconv.FormatInt(stale.Accepted, 10),
			}))
	case errors.Is(err, repair.ErrNoSnapshot):
		return withDetails(codes.FailedPrecondition, err.Error(),
			errorInfo(allocdv1.ErrorReason_NO_SNAPSHOT, nil))
	}
	return nil
}

// endpointsStatus maps the errors of package endpoints: a malformed feed or request is
// INVALID_ARGUMENT naming the fields; an event before its kind's snapshot and a stale
// snapshot FAILED_PRECONDITION (the feeder pushes snapshots again); a compacted watch
// revision OUT_OF_RANGE (list again, as Kubernetes' 410 Gone); no leader UNAVAILABLE.
func endpointsStatus(err error) error {
	var (
		req   *endpoints.SnapshotRequiredError
		stale *endpoints.StaleSnapshotError
		comp  *endpoints.CompactedError
	)
	msg := err.Error()
	switch {
	case errors.Is(err, endpoints.ErrNotFound):
		return withDetails(codes.NotFound, msg, errorInfo(allocdv1.ErrorReason_ENDPOINTS_NOT_FOUND, nil))
	case errors.As(err, &req):
		return withDetails(codes.FailedPrecondition, msg,
			&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
				Type: "SNAPSHOT_REQUIRED", Subject: string(req.Kind),
				Description: "push a " + string(req.Kind) + " snapshot first"}}},
			errorInfo(allocdv1.ErrorReason_SNAPSHOT_REQUIRED, map[string]string{"kind": string(req.Kind)}))
	case errors.As(err, &stale):
		return withDetails(codes.FailedPrecondition, msg,
			errorInfo(allocdv1.ErrorReason_STALE_SNAPSHOT, map[string]string{"kind": string(stale.Kind),
				"revision":         strconv.FormatInt(stale.Revision, 10),
				"applied_revision": strconv.FormatInt(stale.Applied, 10)}))
	case errors.As(err, &comp):
		return withDetails(codes.OutOfRange, msg,
			errorInfo(allocdv1.ErrorReason_REVISION_COMPACTED,
				map[string]string{"revision": strconv.FormatInt(comp.Revision, 10),
					"compacted_revision": strconv.FormatInt(comp.Compacted, 10)}))
	case errors.Is(err, endpoints.ErrNotReady):
		return unavailable(msg, allocdv1.ErrorReason_UNAVAILABLE)
	}
	return nil
}
