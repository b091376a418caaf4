package endpoints

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/endpoints/endpointslice"
	"github.com/allocd/allocd/endpoints/kube"
	"github.com/allocd/allocd/internal/etcd/watch"
)

// This file is the EndpointSlice controller's half of a term: its sync of a Service
// key, and the term's view of the stored slices (<Prefix>/endpointslices/<namespace>/
// <service>/<name>: a Service's slices under one prefix).

// storedSlice is what etcd holds for a slice key as this term last saw it, as
// storedObj for Endpoints.
type storedSlice struct {
	s   *kube.EndpointSlice
	rev int64
}

// newSlicesHalf is the EndpointSlice controller of t.
func (t *term) newSlicesHalf() *half {
	return &half{
		name:    "endpointslice",
		queue:   newQueue(t.c.cfg.Clock),
		workers: t.c.cfg.SliceWorkers,
		batch:   t.c.cfg.SliceBatchPeriod,
		needs:   []Kind{KindService, KindPod, KindNode},
		listed:  t.slicesListed,
		startc:  make(chan struct{}),
		sync:    t.syncSlices,
		synced:  t.c.metrics.slicesSynced,
		sweep:   t.storedSliceKeys,
	}
}

// syncSlices computes the slices key's Service wants and returns the write that makes
// the stored ones so (nil: none), in one transaction. Pods on Nodes the feed does not
// know are left out, and reported as an error after the write: the key is tried
// again (and synced when the Node arrives).
func (t *term) syncSlices(ctx context.Context, key string) (*write, func(int64, time.Time), error) {
	if err := t.reloadUnsure(ctx, t.c.slicesOf(key)); err != nil {
		return nil, nil, err
	}
	r, pods := t.sliceInputs(key)
	existing := t.managedSlices(key)
	switch svc := r.Service; {
	case svc == nil:
		t.sliceTracker.Forget(key)
		t.c.metrics.sliceServiceGone(key)
		return t.deleteSlices(key, existing)
	case svc.Type == kube.TypeExternalName:
		// As for Endpoints, a deliberate deviation: Kubernetes leaves the slices it
		// wrote before the Service became ExternalName; allocd deletes them.
		t.c.metrics.sliceServiceGone(key)
		return t.deleteSlices(key, existing)
	case svc.Selector == nil:
		return nil, nil, nil // slices of a Service without selector are not the controller's
	}
	r.Existing, r.Taken = existing, t.sliceNames(key)
	r.TriggerTime = t.sliceTracker.Compute(r.Service, pods)
	plan := r.Reconcile()
	t.c.metrics.sliceSync(key, r.Service, plan, r.MaxEndpointsPerSlice)
	var err error
	if skipped := r.Desired.Skipped; len(skipped) > 0 {
		err = fmt.Errorf("pods %s of %s left out: their Node is not known", strings.Join(skipped, ", "), key)
	}
	if plan.Writes() == 0 {
		return nil, nil, err
	}
	w, after := t.slicesWrite(key, plan)
	return w, after, err
}

// sliceInputs reads what the sync of key needs from the inputs, under the read lock:
// the Service, what its Pods make of its slices, and the Pods (for the trigger time).
func (t *term) sliceInputs(key string) (*endpointslice.Reconciler, []*kube.Pod) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	svc := t.in.services[key]
	r := &endpointslice.Reconciler{Service: svc, MaxEndpointsPerSlice: t.c.cfg.MaxEndpointsPerSlice,
		Topology: t.in.topology}
	if svc == nil || svc.Type == kube.TypeExternalName || svc.Selector == nil {
		return r, nil
	}
	pods := t.in.selectPods(svc.Namespace, svc.Selector)
	r.Desired = endpointslice.Desire(svc, pods, t.in.node)
	return r, pods
}

// deleteSlices is the write that deletes the slices of key the controller manages.
func (t *term) deleteSlices(key string, existing []*kube.EndpointSlice) (*write, func(int64, time.Time), error) {
	if len(existing) == 0 {
		return nil, nil, nil
	}
	w, after := t.slicesWrite(key, &endpointslice.Plan{Deletes: existing})
	return w, after, nil
}

