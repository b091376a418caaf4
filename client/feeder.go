package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// Lister gives a Feeder the full state of the caller's stores, for a snapshot: a
// shim implements it over its informers' caches (every Service, every Pod, every
// Node, and the store revision they are at, e.g. the highest resourceVersion seen).
// The EndpointSlice controller needs the Nodes (their zones, and a Pod whose Node is
// unknown is left out of the slices); with it turned off (--controllers), ListNodes
// may return none. Every revision must be positive (a snapshot of revision 0 is
// refused).
type Lister interface {
	ListServices() (services []*allocdv1.Service, revision int64, err error)
	ListPods() (pods []*allocdv1.Pod, revision int64, err error)
	ListNodes() (nodes []*allocdv1.Node, revision int64, err error)
}

// Feeder feeds allocd's Endpoints and EndpointSlice controllers from a shim's
// informer callbacks: it pushes a snapshot of every kind, then the events in batches; when the leader needs
// snapshots (a new term of leadership, ErrSnapshotRequired), when a push fails
// otherwise, or when its queue overflows, it pushes snapshots again and goes on. It
// never drops an event silently: events queued before a snapshot are covered by it,
// and an event allocd refuses as malformed is dropped alone (reported to the
// WithFeedErrors function), the others of its batch pushed.
//
// The Upsert and Delete methods are safe to call from any goroutine (the informers');
// Run does the pushing in the caller's goroutine.
type Feeder struct {
	c         *Client
	l         Lister
	flush     time.Duration
	heartbeat time.Duration
	maxQueue  int
	maxBatch  int
	timeout   time.Duration
	onError   func(error)
	onPushed  func(events int, revision int64, took time.Duration)

	mu     sync.Mutex
	queue  []*allocdv1.Event
	resnap bool
	wake   chan struct{}
}

// FeederOption configures NewFeeder.
type FeederOption func(*Feeder)

// WithFeedErrors sets the function told of every failed push (before the Feeder
// retries or snapshots again). It is called from Run's goroutine.
func WithFeedErrors(f func(error)) FeederOption { return func(fd *Feeder) { fd.onError = f } }

// WithPushed sets a function told of every push of events that allocd took: how many
// events, the highest revision among them, and how long the call took. It is called
// from Run's goroutine.
func WithPushed(f func(events int, revision int64, took time.Duration)) FeederOption {
	return func(fd *Feeder) { fd.onPushed = f }
}

// WithFlushInterval sets how long events wait to share a push after the first of them
// comes (default 0: pushed at once; the events that come while a push is in flight
// share the next one).
func WithFlushInterval(d time.Duration) FeederOption { return func(fd *Feeder) { fd.flush = d } }

// WithHeartbeat sets how often an idle Feeder asks the leader whether it needs
// snapshots (default 1 s).
func WithHeartbeat(d time.Duration) FeederOption { return func(fd *Feeder) { fd.heartbeat = d } }

// WithPushTimeout bounds each push (a snapshot, a batch of events, a heartbeat),
// default 30 s: a call that hangs (a replica cut off from etcd, a broken connection)
// fails, and the Feeder snapshots again instead of waiting forever.
func WithPushTimeout(d time.Duration) FeederOption { return func(fd *Feeder) { fd.timeout = d } }

// WithMaxQueue sets how many events may wait before the Feeder gives them up for a new
// snapshot (default 100,000).
func WithMaxQueue(n int) FeederOption { return func(fd *Feeder) { fd.maxQueue = n } }

// NewFeeder returns a Feeder pushing to c, taking snapshots from l.
func NewFeeder(c *Client, l Lister, opts ...FeederOption) *Feeder {
	f := &Feeder{c: c, l: l, heartbeat: time.Second, maxQueue: 100000,
		timeout:  30 * time.Second,
		maxBatch: 1000, onError: func(error) {}, onPushed: func(int, int64, time.Duration) {}, resnap: true,
		wake: make(chan struct{}, 1)}
	for _, o := range opts {
		o(f)
	}
	return f
}

