package endpoints

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/allocd/allocd/internal/etcd/watch"
)

// errFenceLost ends a term: a write found the election key gone or re-created, so
// another replica may lead.
var errFenceLost = errors.New("endpoints: leadership lost (the election key changed): a write was refused by the fence")

// errConflict: the stored object changed since it was read; the sync runs again on the
// fresh state.
var errConflict = errors.New("endpoints: stored object changed under the write")

// term is one term of leadership: the inputs of the feeds, the work queue, the stored
// objects as etcd holds them, and the workers.
type term struct {
	c      *Controller
	fence  Fence
	cancel context.CancelCauseFunc

	mu      sync.RWMutex // guards in and started
	in      *inputs
	started bool // both snapshots are in: the workers run
	startc  chan struct{}

	queue     *queue
	committer *committer
	tracker   *TriggerTracker
	masterc   chan struct{}

	storedMu sync.Mutex
	stored   map[string]storedObj // by "ns/name"
	listed   chan struct{}        // closed once stored was listed
}

// storedObj is what etcd holds for a key as this term last saw it: the object (nil when
// absent) and the revision of that sight (the object's ModRevision, or of its delete),
// so that an older watch event never overwrites a newer state learnt from a write.
type storedObj struct {
	ep  *Endpoints
	rev int64
}

func newTerm(c *Controller, f Fence, cancel context.CancelCauseFunc) *term {
	t := &term{
		c:       c,
		fence:   f,
		cancel:  cancel,
		in:      newInputs(),
		startc:  make(chan struct{}),
		queue:   newQueue(c.cfg.Clock),
		tracker: NewTriggerTracker(),
		masterc: make(chan struct{}, 1),
		stored:  map[string]storedObj{},
		listed:  make(chan struct{}),
	}
	t.committer = newCommitter(t)
	return t
}

// run lists and watches the stored objects, keeps the master leases' object stored, and
// once both snapshots are in, runs the workers; until ctx ends.
func (t *term) run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { t.queue.runTimers(); return nil })
	g.Go(func() error { t.committer.run(ctx); return nil })
	g.Go(func() error {
		<-ctx.Done()
		t.queue.close()
		return nil
	})
	g.Go(func() error { return t.watchStored(ctx) })
	g.Go(func() error { return t.keepMaster(ctx) })
	g.Go(func() error {
		select {
		case <-ctx.Done():
			return nil
		case <-t.startc:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.listed:
		}
		// The start-up sweep (kube-controller-manager's checkLeftoverEndpoints), made
		// only now that the Service snapshot is complete: every stored object is synced,
		// so that one whose Service is gone is deleted.
		t.storedMu.Lock()
		for k := range t.stored {
			t.queue.add(k, time.Time{})
		}
		t.storedMu.Unlock()
		var wg sync.WaitGroup
		for range t.c.cfg.Workers {
			wg.Add(1)
			go func() { defer wg.Done(); t.work(ctx) }()
		}
		wg.Wait()
		return nil
	})
	return g.Wait()
}

// applySnapshot replaces the inputs of one kind and queues every Service and every
// stored object. The first time both kinds are in, the workers start.
func (t *term) applySnapshot(kind Kind, rev int64, set func(*inputs)) error {
	t.mu.Lock()
	cur, have := t.in.svcRev, t.in.haveSvcs
	if kind == KindPod {
		cur, have = t.in.podRev, t.in.havePods
	}
	if have && rev < cur {
		t.mu.Unlock()
		return &StaleSnapshotError{Kind: kind, Revision: rev, Applied: cur}
	}
	set(t.in)
	keys := make([]string, 0, len(t.in.services))
	for k := range t.in.services {
		keys = append(keys, k)
	}
	start := !t.started && t.in.haveSvcs && t.in.havePods
	if start {
		t.started = true
	}
	t.mu.Unlock()
	now := time.Now()
	for _, k := range keys {
		t.queue.add(k, now)
	}
	t.storedMu.Lock()
	for k := range t.stored {
		t.queue.add(k, time.Time{})
	}
	t.storedMu.Unlock()
	if start {
		close(t.startc)
		t.c.log.Info("endpoints controller has both snapshots; syncing every Service and sweeping orphans",
			"services", len(keys), "service_revision", t.in.svcRev, "pod_revision", t.in.podRev)
	}
	t.c.metrics.snapshot(kind, rev)
	return nil
}