// slicesWrite is the write of a plan, in one transaction while it fits in one; and
// what records it once committed. Its ops are in the order a larger write commits in
// (see write): creates, updates, deletes.
func (t *term) slicesWrite(key string, plan *endpointslice.Plan) (*write, func(int64, time.Time)) {
	w := &write{ops: make([]writeOp, 0, plan.Writes())}
	for _, s := range append(slices.Clip(plan.Creates), plan.Updates...) {
		w.ops = append(w.ops, t.sliceOp(s, s))
	}
	for _, s := range plan.Deletes {
		w.ops = append(w.ops, t.sliceOp(s, nil))
	}
	after := func(rev int64, since time.Time) {
		t.c.metrics.slicesWrote(len(plan.Creates), len(plan.Updates), len(plan.Deletes))
		if !since.IsZero() {
			t.c.metrics.sliceEventToCommit(time.Since(since))
		}
		t.c.log.Info("endpointslices written", "service", key, "created", len(plan.Creates),
			"updated", len(plan.Updates), "deleted", len(plan.Deletes), "revision", rev)
	}
	return w, after
}

// sliceOp is the op that puts s (nil: deletes cur) over cur, which etcd holds at
// cur.Revision (0: a slice to create).
func (t *term) sliceOp(cur, s *kube.EndpointSlice) writeOp {
	op := writeOp{key: t.c.sliceKey(cur.Namespace, cur.Service, cur.Name), modRev: cur.Revision,
		createRev: cur.CreateRevision, view: slicesView{t}}
	if s != nil {
		op.val, op.obj = encodeSlice(s), s
	}
	return op
}

// sliceKey is where a slice is stored.
func (c *Controller) sliceKey(namespace, service, name string) string {
	return c.slicePrefix + namespace + "/" + service + "/" + name
}

// sliceKeyParts splits a stored slice's key into its Service's key and its name; ok is
// false for a key that is not one.
func (c *Controller) sliceKeyParts(k []byte) (svcKey, name string, ok bool) {
	r, found := strings.CutPrefix(string(k), c.slicePrefix)
	if !found || strings.Count(r, "/") != 2 {
		return "", "", false
	}
	i := strings.LastIndexByte(r, '/')
	return r[:i], r[i+1:], true
}

// sliceNames returns the names of every stored slice of key, managed or not.
func (t *term) sliceNames(key string) map[string]bool {
	t.slicesMu.Lock()
	defer t.slicesMu.Unlock()
	out := map[string]bool{}
	for name, ss := range t.storedSlices[key] {
		if ss.s != nil {
			out[name] = true
		}
	}
	return out
}

// managedSlices returns the stored slices of key that the controller manages, sorted by
// name.
func (t *term) managedSlices(key string) []*kube.EndpointSlice {
	t.slicesMu.Lock()
	defer t.slicesMu.Unlock()
	var out []*kube.EndpointSlice
	for _, name := range slices.Sorted(maps.Keys(t.storedSlices[key])) {
		if s := t.storedSlices[key][name].s; s != nil && managed(s) {
			out = append(out, s)
		}
	}
	return out
}

// storedSliceKeys returns the keys of the Services with stored slices.
func (t *term) storedSliceKeys() []string {
	t.slicesMu.Lock()
	defer t.slicesMu.Unlock()
	var keys []string
	for k, byName := range t.storedSlices {
		for _, ss := range byName {
			if ss.s != nil {
				keys = append(keys, k)
				break
			}
		}
	}
	return keys
}

// seeSlice records the state of a slice at rev, unless the term already saw a newer
// one; it reports whether it did.
func (t *term) seeSlice(svcKey, name string, s *kube.EndpointSlice, rev int64) bool {
	t.slicesMu.Lock()
	defer t.slicesMu.Unlock()
	byName := t.storedSlices[svcKey]
	if cur, ok := byName[name]; ok && cur.rev >= rev {
		return false
	}
	if byName == nil {
		byName = map[string]storedSlice{}
		t.storedSlices[svcKey] = byName
	}
	byName[name] = storedSlice{s: s, rev: rev}
	return true
}

// sawSlice reports whether the term has seen the slice at rev or later.
func (t *term) sawSlice(svcKey, name string, rev int64) bool {
	t.slicesMu.Lock()
	defer t.slicesMu.Unlock()
	cur, ok := t.storedSlices[svcKey][name]
	return ok && cur.rev >= rev
}

// managed reports whether the EndpointSlice controller manages s.
func managed(s *kube.EndpointSlice) bool {
	return s.Labels[kube.LabelSliceManagedBy] == kube.SliceControllerName
}

// slicesView is the term's view of the stored slices, for the committer.
type slicesView struct{ t *term }

func (v slicesView) committed(op *writeOp, rev int64) {
	svcKey, name, _ := v.t.c.sliceKeyParts([]byte(op.key))
	if op.obj == nil {
		v.t.seeSlice(svcKey, name, nil, rev)
		return
	}
	cp := *op.obj.(*kube.EndpointSlice)
	cp.Revision, cp.CreateRevision = rev, rev
	if op.createRev != 0 {
		cp.CreateRevision = op.createRev
	}
	v.t.seeSlice(svcKey, name, &cp, rev)
}