// UpsertService queues the add or update of a Service, at the store revision rev.
func (f *Feeder) UpsertService(svc *allocdv1.Service, rev int64) {
	f.add(&allocdv1.Event{Type: allocdv1.EventType_EVENT_TYPE_UPSERT, Revision: rev,
		Object: &allocdv1.Event_Service{Service: svc}})
}

// DeleteService queues the delete of a Service, at the store revision rev.
func (f *Feeder) DeleteService(namespace, name string, rev int64) {
	f.add(&allocdv1.Event{Type: allocdv1.EventType_EVENT_TYPE_DELETE, Revision: rev,
		Object: &allocdv1.Event_Service{Service: &allocdv1.Service{Namespace: namespace, Name: name}}})
}

// UpsertPod queues the add or update of a Pod, at the store revision rev.
func (f *Feeder) UpsertPod(pod *allocdv1.Pod, rev int64) {
	f.add(&allocdv1.Event{Type: allocdv1.EventType_EVENT_TYPE_UPSERT, Revision: rev,
		Object: &allocdv1.Event_Pod{Pod: pod}})
}

// DeletePod queues the delete of a Pod, at the store revision rev.
func (f *Feeder) DeletePod(namespace, name string, rev int64) {
	f.add(&allocdv1.Event{Type: allocdv1.EventType_EVENT_TYPE_DELETE, Revision: rev,
		Object: &allocdv1.Event_Pod{Pod: &allocdv1.Pod{Namespace: namespace, Name: name}}})
}

// UpsertNode queues the add or update of a Node, at the store revision rev.
func (f *Feeder) UpsertNode(node *allocdv1.Node, rev int64) {
	f.add(&allocdv1.Event{Type: allocdv1.EventType_EVENT_TYPE_UPSERT, Revision: rev,
		Object: &allocdv1.Event_Node{Node: node}})
}

// DeleteNode queues the delete of a Node, at the store revision rev.
func (f *Feeder) DeleteNode(name string, rev int64) {
	f.add(&allocdv1.Event{Type: allocdv1.EventType_EVENT_TYPE_DELETE, Revision: rev,
		Object: &allocdv1.Event_Node{Node: &allocdv1.Node{Name: name}}})
}

// Resync makes Run push snapshots of every kind again (as an informer's relist).
func (f *Feeder) Resync() {
	f.mu.Lock()
	f.resnap = true
	f.mu.Unlock()
	f.signal()
}

func (f *Feeder) add(ev *allocdv1.Event) {
	f.mu.Lock()
	if len(f.queue) >= f.maxQueue {
		// The events would wait too long: a snapshot taken after them covers them all.
		f.queue, f.resnap = nil, true
	} else {
		f.queue = append(f.queue, ev)
	}
	f.mu.Unlock()
	f.signal()
}

