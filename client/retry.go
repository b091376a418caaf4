package client

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RetryPolicy says how a Client retries a call that failed with UNAVAILABLE.
//
// Only UNAVAILABLE is retried: it means the call did not reach a server that could
// serve it (no connection, allocd shutting down, etcd out of reach), or that its outcome
// is unknown. Retrying is safe even when a call did commit before the connection broke,
// because every allocd write is idempotent: Allocate by owner UID (a retry of the same
// request by the same owner returns the stored result, with replayed set, instead of
// allocating again), Release (freeing what is free is not an error), Transfer (an item
// the receiving owner holds already is left as it is: a retry after a committed transfer
// moves nothing and succeeds), Renew (it
// refreshes the same lease) and RemoveLease (removing an absent lease is OK).
// PushServiceSnapshot is retried as a whole stream with the same revision.
//
// Every other code is returned at once. Retries never outlive the caller's context:
// when it ends during a backoff, the last UNAVAILABLE error is returned.
type RetryPolicy struct {
	// MaxAttempts bounds the number of tries of one call, the first included. 0 means
	// DefaultRetryPolicy's; 1 disables retries; a negative value means no bound other
	// than the caller's context.
	MaxAttempts int
	// InitialBackoff is the wait before the first retry (0: the default). Each retry
	// doubles it, up to MaxBackoff, and the wait is jittered down by up to a half.
	InitialBackoff time.Duration
	// MaxBackoff caps the wait between tries (0: the default). A longer delay suggested
	// by the server's google.rpc.RetryInfo is honoured up to this cap.
	MaxBackoff time.Duration
}

// DefaultRetryPolicy is the policy of a Client made without WithRetry: 10 attempts,
// 100 ms doubling up to 5 s, which spans about 20 s of outage.
var DefaultRetryPolicy = RetryPolicy{MaxAttempts: 10, InitialBackoff: 100 * time.Millisecond,
	MaxBackoff: 5 * time.Second}

// withDefaults fills the zero fields of p from DefaultRetryPolicy.
func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultRetryPolicy.MaxAttempts
	}
	if p.InitialBackoff <= 0 {
		p.InitialBackoff = DefaultRetryPolicy.InitialBackoff
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = DefaultRetryPolicy.MaxBackoff
	}
	if p.MaxBackoff < p.InitialBackoff {
		p.MaxBackoff = p.InitialBackoff
	}
	return p
}

// backoff is the wait before retry number n (1 for the first retry) before jitter: the
// initial backoff doubled n-1 times, capped, and raised to the server's suggestion
// (itself capped).
func (p RetryPolicy) backoff(n int, suggested time.Duration) time.Duration {
	d := p.InitialBackoff
	for i := 1; i < n && d < p.MaxBackoff; i++ {
		d *= 2
	}
	d = max(d, suggested)
	return min(d, p.MaxBackoff)
}

// jitter returns a random duration in [d/2, d], so that clients that failed together
// do not retry together.
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// do calls f until it returns something other than UNAVAILABLE, the attempts run out,
// or ctx ends. It returns f's last error.
func (p RetryPolicy) do(ctx context.Context, f func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		err := f(ctx)
		if status.Code(err) != codes.Unavailable || attempt == p.MaxAttempts || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(jitter(p.backoff(attempt, suggestedDelay(err))))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// suggestedDelay is the google.rpc.RetryInfo delay of err, or 0.
func suggestedDelay(err error) time.Duration {
	var e *Error
	if errors.As(mapError("", err), &e) {
		return e.RetryDelay
	}
	return 0
}
