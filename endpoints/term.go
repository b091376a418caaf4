package endpoints

import (
	"context"
	"errors"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/allocd/allocd/endpoints/kube"
	"github.com/allocd/allocd/leader"
)

// maxConflictsInARow is how many times in a row a sync that met errConflict runs again
// at once on the fresh state; after that it backs off (a key someone else keeps
// changing must not keep a worker busy).
const maxConflictsInARow = 3

// term is one term of leadership: the inputs of the feeds, the two controllers (the
// Endpoints controller and the EndpointSlice controller, each with its work queue and
// workers, either of which may be off), the views of the stored objects of each kind,
// and the group committer both write through.
type term struct {
	c      *Controller
	fence  leader.Fence
	cancel context.CancelCauseFunc

	mu sync.RWMutex // guards in and the halves' started
	in *inputs

	eps    *half // nil when the Endpoints controller is off
	slices *half // nil when the EndpointSlice controller is off

	committer *committer
	masterc   chan struct{}

	epTracker, sliceTracker *TriggerTracker

	// storedEndpoints and storedSlices are what etcd holds of each kind, as the term
	// last saw it (both run while either controller is off: the master leases' objects
	// are kept either way).
	storedEndpoints *view[*kube.Endpoints]
	storedSlices    *view[*kube.EndpointSlice]
}

// half is one of the term's controllers: what it syncs a Service key with, its queue
// and workers, and the snapshots it waits for.
type half struct {
	name    string
	queue   *queue
	workers int
	batch   time.Duration // after a Pod or Node event
	needs   []Kind        // snapshots the workers wait for
	listed  <-chan struct{}
	startc  chan struct{}
	started bool
	// sync computes the write that makes key's stored objects what the inputs want
	// (nil: none); after runs once it committed.
	sync   func(ctx context.Context, key string) (w *write, after func(rev int64, since time.Time), err error)
	synced func(d time.Duration, err error)
	// sweep returns the keys of the stored objects, synced once the workers start
	// (kube-controller-manager's checkLeftoverEndpoints; the orphan sweep of slices).
	sweep func() []string
}

func newTerm(c *Controller, f leader.Fence, cancel context.CancelCauseFunc) *term {
	t := &term{
		c:            c,
		fence:        f,
		cancel:       cancel,
		in:           newInputs(),
		masterc:      make(chan struct{}, 1),
		epTracker:    NewTriggerTracker(),
		sliceTracker: NewTriggerTracker(),
	}
	t.storedEndpoints = t.newEndpointsView()
	t.storedSlices = t.newSlicesView()
	if !c.cfg.DisableEndpoints {
		t.eps = t.newEndpointsHalf()
	}
	if !c.cfg.DisableEndpointSlices {
		t.slices = t.newSlicesHalf()
	}
	t.committer = newCommitter(c.cli, f, c.cfg.MaxTxnOps)
	return t
}

// halves returns the controllers that are on.
func (t *term) halves() []*half {
	var out []*half
	for _, h := range []*half{t.eps, t.slices} {
		if h != nil {
			out = append(out, h)
		}
	}
	return out
}

// run lists and watches the stored objects, keeps the master leases' objects stored,
// and runs each controller's workers once it has its snapshots; until ctx ends.
func (t *term) run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { t.committer.run(ctx); return nil })
	g.Go(func() error { return t.storedEndpoints.run(ctx) })
	g.Go(func() error { return t.storedSlices.run(ctx) })
	g.Go(func() error { return t.keepMaster(ctx) })
	for _, h := range t.halves() {
		g.Go(func() error { h.queue.runTimers(); return nil })
		g.Go(func() error {
			<-ctx.Done()
			h.queue.close()
			return nil
		})
		g.Go(func() error { t.runHalf(ctx, h); return nil })
	}
	return g.Wait()
}

// runHalf waits until h has its snapshots and its stored objects are listed, queues
// every stored object once (so that one whose Service is gone is deleted: made only
// now that the Service snapshot is complete), and runs h's workers.
func (t *term) runHalf(ctx context.Context, h *half) {
	for _, c := range []<-chan struct{}{h.startc, h.listed} {
		select {
		case <-ctx.Done():
			return
		case <-c:
		}
	}
	for _, k := range h.sweep() {
		h.queue.add(k, time.Time{})
	}
	var wg sync.WaitGroup
	for range h.workers {
		wg.Go(func() { t.work(ctx, h) })
	}
	wg.Wait()
}

// requeue queues key on h, when h is on: a Service whose stored objects changed under
// the term, so that its sync puts them right.
func (t *term) requeue(h *half, key string) {
	if h != nil {
		h.queue.add(key, time.Time{})
	}
}