func (v slicesView) unknown(key string) {
	svcKey, _, _ := v.t.c.sliceKeyParts([]byte(key))
	v.t.markUnsure(v.t.c.slicesOf(svcKey))
}

func (v slicesView) refresh(key string, kv *mvccpb.KeyValue, rev int64) {
	svcKey, name, _ := v.t.c.sliceKeyParts([]byte(key))
	if kv == nil {
		v.t.seeSlice(svcKey, name, nil, rev)
		return
	}
	v.t.seeSlice(svcKey, name, v.t.c.readSlice(kv), kv.ModRevision)
}

// readSlice decodes the slice of kv; one that does not decode is logged and kept as a
// slice of that name that nobody manages, so that its name stays taken.
func (c *Controller) readSlice(kv *mvccpb.KeyValue) *kube.EndpointSlice {
	s, err := c.decodeStoredSlice(kv)
	if err == nil {
		return s
	}
	c.log.Warn("stored endpoint slice unreadable; its name is kept out of use", "key", string(kv.Key), "error", err)
	svcKey, name, _ := c.sliceKeyParts(kv.Key)
	ns, svc, _ := strings.Cut(svcKey, "/")
	return &kube.EndpointSlice{Namespace: ns, Service: svc, Name: name, Revision: kv.ModRevision, CreateRevision: kv.CreateRevision}
}

// slicesOf is the prefix of the keys of the slices of the Service of svcKey.
func (c *Controller) slicesOf(svcKey string) string { return c.slicePrefix + svcKey + "/" }

// reloadSlices replaces the view of the slices under prefix (a Service's) with kvs,
// read at rev.
func (t *term) reloadSlices(prefix string, kvs []*mvccpb.KeyValue, rev int64) {
	svcKey := strings.TrimSuffix(strings.TrimPrefix(prefix, t.c.slicePrefix), "/")
	found := map[string]bool{}
	for _, kv := range kvs {
		_, name, ok := t.c.sliceKeyParts(kv.Key)
		if !ok {
			continue
		}
		found[name] = true
		slicesView{t}.refresh(string(kv.Key), kv, rev)
	}
	t.slicesMu.Lock()
	defer t.slicesMu.Unlock()
	for name, cur := range t.storedSlices[svcKey] {
		if !found[name] && cur.rev <= rev {
			t.storedSlices[svcKey][name] = storedSlice{rev: rev}
		}
	}
}

// decodeStoredSlice decodes the slice a key holds.
func (c *Controller) decodeStoredSlice(kv *mvccpb.KeyValue) (*kube.EndpointSlice, error) {
	svcKey, _, ok := c.sliceKeyParts(kv.Key)
	if !ok {
		return nil, fmt.Errorf("%s is not the key of an endpoint slice", kv.Key)
	}
	_, svc, _ := strings.Cut(svcKey, "/")
	return decodeSlice(kv.Value, svc, kv.ModRevision, kv.CreateRevision)
}

// watchStoredSlices lists the stored slices, then watches them, as watchStored does
// for Endpoints; a managed slice deleted by someone else re-syncs its Service.
func (t *term) watchStoredSlices(ctx context.Context) error {
	watch.Loop(ctx, t.c.log, "endpointslices watch", 5*time.Second, t.listAndWatchSlices)
	return nil
}

func (t *term) listAndWatchSlices(ctx context.Context) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	resp, err := t.c.cli.Get(wctx, t.c.slicePrefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("list endpoint slices: %w", err)
	}
	rev := resp.Header.Revision
	listed := map[string]map[string]*kube.EndpointSlice{}
	for _, kv := range resp.Kvs {
		svcKey, name, ok := t.c.sliceKeyParts(kv.Key)
		if !ok {
			continue
		}
		s := t.c.readSlice(kv)
		if listed[svcKey] == nil {
			listed[svcKey] = map[string]*kube.EndpointSlice{}
		}
		listed[svcKey][name] = s
	}
	gone := t.mergeListedSlices(listed, rev)
	select {
	case <-t.slicesListed:
		t.requeue(t.slices, gone)
	default:
		close(t.slicesListed)
	}
	wch := t.c.cli.Watch(wctx, t.c.slicePrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch endpoint slices: %w", err)
		}
		for _, ev := range wr.Events {
			t.applyStoredSliceEvent(ev)
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.New("watch endpoint slices: channel closed")
}