// applyEvents applies a batch of events (see Controller.ApplyEvents).
func (t *term) applyEvents(evs []Event) (EventsResult, error) {
	now := time.Now()
	t.mu.Lock()
	if len(evs) == 0 {
		// A heartbeat: it tells the feeder whether this term still needs snapshots.
		switch {
		case !t.in.haveSvcs:
			t.mu.Unlock()
			return EventsResult{}, &SnapshotRequiredError{Kind: KindService}
		case !t.in.havePods:
			t.mu.Unlock()
			return EventsResult{}, &SnapshotRequiredError{Kind: KindPod}
		}
	}
	for _, ev := range evs {
		if ev.Service != nil && !t.in.haveSvcs {
			t.mu.Unlock()
			return EventsResult{}, &SnapshotRequiredError{Kind: KindService}
		}
		if ev.Pod != nil && !t.in.havePods {
			t.mu.Unlock()
			return EventsResult{}, &SnapshotRequiredError{Kind: KindPod}
		}
	}
	var res EventsResult
	soon := map[string]struct{}{}
	later := map[string]struct{}{}
	// Events of one message may share a revision (0 means the message's): each is a
	// change of its own, applied in order. A message sent again after an unknown
	// outcome is not newer than what it applied, and is ignored.
	var svcOpen, podOpen int64 = -1, -1
	for _, ev := range evs {
		var changed bool
		if ev.Service != nil {
			changed = t.applyServiceEvent(ev, soon, &svcOpen)
		} else {
			changed = t.applyPodEvent(ev, later, &podOpen)
		}
		if changed {
			res.Applied++
		} else {
			res.Ignored++
		}
	}
	res.ServiceRevision, res.PodRevision = t.in.svcRev, t.in.podRev
	t.mu.Unlock()
	for k := range soon {
		t.queue.add(k, now)
	}
	for k := range later {
		t.queue.addAfter(k, t.c.cfg.BatchPeriod, now)
	}
	t.c.metrics.events(res.Applied, res.Ignored)
	return res, nil
}

// newer reports whether an event at rev applies over its kind's applied revision cur:
// a later revision, or the revision of an event of its kind applied earlier in the same
// message (open, -1 when none).
func newer(rev, cur, open int64) bool { return rev > cur || rev == open }

// applyServiceEvent applies one Service event; a Service change syncs its key at once
// (kube-controller-manager queues every Service add, update and delete).
func (t *term) applyServiceEvent(ev Event, keys map[string]struct{}, open *int64) bool {
	if !newer(ev.Revision, t.in.svcRev, *open) {
		return false
	}
	t.in.svcRev, *open = ev.Revision, ev.Revision
	s := ev.Service
	if ev.Type == Delete {
		if t.in.deleteService(s.Namespace, s.Name) == nil {
			return false
		}
	} else {
		t.in.putService(s)
	}
	keys[s.Key()] = struct{}{}
	return true
}

// applyPodEvent applies one Pod event and collects the Services to sync after the
// batch period, as kube-controller-manager's addPod, updatePod and deletePod.
func (t *term) applyPodEvent(ev Event, keys map[string]struct{}, open *int64) bool {
	if !newer(ev.Revision, t.in.podRev, *open) {
		return false
	}
	t.in.podRev, *open = ev.Revision, ev.Revision
	p := ev.Pod
	old := t.in.pod(p.Namespace, p.Name)
	switch {
	case ev.Type == Delete:
		if old == nil {
			return false
		}
		t.in.deletePod(p.Namespace, p.Name)
		t.in.servicesSelecting(keys, old)
	case old == nil:
		t.in.putPod(p)
		t.in.servicesSelecting(keys, p)
	default:
		t.in.putPod(p)
		ks := t.in.podUpdateKeys(old, p)
		if len(ks) == 0 {
			return false
		}
		for k := range ks {
			keys[k] = struct{}{}
		}
	}
	return true
}

