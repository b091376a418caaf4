package admit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// The webhook's view of allocd's health, and the fast answer while allocd is down.
//
// WatchAllocd checks allocd every interval. Once a check fails (allocd refuses the
// connection, or answers NOT_SERVING), allocd is known down: an admission that needs
// allocd does not wait for its calls to give up (a create waited about 4 s for
// them, until a second before kube-apiserver's deadline), it checks allocd once more
// itself (joining a check in flight, if any) and is answered HTTP 500 at once when
// that check fails too: the failure policy decides. A check that passes, the
// admission's own or WatchAllocd's (every downInterval while allocd is down), makes
// allocd known up again; so the webhook never answers that allocd is unreachable on
// an older check than the one the admission made or joined. A check cut short by its
// deadline (allocd slow, or a network that drops packets) changes nothing: allocd is
// not known down for that, and the admissions' own calls are bounded by their
// deadline as before.

// ErrAllocdDown is an admission not asked of allocd: its health check failed, and
// failed again when the admission came.
var ErrAllocdDown = fmt.Errorf("%w: unreachable (not asked)", ErrAllocd)

// downInterval is how often WatchAllocd checks allocd while allocd is known down.
const downInterval = 250 * time.Millisecond

// probeTimeout bounds one check of allocd.
const probeTimeout = 2 * time.Second

// reconnectWait bounds how long a check of allocd waits for conn to connect again when
// its last connection attempt failed.
const reconnectWait = 200 * time.Millisecond

// HealthProbe returns a check of allocd over conn: one call of grpc.health.v1's Check
// (no retries). When conn's last connection attempt failed (TRANSIENT_FAILURE: a call
// fails at once with that attempt's error, and conn waits out a backoff of up to 5 s
// before the next), the check has conn try again at once and gives it reconnectWait to
// connect, so that a check made once allocd is back reaches it. It returns nil when
// allocd answers SERVING.
func HealthProbe(conn *grpc.ClientConn) func(context.Context) error {
	hc := healthpb.NewHealthClient(conn)
	return func(ctx context.Context) error {
		if conn.GetState() == connectivity.TransientFailure {
			conn.ResetConnectBackoff()
			wctx, cancel := context.WithTimeout(ctx, reconnectWait)
			conn.WaitForStateChange(wctx, connectivity.TransientFailure)
			cancel()
		}
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		if st := resp.GetStatus(); st != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("allocd's health is %s", st)
		}
		return nil
	}
}

// health is what the checks of allocd last saw, and the check in flight.
type health struct {
	last  atomic.Pointer[allocdHealth] // nil: not checked yet
	probe atomic.Pointer[func(context.Context) error]
	kick  chan struct{} // WatchAllocd checks at once

	mu       sync.Mutex
	inFlight *probeCall
	probes   sync.WaitGroup // the checks in flight; WatchAllocd waits for them
}

// allocdHealth is one outcome of the checks of allocd.
type allocdHealth struct {
	err   error // nil: serving
	since time.Time
}

// probeCall is one check of allocd in flight: err is set before done is closed.
type probeCall struct {
	done chan struct{}
	err  error
}

// WatchAllocd checks allocd with probe (HealthProbe, or any check that returns nil
// when allocd serves) now, then every interval while allocd answers and every
// downInterval while it does not, at once when an admission's call of allocd failed,
// until ctx ends. What it saw makes the webhook answer at once while allocd is down
// (ErrAllocdDown), names allocd's last health check in the webhook's errors, and sets
// the allocd_webhook_allocd_reachable gauge.
func (w *Webhook) WatchAllocd(ctx context.Context, probe func(context.Context) error,
	interval time.Duration) {
	defer w.health.probes.Wait()
	w.health.probe.Store(&probe)
	defer w.health.probe.Store(nil)
	for {
		next := interval
		if err := w.checkAllocd(ctx); err != nil {
			next = min(interval, downInterval)
		}
		t := w.clock.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.Chan():
		case <-w.health.kick:
			t.Stop()
		}
	}
}

// kickAllocd makes WatchAllocd check allocd at once (an admission's call failed).
func (w *Webhook) kickAllocd() {
	select {
	case w.health.kick <- struct{}{}:
	default:
	}
}

// allocdDown returns ErrAllocdDown when allocd is known down and a check made now (or
// joined in flight) fails too; nil when allocd is not known down, or answers now.
func (w *Webhook) allocdDown(ctx context.Context) error {
	if h := w.health.last.Load(); h == nil || h.err == nil {
		return nil
	}
	if err := w.checkAllocd(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrAllocdDown, err)
	}
	return nil
}

// checkAllocd checks allocd (or waits for the check in flight, up to ctx's end) and
// returns what allocd is known to be after it: nil when up, the failed check's error
// when down (a check cut short by its deadline keeps what was known).
func (w *Webhook) checkAllocd(ctx context.Context) error {
	p := w.health.probe.Load()
	if p == nil {
		return nil
	}
	w.health.mu.Lock()
	call := w.health.inFlight
	if call == nil {
		call = &probeCall{done: make(chan struct{})}
		w.health.inFlight = call
		w.health.probes.Add(1)
		// Not cut short by ctx (others may wait for it), only by probeTimeout.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeTimeout)
		go func() {
			defer w.health.probes.Done()
			call.err = (*p)(pctx)
			cancel()
			w.noteAllocd(call.err)
			w.health.mu.Lock()
			w.health.inFlight = nil
			w.health.mu.Unlock()
			close(call.done)
		}()
	}
	w.health.mu.Unlock()
	select {
	case <-call.done:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	if h := w.health.last.Load(); h != nil {
		return h.err
	}
	return nil
}

// noteAllocd records the outcome of a check: allocd up (err nil) or down; a check cut
// short by its deadline changes nothing.
func (w *Webhook) noteAllocd(err error) {
	if err != nil && (errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded) {
		return
	}
	prev := w.health.last.Load()
	switch {
	case prev == nil || (prev.err == nil) != (err == nil):
		w.log.Info("allocd reachability changed", "reachable", err == nil, "error", err)
		w.health.last.Store(&allocdHealth{err: err, since: time.Now()})
	case err != nil:
		w.health.last.Store(&allocdHealth{err: err, since: prev.since})
	}
	if err == nil {
		w.m.allocdUp.Set(1)
	} else {
		w.m.allocdUp.Set(0)
	}
}

// allocdState says what the last health check of allocd answered, for an error.
func (w *Webhook) allocdState() string {
	h := w.health.last.Load()
	switch {
	case h == nil:
		return "allocd's health not checked yet"
	case h.err == nil:
		return "allocd's health check passes"
	}
	return fmt.Sprintf("allocd's health check failing since %s: %v", h.since.UTC().Format(time.RFC3339),
		h.err)
}
