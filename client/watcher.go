package client

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// EndpointsWatcher follows the Endpoints of the kubernetes Service. It keeps one
// WatchEndpoints stream open, opens a new one with backoff when the stream breaks
// (allocd restarted, network cut), and delivers a state only when it differs from the
// last one delivered: addresses and ports are compared, not revisions, so a reconnect,
// which starts with the current state, does not deliver the same Endpoints twice.
type EndpointsWatcher struct {
	c              *Client
	initialBackoff time.Duration
	maxBackoff     time.Duration
	onError        func(error)
}

// WatcherOption configures NewEndpointsWatcher.
type WatcherOption func(*EndpointsWatcher)

// WithWatchErrors sets the function told of every broken stream before the watcher
// reconnects. It is called from Watch's goroutine.
func WithWatchErrors(f func(error)) WatcherOption {
	return func(w *EndpointsWatcher) { w.onError = f }
}

// WithWatchBackoff sets the wait before reconnecting: initial after the first failure,
// doubling (with jitter) up to max while the stream keeps failing. Defaults: 100 ms,
// 5 s.
func WithWatchBackoff(initial, max time.Duration) WatcherOption {
	return func(w *EndpointsWatcher) { w.initialBackoff, w.maxBackoff = initial, max }
}

// NewEndpointsWatcher returns a watcher of the Endpoints served by c's allocd.
func NewEndpointsWatcher(c *Client, opts ...WatcherOption) *EndpointsWatcher {
	w := &EndpointsWatcher{
		c:              c,
		initialBackoff: DefaultRetryPolicy.InitialBackoff,
		maxBackoff:     DefaultRetryPolicy.MaxBackoff,
		onError:        func(error) {},
	}
	for _, opt := range opts {
		opt(w)
	}
	return w
}

// Watch calls fn with the current Endpoints and then with every new state, in order,
// from the calling goroutine, until ctx ends; then it returns nil. fn never receives the
// same state twice in a row, across reconnects too. Watch returns early only with an
// error no reconnect can fix (ErrInvalid, ErrUnimplemented); any other failure is
// reported to the WithWatchErrors function and followed by a reconnect.
func (w *EndpointsWatcher) Watch(ctx context.Context, fn func(*allocdv1.Endpoints)) error {
	p := RetryPolicy{InitialBackoff: w.initialBackoff, MaxBackoff: w.maxBackoff}.withDefaults()
	var last *allocdv1.Endpoints
	failures := 0
	for {
		err := w.c.WatchEndpoints(ctx, func(ep *allocdv1.Endpoints) error {
			failures = 0
			if last == nil || !sameEndpoints(last, ep) {
				last = ep
				fn(ep)
			}
			return nil
		})
		if ctx.Err() != nil {
			return nil
		}
		if isPermanent(err) {
			return fmt.Errorf("client: watch endpoints: %w", err)
		}
		w.onError(fmt.Errorf("client: watch endpoints: %w", err))
		failures++
		t := time.NewTimer(jitter(p.backoff(failures, 0)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// sameEndpoints reports whether a and b are the same state: the same object and the
// same subsets (addresses and ports), whatever their revisions.
func sameEndpoints(a, b *allocdv1.Endpoints) bool {
	return a.GetNamespace() == b.GetNamespace() && a.GetName() == b.GetName() &&
		slices.EqualFunc(a.GetSubsets(), b.GetSubsets(), func(x, y *allocdv1.EndpointSubset) bool {
			return proto.Equal(x, y)
		})
}