func (f *Feeder) signal() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// Run pushes until ctx ends, and then returns ctx's error. Every failure is retried
// (with a backoff up to 5 s), after snapshots when the failure may have lost events.
func (f *Feeder) Run(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	idle := time.NewTimer(f.heartbeat)
	defer idle.Stop()
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		err := f.step(ctx, idle)
		if err == nil {
			backoff = 100 * time.Millisecond
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		f.onError(err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// step pushes snapshots when needed, else waits for events (or the heartbeat) and
// pushes them.
func (f *Feeder) step(ctx context.Context, idle *time.Timer) error {
	f.mu.Lock()
	resnap := f.resnap
	if resnap {
		// Cleared before listing: an event queued from here on is newer than the
		// list, or covered by it (and then ignored by the leader as not newer).
		f.queue, f.resnap = nil, false
	}
	f.mu.Unlock()
	if resnap {
		pctx, cancel := context.WithTimeout(ctx, f.timeout)
		defer cancel()
		if err := f.pushSnapshots(pctx); err != nil {
			f.Resync()
			return err
		}
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-f.wake:
		if f.flush > 0 {
			time.Sleep(f.flush)
		}
	case <-idle.C:
	}
	idle.Reset(f.heartbeat)
	f.mu.Lock()
	n := min(len(f.queue), f.maxBatch)
	batch := f.queue[:n:n]
	f.queue = f.queue[n:]
	if len(f.queue) > 0 {
		f.signal()
	}
	f.mu.Unlock()
	var msgs []*allocdv1.PushEventsRequest
	rev := int64(0)
	if len(batch) > 0 {
		for _, ev := range batch {
			rev = max(rev, ev.GetRevision())
		}
		msgs = append(msgs, &allocdv1.PushEventsRequest{Revision: rev, Events: batch})
	}
	pctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	start := time.Now()
	_, err := f.c.PushEvents(pctx, msgs...)
	if err == nil && len(batch) > 0 {
		f.onPushed(len(batch), rev, time.Since(start))
	}
	if err != nil {
		if errors.Is(err, ErrInvalid) && len(batch) > 1 {
			// One malformed event refuses its whole message (nothing applied): the
			// others are pushed without it.
			return f.pushValid(pctx, batch)
		}
		if !errors.Is(err, ErrInvalid) {
			// The batch may not have been applied, or the leader lost what came
			// before: snapshots cover both.
			f.Resync()
		}
		return fmt.Errorf("client: push events: %w", err)
	}
	return nil
}

// pushValid pushes evs, refused whole as invalid, again in halves, in order, down to
// the events refused alone, which are dropped: it returns an error naming them (told to
// WithFeedErrors' function), or the first other failure (after asking for snapshots).
func (f *Feeder) pushValid(ctx context.Context, evs []*allocdv1.Event) error {
	var dropped []error
	var push func(evs []*allocdv1.Event) error
	push = func(evs []*allocdv1.Event) error {
		rev := int64(0)
		for _, ev := range evs {
			rev = max(rev, ev.GetRevision())
		}
		_, err := f.c.PushEvents(ctx, &allocdv1.PushEventsRequest{Revision: rev, Events: evs})
		switch {
		case err == nil:
			return nil
		case !errors.Is(err, ErrInvalid):
			f.Resync()
			return fmt.Errorf("client: push events: %w", err)
		case len(evs) == 1:
			dropped = append(dropped, fmt.Errorf("client: event at revision %d dropped: %w", rev, err))
			return nil
		}
		if err := push(evs[:len(evs)/2]); err != nil {
			return err
		}
		return push(evs[len(evs)/2:])
	}
	mid := len(evs) / 2
	if err := push(evs[:mid]); err != nil {
		return err
	}
	if err := push(evs[mid:]); err != nil {
		return err
	}
	return errors.Join(dropped...)
}

// pushSnapshots pushes the Services, then the Nodes, then the Pods.
func (f *Feeder) pushSnapshots(ctx context.Context) error {
	svcs, srev, err := f.l.ListServices()
	if err != nil {
		return fmt.Errorf("client: list services: %w", err)
	}
	if _, err := f.c.PushServiceSnapshot(ctx,
		&allocdv1.ServiceSnapshot{Revision: srev, Services: svcs}); err != nil {
		return fmt.Errorf("client: push service snapshot: %w", err)
	}
	nodes, nrev, err := f.l.ListNodes()
	if err != nil {
		return fmt.Errorf("client: list nodes: %w", err)
	}
	if _, err := f.c.PushNodeSnapshot(ctx, &allocdv1.NodeSnapshot{Revision: nrev, Nodes: nodes}); err != nil {
		return fmt.Errorf("client: push node snapshot: %w", err)
	}
	pods, prev, err := f.l.ListPods()
	if err != nil {
		return fmt.Errorf("client: list pods: %w", err)
	}
	if _, err := f.c.PushPodSnapshot(ctx, &allocdv1.PodSnapshot{Revision: prev, Pods: pods}); err != nil {
		return fmt.Errorf("client: push pod snapshot: %w", err)
	}
	return nil
}