// work syncs keys until the queue closes. A sync that needs a write hands it to the
// committer and goes on with the next key: the key stays in processing (no other
// worker takes it) until its write committed or failed.
func (t *term) work(ctx context.Context) {
	for {
		key, since, ok := t.queue.get()
		if !ok {
			return
		}
		start := time.Now()
		w, err := t.sync(key)
		if w == nil {
			t.finish(ctx, key, since, start, err)
			continue
		}
		w.done = func(rev int64, err error) {
			if err == nil {
				t.wrote(w, rev, since)
			}
			t.finish(ctx, key, since, start, err)
		}
		t.committer.submit(ctx, w)
	}
}

// finish ends the processing of key after its sync (and write, if any): a success
// resets its backoff, a conflict syncs it again at once on the fresh state, a lost
// fence ends the term, anything else retries with backoff.
func (t *term) finish(ctx context.Context, key string, since, start time.Time, err error) {
	t.c.metrics.synced(time.Since(start), err)
	switch {
	case err == nil:
		t.queue.forget(key)
	case errors.Is(err, errFenceLost):
		t.cancel(err)
	case errors.Is(err, errConflict):
		t.queue.add(key, since)
	case ctx.Err() != nil:
	default:
		t.c.log.Warn("endpoints sync failed; retrying", "service", key, "error", err)
		t.queue.retryWith(key, since)
	}
	t.queue.done(key)
}

// sync computes what the stored Endpoints of key must become (a.5 of the reference) and
// returns the write that makes them so, nil when none is needed.
func (t *term) sync(key string) (*write, error) {
	if key == masterKey && t.c.masterEndpoints() != nil {
		return nil, nil // keepMaster owns it
	}
	t.mu.RLock()
	svc := t.in.services[key]
	var pods []*Pod
	if svc != nil && svc.Type != TypeExternalName && svc.Selector != nil {
		pods = t.in.selectPods(svc.Namespace, svc.Selector)
	}
	t.mu.RUnlock()
	cur := t.storedObj(key)
	switch {
	case svc == nil:
		t.tracker.Forget(key)
		return deleteOwned(key, cur), nil
	case svc.Type == TypeExternalName:
		// Deliberate deviation: Kubernetes leaves what it wrote before the Service
		// became ExternalName; allocd deletes the object it wrote.
		return deleteOwned(key, cur), nil
	case svc.Selector == nil:
		return nil, nil // Endpoints of a Service without selector are not ours
	}
	trigger := t.tracker.Compute(svc, pods)
	subsets := ComputeSubsets(svc, pods)
	desired := Desired(svc, subsets, cur.ep, trigger)
	if !NeedsWrite(cur.ep, desired) {
		return nil, nil
	}
	val, err := encode(desired)
	if err != nil {
		return nil, err
	}
	return &write{key: key, cur: cur, ep: desired, val: val}, nil
}

// deleteOwned is the delete of the stored object of key if this controller wrote it;
// objects of others (hand-made ones, the master leases', leader-election records) are
// left alone.
func deleteOwned(key string, cur storedObj) *write {
	if cur.ep == nil || cur.ep.ManagedBy != ManagedByController || cur.ep.Annotations[AnnotationLeader] != "" {
		return nil
	}
	return &write{key: key, cur: cur}
}