// applySnapshot replaces the inputs of one kind and queues every Service for each
// controller that reads that kind, and every stored object. A controller whose
// snapshots are all in starts.
func (t *term) applySnapshot(kind Kind, rev int64, set func(*inputs)) error {
	t.mu.Lock()
	if cur, have := t.in.revision(kind); have && rev < cur {
		t.mu.Unlock()
		return &StaleSnapshotError{Kind: kind, Revision: rev, Applied: cur}
	}
	set(t.in)
	keys := make([]string, 0, len(t.in.services))
	for k := range t.in.services {
		keys = append(keys, k)
	}
	var starting []*half
	for _, h := range t.halves() {
		if !h.started && t.in.have(h.needs...) {
			h.started = true
			starting = append(starting, h)
		}
	}
	svcRev, podRev := t.in.svcRev, t.in.podRev
	t.mu.Unlock()
	now := time.Now()
	for _, h := range t.halves() {
		if kind == KindNode && h != t.slices {
			continue // only the slices read Nodes
		}
		for _, k := range keys {
			h.queue.add(k, now)
		}
		for _, k := range h.sweep() {
			h.queue.add(k, time.Time{})
		}
	}
	for _, h := range starting {
		close(h.startc)
		t.c.log.Info(h.name+" controller has its snapshots; syncing every Service and sweeping orphans",
			"services", len(keys), "service_revision", svcRev, "pod_revision", podRev)
	}
	t.c.metrics.snapshot(kind, rev)
	return nil
}

// applyEvents applies a batch of events (see Controller.ApplyEvents).
func (t *term) applyEvents(evs []Event) (EventsResult, error) {
	now := time.Now()
	t.mu.Lock()
	if err := t.snapshotRequired(evs); err != nil {
		t.mu.Unlock()
		return EventsResult{}, err
	}
	var res EventsResult
	keys := newEventKeys()
	// Events of one message may share a revision (0 means the message's): each is a
	// change of its own, applied in order. A message sent again after an unknown
	// outcome is not newer than what it applied, and is ignored.
	open := map[Kind]int64{KindService: -1, KindPod: -1, KindNode: -1}
	for _, ev := range evs {
		var changed bool
		switch {
		case ev.Service != nil:
			changed = t.applyServiceEvent(ev, keys, open)
		case ev.Pod != nil:
			changed = t.applyPodEvent(ev, keys, open)
		default:
			changed = t.applyNodeEvent(ev, keys, open)
		}
		if changed {
			res.Applied++
		} else {
			res.Ignored++
		}
	}
	res.ServiceRevision, res.PodRevision, res.NodeRevision = t.in.svcRev, t.in.podRev, t.in.nodeRev
	t.mu.Unlock()
	keys.queue(t, now)
	t.c.metrics.events(res.Applied, res.Ignored)
	return res, nil
}

// snapshotRequired refuses a batch with an event of a kind this term has no snapshot
// of; a batch of no event (a heartbeat) is refused while a controller that is on lacks
// a snapshot, so that a feeder learns of a new term. Called with t.mu held.
func (t *term) snapshotRequired(evs []Event) error {
	if len(evs) == 0 {
		for _, h := range t.halves() {
			for _, k := range h.needs {
				if !t.in.have(k) {
					return &SnapshotRequiredError{Kind: k}
				}
			}
		}
	}
	for _, ev := range evs {
		k := ev.kind()
		if !t.in.have(k) {
			return &SnapshotRequiredError{Kind: k}
		}
	}
	return nil
}

// eventKeys are the Service keys a batch of events queues: soon at once, later after
// the batch period of the controller (Pod events), slices for the slices alone (Node
// events).
type eventKeys struct {
	soon, later, slices map[string]struct{}
}

func newEventKeys() *eventKeys {
	return &eventKeys{soon: map[string]struct{}{}, later: map[string]struct{}{},
		slices: map[string]struct{}{}}
}

func (k *eventKeys) queue(t *term, now time.Time) {
	for _, h := range t.halves() {
		for key := range k.soon {
			h.queue.add(key, now)
		}
		for key := range k.later {
			h.queue.addAfter(key, h.batch, now)
		}
	}
	if t.slices != nil {
		for key := range k.slices {
			t.slices.queue.addAfter(key, t.slices.batch, now)
		}
	}
}

// newer reports whether an event at rev applies over its kind's applied revision cur:
// a later revision, or the revision of an event of its kind applied earlier in the same
// message (open, -1 when none).
func newer(rev, cur, open int64) bool { return rev > cur || rev == open }

// applyServiceEvent applies one Service event; a Service change syncs its key at once
// (kube-controller-manager queues every Service add, update and delete).
func (t *term) applyServiceEvent(ev Event, keys *eventKeys, open map[Kind]int64) bool {
	if !newer(ev.Revision, t.in.svcRev, open[KindService]) {
		return false
	}
	t.in.svcRev, open[KindService] = ev.Revision, ev.Revision
	s := ev.Service
	if ev.Type == Delete {
		if t.in.deleteService(s.Namespace, s.Name) == nil {
			return false
		}
	} else {
		t.in.putService(s)
	}
	keys.soon[s.Key()] = struct{}{}
	return true
}

