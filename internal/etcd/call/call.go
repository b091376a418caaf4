package call

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/raft/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// NotSentInterceptor tells Write, through the trace Write puts in the context, whether
// each try of a call reached a member (gRPC made a stream for it: grpc.Peer is set) and
// whether a try that reached one failed in a way that leaves its outcome open. The
// etcd client's own retries run it once per try, and it keeps what it learns even when
// the etcd client turns the error into the context's. Add it to the etcd client's
// clientv3.Config.DialOptions. Calls made without Write are not traced: their errors
// claim nothing.
func NotSentInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		t, ok := ctx.Value(tracesKey{}).(*trace)
		if !ok {
			return invoker(ctx, method, req, reply, cc, opts...) // not a Write: nothing to record
		}
		var p peer.Peer
		err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Peer(&p))...)
		t.called.Store(true)
		if err == nil || p.Addr != nil {
			t.sent.Store(true)
		}
		if err != nil && p.Addr != nil && !refused(err) {
			t.open.Store(true)
		}
		return err
	}
}

// trace is what NotSentInterceptor saw of the tries of one call that Write made.
type trace struct {
	called atomic.Bool // the interceptor ran: it is installed
	sent   atomic.Bool // some try reached a member
	open   atomic.Bool // some try reached a member and its outcome is unknown
}

type tracesKey struct{}

// notSent reports whether the call traced by t certainly reached no member.
func (t *trace) notSent() bool { return t.called.Load() && !t.sent.Load() }

// Unapplied marks err, the failure of an etcd call that a request made before it
// wrote anything (a read before its write, or a read-back after a transaction whose
// compares failed): whatever err is, the request changed nothing. Nil stays nil.
func Unapplied(err error) error {
	if err == nil {
		return nil
	}
	return &unappliedError{err: err}
}

// unappliedError is an error that Unapplied or Write marked: nothing was applied.
type unappliedError struct{ err error }

func (e *unappliedError) Error() string { return e.err.Error() }
func (e *unappliedError) Unwrap() error { return e.err }

// MayHaveApplied marks err, the failure of a call that wrote something, or may have,
// before it failed: NotApplied is false for it, whatever err says.
func MayHaveApplied(err error) error {
	if err == nil {
		return nil
	}
	return &openError{err: err}
}

type openError struct{ err error }

func (e *openError) Error() string { return e.err.Error() }
func (e *openError) Unwrap() error { return e.err }

// NotApplied reports whether err says that an etcd write changed nothing and never
// will (see the package comment): Write found that no try reached a member, or a
// member refused it before proposing it, or Unapplied marked it.
func NotApplied(err error) bool {
	if err == nil {
		return false
	}
	if oe := (*openError)(nil); errors.As(err, &oe) {
		return false
	}
	if ua := (*unappliedError)(nil); errors.As(err, &ua) {
		return true
	}
	return refused(err)
}

// refused reports whether a member refused a request before proposing it.
func refused(err error) bool {
	if errors.Is(err, rpctypes.ErrNoLeader) || errors.Is(err, rpctypes.ErrTooManyRequests) {
		return true
	}
	// As the interceptor sees it: a gRPC status, not yet the etcd client's error.
	if ee := rpctypes.Error(err); ee == rpctypes.ErrNoLeader || ee == rpctypes.ErrTooManyRequests {
		return true
	}
	return errors.Is(err, errProposalDropped)
}

// errProposalDropped is raft's ErrProposalDropped as an etcd member answers it. etcd
// sends the errors it knows as rpctypes' statuses and any other as an UNKNOWN status
// with the error's text (togRPCError); the etcd client's rpctypes.Error has no error
// for it. A gRPC status error is errors.Is-equal to another with the same code,
// message and details, so this matches the member's answer as it arrives, wrapped or
// not.
var errProposalDropped = status.Error(codes.Unknown, raft.ErrProposalDropped.Error())

// retryWait is the first wait between tries of a write that was not applied; it
// doubles up to maxRetryWait. An election takes about one election timeout.
const (
	retryWait    = 20 * time.Millisecond
	maxRetryWait = 200 * time.Millisecond
)

// Write runs write with a context that asks for a member with a leader, each try
// bounded by attempt, and tries again while it fails with an error that NotApplied
// recognises, until budget has passed since the first try. It returns the last error.
func Write(ctx context.Context, attempt, budget time.Duration, write func(context.Context) error) error {
	deadline := time.Now().Add(budget)
	wait := retryWait
	for {
		t := &trace{}
		actx, cancel := context.WithTimeout(context.WithValue(clientv3.WithRequireLeader(ctx), tracesKey{},
			t), attempt)
		err := write(actx)
		cancel()
		switch {
		case err == nil:
		case t.open.Load():
			// One of the etcd client's own tries reached a member and failed in a way
			// that leaves it open, whatever the last try answered.
			err = &openError{err: err}
		case t.notSent():
			// No try reached a member (one that timed out waiting for a connection
			// answers the context's error, which says nothing of where it went).
			err = &unappliedError{err: err}
		}
		if err == nil || !NotApplied(err) || ctx.Err() != nil || time.Until(deadline) < wait {
			return err
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return err
		case <-timer.C:
		}
		wait = min(2*wait, maxRetryWait)
	}
}

// Read runs read up to tries times, each try bounded by attempt, while it fails in a
// way that a stalled member or an election explains (Transient): the etcd client sends
// the next try to the next member.
func Read(ctx context.Context, attempt time.Duration, tries int, read func(context.Context) error) error {
	var err error
	for range tries {
		actx, cancel := context.WithTimeout(ctx, attempt)
		err = read(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !Transient(err) {
			break
		}
	}
	return err
}

// Transient reports whether a failed etcd call failed for a passing reason: a timeout,
// a lost connection, a leader that changed. A write that failed so may have taken
// effect, or may yet, unless NotApplied. Errors that say the request was refused
// (invalid, too large, no space, not permitted) are not Transient.
func Transient(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	code := status.Code(err)
	var ee rpctypes.EtcdError // what the etcd client makes of the server's errors
	if errors.As(err, &ee) {
		code = ee.Code()
	}
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Unknown, codes.Aborted, codes.Internal:
		return true
	}
	return false
}