// mergeListedSlices folds a listing at rev into the view and returns the keys of the
// Services that lost a slice.
func (t *term) mergeListedSlices(listed map[string]map[string]*kube.EndpointSlice, rev int64) []string {
	for svcKey, byName := range listed {
		for name, s := range byName {
			t.seeSlice(svcKey, name, s, s.Revision)
		}
	}
	t.slicesMu.Lock()
	defer t.slicesMu.Unlock()
	var gone []string
	for svcKey, byName := range t.storedSlices {
		for name, cur := range byName {
			if _, ok := listed[svcKey][name]; !ok && cur.s != nil && cur.rev <= rev {
				byName[name] = storedSlice{rev: rev}
				gone = append(gone, svcKey)
			}
		}
	}
	return gone
}

// applyStoredSliceEvent folds one etcd event into the view; a change the term did not
// write queues the Service.
func (t *term) applyStoredSliceEvent(ev *clientv3.Event) {
	svcKey, name, ok := t.c.sliceKeyParts(ev.Kv.Key)
	if !ok {
		return
	}
	if t.sawSlice(svcKey, name, ev.Kv.ModRevision) {
		return // the term's own write, learnt when it committed: no need to decode it again
	}
	var s *kube.EndpointSlice
	if ev.Type == mvccpb.PUT {
		s = t.c.readSlice(ev.Kv)
	}
	// A state this term did not write (someone else's edit or delete, or a write of
	// unknown outcome seen at last): the Service is synced again, and puts it right.
	if t.seeSlice(svcKey, name, s, ev.Kv.ModRevision) {
		t.requeue(t.slices, []string{svcKey})
	}
}

// slicesStore reads the stored slices.
func (c *Controller) slicesStore() store[*kube.EndpointSlice] {
	return store[*kube.EndpointSlice]{cli: c.cli, prefix: c.slicePrefix, what: "endpoint slices", depth: 2,
		decode: c.decodeStoredSlice}
}

// ListSlices returns up to pageSize slices (0: DefaultPageSize; capped at MaxPageSize)
// of every namespace (namespace ""), of one namespace, or of one Service (service with
// its namespace), sorted by namespace, Service and name, after pageToken, as List does
// for Endpoints.
func (c *Controller) ListSlices(ctx context.Context, namespace, service string, pageSize int, pageToken string) ([]*kube.EndpointSlice, string, int64, error) {
	scope, err := sliceScope(namespace, service)
	if err != nil {
		return nil, "", 0, err
	}
	return c.slicesStore().list(ctx, scope, pageSize, pageToken)
}

// sliceScope is the part of the key space a listing of slices covers.
func sliceScope(namespace, service string) (string, error) {
	inv := &InvalidError{}
	if strings.Contains(namespace, "/") {
		inv.Add("namespace", "must not contain '/'")
	}
	switch {
	case strings.Contains(service, "/"):
		inv.Add("service_name", "must not contain '/'")
	case service != "" && namespace == "":
		inv.Add("namespace", "required with service_name")
	}
	if err := inv.OrNil(); err != nil {
		return "", err
	}
	if service != "" {
		return namespace + "/" + service, nil
	}
	return namespace, nil
}

// SliceWatchEvent is one change of a stored slice. For Deleted, Slice is the last
// state and Revision the revision of the delete. From WatchSlicesStored, Stored instead
// of Slice when the stored form can be sent as it is.
type SliceWatchEvent struct {
	Type     WatchType
	Slice    *kube.EndpointSlice
	Stored   *Stored
	Revision int64
}

// WatchSlices sends the changes of the stored slices of namespace ("" for all) to
// send, as Watch does for Endpoints.
func (c *Controller) WatchSlices(ctx context.Context, namespace string, startRev int64, send func(SliceWatchEvent) error) error {
	if err := validScope("namespace", namespace); err != nil {
		return err
	}
	return c.slicesStore().watch(ctx, namespace, startRev, func(t WatchType, s *kube.EndpointSlice, rev int64) error {
		return send(SliceWatchEvent{Type: t, Slice: s, Revision: rev})
	})
}

// WatchSlicesStored is WatchSlices for a caller that sends the slices on in the API's
// form, as WatchStored is for Endpoints.
func (c *Controller) WatchSlicesStored(ctx context.Context, namespace string, startRev int64,
	send func(SliceWatchEvent) error) error {
	if err := validScope("namespace", namespace); err != nil {
		return err
	}
	return c.slicesStore().watchKVs(ctx, namespace, startRev, func(t WatchType, kv *mvccpb.KeyValue,
		rev int64) error {
		if exactSlice(kv.Value) {
			return send(SliceWatchEvent{Type: t, Stored: storedOf(kv), Revision: rev})
		}
		s, err := c.decodeStoredSlice(kv)
		if err != nil {
			return err
		}
		return send(SliceWatchEvent{Type: t, Slice: s, Revision: rev})
	})
}