// applyPodEvent applies one Pod event and collects the Services to sync after the
// batch period, as kube-controller-manager's addPod, updatePod and deletePod.
func (t *term) applyPodEvent(ev Event, keys *eventKeys, open map[Kind]int64) bool {
	if !newer(ev.Revision, t.in.podRev, open[KindPod]) {
		return false
	}
	t.in.podRev, open[KindPod] = ev.Revision, ev.Revision
	p := ev.Pod
	old := t.in.pod(p.Namespace, p.Name)
	switch {
	case ev.Type == Delete:
		if old == nil {
			return false
		}
		t.in.deletePod(p.Namespace, p.Name)
		t.in.servicesSelecting(keys.later, old)
	case old == nil:
		t.in.putPod(p)
		t.in.servicesSelecting(keys.later, p)
	default:
		t.in.putPod(p)
		ks := t.in.podUpdateKeys(old, p)
		if len(ks) == 0 {
			return false
		}
		for k := range ks {
			keys.later[k] = struct{}{}
		}
	}
	return true
}

// applyNodeEvent applies one Node event. Nodes matter to the slices alone: a Node
// that appears, goes or changes zone re-syncs the Services of its Pods (their
// endpoints' zones; a Pod of an unknown Node is left out), which Kubernetes does not;
// a change of the topology hints' CPU shares re-syncs the Services that ask for hints.
func (t *term) applyNodeEvent(ev Event, keys *eventKeys, open map[Kind]int64) bool {
	if !newer(ev.Revision, t.in.nodeRev, open[KindNode]) {
		return false
	}
	t.in.nodeRev, open[KindNode] = ev.Revision, ev.Revision
	n := ev.Node
	old := t.in.nodes[n.Name]
	topoBefore := t.in.topology
	if ev.Type == Delete {
		if old == nil {
			return false
		}
		t.in.deleteNode(n.Name)
	} else {
		if old != nil && old.ResourceVersion != "" && old.ResourceVersion == n.ResourceVersion {
			return false
		}
		t.in.putNode(n)
	}
	if old == nil || ev.Type == Delete || old.Zone() != n.Zone() {
		t.in.servicesOfNode(keys.slices, n.Name)
	}
	if !topologyEqual(topoBefore, t.in.topology) {
		t.in.servicesWithHints(keys.slices)
	}
	return true
}

// work syncs the keys of h until its queue closes. A sync that needs a write hands it
// to the committer and goes on with the next key: the key stays in processing (no
// other worker takes it) until its write committed or failed.
func (t *term) work(ctx context.Context, h *half) {
	for {
		key, since, ok := h.queue.get()
		if !ok {
			return
		}
		start := time.Now()
		w, after, err := h.sync(ctx, key)
		if w == nil {
			t.finish(ctx, h, key, since, start, err)
			continue
		}
		w.done = func(rev int64, werr error) {
			if werr == nil && after != nil {
				after(rev, since)
			}
			// A sync that wrote what it could and skipped Pods of unknown Nodes
			// reports them after the write: the key is retried.
			if werr == nil {
				werr = err
			}
			t.finish(ctx, h, key, since, start, werr)
		}
		t.committer.submit(ctx, w)
	}
}

// finish ends the processing of key after its sync (and write, if any): a success
// resets its backoff, a conflict syncs it again at once on the fresh state, a lost
// fence ends the term, anything else retries with backoff.
func (t *term) finish(ctx context.Context, h *half, key string, since, start time.Time, err error) {
	h.synced(time.Since(start), err)
	switch {
	case err == nil:
		h.queue.forget(key)
	case errors.Is(err, leader.ErrFenceLost):
		t.cancel(err)
	case errors.Is(err, errConflict) && h.queue.conflicted(key) <= maxConflictsInARow:
		h.queue.add(key, since)
	case ctx.Err() != nil:
	default:
		t.c.log.Warn(h.name+" sync failed; retrying", "service", key, "error", err)
		h.queue.retryWith(key, since)
	}
	h.queue.done(key)
}

// commitNow hands w to the committer and waits for its outcome.
func (t *term) commitNow(ctx context.Context, w *write) (int64, error) {
	type result struct {
		rev int64
		err error
	}
	ch := make(chan result, 1)
	w.done = func(rev int64, err error) { ch <- result{rev, err} }
	t.committer.submit(ctx, w)
	select {
	case r := <-ch:
		return r.rev, r.err
	case <-ctx.Done():
		return 0, ctx.Err() // done still runs, into ch, when the committer gets to w
	}
}

// idle reports whether no controller of the term has work queued or in progress.
func (t *term) idle() bool {
	for _, h := range t.halves() {
		if !h.queue.idle() {
			return false
		}
	}
	return true
}