// wrote records a committed write: metrics and one log line.
func (t *term) wrote(w *write, rev int64, since time.Time) {
	kind := "update"
	switch {
	case w.ep == nil:
		kind = "delete"
	case w.cur.ep == nil:
		kind = "create"
	}
	t.c.metrics.wrote(kind)
	if w.ep == nil {
		t.c.log.Info("endpoints deleted", "service", w.key, "revision", rev)
		return
	}
	if !since.IsZero() {
		t.c.metrics.eventToCommit(time.Since(since))
	}
	ready, notReady := CountAddresses(w.ep.Subsets)
	t.c.log.Info("endpoints "+kind+"d", "service", w.key, "managed_by", w.ep.ManagedBy, "ready", ready,
		"not_ready", notReady, "addresses_before_truncation", w.ep.AddressCount, "revision", rev)
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
	r := <-ch
	if r.err == nil {
		t.wrote(w, r.rev, time.Time{})
	}
	return r.rev, r.err
}

// see records the state of key at rev, unless the term already saw a newer one.
func (t *term) see(key string, ep *Endpoints, rev int64) {
	t.storedMu.Lock()
	defer t.storedMu.Unlock()
	if cur, ok := t.stored[key]; ok && cur.rev >= rev {
		return
	}
	t.stored[key] = storedObj{ep: ep, rev: rev}
}

// watchStored lists the stored objects, then watches them, keeping t.stored current
// with writes made by others; an object deleted by someone else is synced again (it is
// re-created if its Service still wants it). After a broken watch it lists again.
func (t *term) watchStored(ctx context.Context) error {
	watch.Loop(ctx, t.c.log, "endpoints watch", 5*time.Second, t.listAndWatch)
	return nil
}

func (t *term) listAndWatch(ctx context.Context) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	resp, err := t.c.cli.Get(wctx, t.c.prefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("list endpoints: %w", err)
	}
	rev := resp.Header.Revision
	listed := make(map[string]*Endpoints, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		key := t.c.objectKey(kv.Key)
		if key == "" {
			continue
		}
		e, err := decode(kv.Value, kv.ModRevision, kv.CreateRevision)
		if err != nil {
			t.c.log.Warn("stored endpoints unreadable; ignored", "key", string(kv.Key), "error", err)
			continue
		}
		listed[key] = e
	}
	t.storedMu.Lock()
	for key, e := range listed {
		if cur, ok := t.stored[key]; !ok || cur.rev < e.Revision {
			t.stored[key] = storedObj{ep: e, rev: e.Revision}
		}
	}
	var gone []string
	for key, cur := range t.stored {
		if _, ok := listed[key]; !ok && cur.ep != nil && cur.rev <= rev {
			t.stored[key] = storedObj{rev: rev}
			gone = append(gone, key)
		}
	}
	t.storedMu.Unlock()
	select {
	case <-t.listed:
		for _, k := range gone {
			t.queue.add(k, time.Time{})
		}
	default:
		close(t.listed)
	}
	wch := t.c.cli.Watch(wctx, t.c.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch endpoints: %w", err)
		}
		for _, ev := range wr.Events {
			t.applyStoredEvent(ev)
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.New("watch endpoints: channel closed")
}

// applyStoredEvent folds one etcd event into t.stored; a delete by someone else queues
// the key (Kubernetes watches Endpoints deletions for the same reason).
func (t *term) applyStoredEvent(ev *clientv3.Event) {
	key := t.c.objectKey(ev.Kv.Key)
	if key == "" {
		return
	}
	rev := ev.Kv.ModRevision
	var e *Endpoints
	if ev.Type == mvccpb.PUT {
		var err error
		if e, err = decode(ev.Kv.Value, ev.Kv.ModRevision, ev.Kv.CreateRevision); err != nil {
			t.c.log.Warn("stored endpoints unreadable; ignored", "key", string(ev.Kv.Key), "error", err)
			return
		}
	}
	t.storedMu.Lock()
	cur, ok := t.stored[key]
	newer := !ok || cur.rev < rev
	if newer {
		t.stored[key] = storedObj{ep: e, rev: rev}
	}
	t.storedMu.Unlock()
	if newer && ev.Type == mvccpb.DELETE {
		t.queue.add(key, time.Time{})
	}
}

// storedObj returns what etcd holds for key, as the term last saw it.
func (t *term) storedObj(key string) storedObj {
	t.storedMu.Lock()
	defer t.storedMu.Unlock()
	return t.stored[key]
}
