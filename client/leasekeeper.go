package client

import (
	"context"
	"fmt"
	"time"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// defaultLeaseTTL is the TTL assumed for the renew interval when the keeper asks for
// the server's default TTL and has not heard it yet (kube-apiserver's
// DefaultEndpointReconcilerTTL, allocd's default --master-lease-ttl).
const defaultLeaseTTL = 15 * time.Second

// LeaseKeeper keeps the master lease of one API server alive, as kube-apiserver's lease
// endpoint reconciler does: it renews the lease every TTL/3 and, when told to stop,
// removes it so that the API server leaves the kubernetes Endpoints at once instead of
// after its TTL.
//
// Run does the work in the caller's goroutine; the caller owns it and waits for it
// (in an errgroup, say). A LeaseKeeper must not be Run twice at once.
type LeaseKeeper struct {
	c        *Client
	ip       string
	ttl      time.Duration
	interval time.Duration // fixed by WithRenewInterval; 0 means TTL/3
	onError  func(error)
	onRenew  func(*allocdv1.Lease)
}

// KeeperOption configures NewLeaseKeeper.
type KeeperOption func(*LeaseKeeper)

// WithRenewErrors sets the function told of every failed renewal (and of a failed
// removal at the end). It is called from Run's goroutine and must not block long: the
// next renewal waits for it.
func WithRenewErrors(f func(error)) KeeperOption {
	return func(k *LeaseKeeper) { k.onError = f }
}

// WithRenewed sets the function told of every successful renewal, with the lease as
// it stands (its lease id and revision can serve as a fencing token). It is called from
// Run's goroutine.
func WithRenewed(f func(*allocdv1.Lease)) KeeperOption {
	return func(k *LeaseKeeper) { k.onRenew = f }
}

// WithRenewInterval renews every d instead of every TTL/3.
func WithRenewInterval(d time.Duration) KeeperOption {
	return func(k *LeaseKeeper) { k.interval = d }
}

// NewLeaseKeeper returns a keeper of the lease of ip (the API server's address) with
// the given TTL, rounded up to whole seconds; a ttl of 0 asks for the server's
// --master-lease-ttl.
func NewLeaseKeeper(c *Client, ip string, ttl time.Duration, opts ...KeeperOption) *LeaseKeeper {
	k := &LeaseKeeper{c: c, ip: ip, ttl: ttl, onError: func(error) {}, onRenew: func(*allocdv1.Lease) {}}
	for _, opt := range opts {
		opt(k)
	}
	return k
}

// renewInterval is the current interval between renewals: the fixed one, or a third of
// the TTL (the granted one once known).
func (k *LeaseKeeper) renewInterval(granted time.Duration) time.Duration {
	switch {
	case k.interval > 0:
		return k.interval
	case granted > 0:
		return granted / 3
	case k.ttl > 0:
		return k.ttl / 3
	}
	return defaultLeaseTTL / 3
}

// Run renews the lease at once and then every renew interval until ctx ends; then it
// removes the lease, giving the removal twice the renew interval (kube-apiserver's
// Stop bound), and returns.
//
// A failed renewal is reported to the WithRenewErrors function and Run carries on: the
// next one may succeed before the TTL runs out. Each renewal (with its retries) is
// bounded by the renew interval, so that a slow one does not delay the next. Run
// returns early only for an error that no retry can fix (ErrInvalid: a malformed IP or
// TTL; ErrUnimplemented). Otherwise it returns the error of the final removal, or nil
// when the lease was removed (or was already gone).
func (k *LeaseKeeper) Run(ctx context.Context) error {
	ttlSeconds := int64((k.ttl + time.Second - 1) / time.Second)
	var granted time.Duration
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return k.remove(ctx, k.renewInterval(granted))
		case <-t.C:
		}
		interval, start := k.renewInterval(granted), time.Now()
		lease, err := k.renew(ctx, ttlSeconds, interval)
		switch {
		case err == nil:
			if lease.GetTtlSeconds() > 0 {
				granted = time.Duration(lease.GetTtlSeconds()) * time.Second
			}
			k.onRenew(lease)
		case ctx.Err() != nil:
			// Stopped during the renewal: not a failure, the removal follows.
		case isPermanent(err):
			return fmt.Errorf("client: lease of %s: %w", k.ip, err)
		default:
			k.onError(fmt.Errorf("client: renew lease of %s: %w", k.ip, err))
		}
		// The next renewal is one interval after this one started, so that the
		// renewals keep their pace whatever each one took.
		t.Reset(max(0, start.Add(k.renewInterval(granted)).Sub(time.Now())))
	}
}

// renew makes one renewal, bounded by interval.
func (k *LeaseKeeper) renew(ctx context.Context, ttlSeconds int64,
	interval time.Duration) (*allocdv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, interval)
	defer cancel()
	return k.c.Renew(ctx, &allocdv1.RenewRequest{Ip: k.ip, TtlSeconds: ttlSeconds})
}

// remove deletes the lease once ctx has ended, within 2 x interval.
func (k *LeaseKeeper) remove(ctx context.Context, interval time.Duration) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*interval)
	defer cancel()
	// Shutdown: this API server is going away on purpose, so allocd may publish empty
	// Endpoints if it was the last one (kubernetes #115804).
	if _, err := k.c.RemoveLease(ctx, &allocdv1.RemoveLeaseRequest{Ip: k.ip, Shutdown: true}); err != nil {
		err = fmt.Errorf("client: remove lease of %s: %w", k.ip, err)
		k.onError(err)
		return err
	}
	return nil
}
