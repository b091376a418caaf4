package endpoints

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/allocd/allocd/endpoints/endpointslice"
	"github.com/allocd/allocd/endpoints/kube"
)

// This file is the EndpointSlice controller's half of a term: its sync of a Service
// key, and what the term's view of the stored slices does its own way. A Service's
// slices are stored under one prefix: <Prefix>/endpointslices/<namespace>/<service>/
// <name>.

// newSlicesHalf is the EndpointSlice controller of t.
func (t *term) newSlicesHalf() *half {
	return &half{
		name:    "endpointslice",
		queue:   newQueue(t.c.cfg.Clock),
		workers: t.c.cfg.SliceWorkers,
		batch:   t.c.cfg.SliceBatchPeriod,
		needs:   []Kind{KindService, KindPod, KindNode},
		listed:  t.storedSlices.listed,
		startc:  make(chan struct{}),
		sync:    t.syncSlices,
		synced:  t.c.metrics.slice.synced,
		sweep:   t.storedSlices.keys,
	}
}

// syncSlices computes the slices key's Service wants and returns the write that makes
// the stored ones so (nil: none), in one transaction. Pods on Nodes the feed does not
// know are left out, and reported as an error after the write: the key is tried
// again (and synced when the Node arrives).
func (t *term) syncSlices(ctx context.Context, key string) (*write, func(int64, time.Time), error) {
	if err := t.storedSlices.reloadUnsure(ctx, key); err != nil {
		return nil, nil, err
	}
	r, pods := t.sliceInputs(key)
	existing := t.managedSlices(key)
	switch svc := r.Service; {
	case svc == nil:
		t.sliceTracker.Forget(key)
		t.c.metrics.slice.serviceGone(key)
		return t.deleteSlices(key, existing)
	case svc.Type == kube.TypeExternalName:
		// As for Endpoints, a deliberate deviation: Kubernetes leaves the slices it
		// wrote before the Service became ExternalName; allocd deletes them.
		t.c.metrics.slice.serviceGone(key)
		return t.deleteSlices(key, existing)
	case svc.Selector == nil:
		return nil, nil, nil // slices of a Service without selector are not the controller's
	}
	r.Existing, r.Taken = existing, t.sliceNames(key)
	r.TriggerTime = t.sliceTracker.Compute(r.Service, pods)
	plan := r.Reconcile()
	t.c.metrics.slice.sync(key, r.Service, plan, r.MaxEndpointsPerSlice)
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
func (t *term) deleteSlices(key string,
	existing []*kube.EndpointSlice) (*write, func(int64, time.Time), error) {
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
		t.c.metrics.slice.wrote(len(plan.Creates), len(plan.Updates), len(plan.Deletes))
		if !since.IsZero() {
			t.c.metrics.slice.eventToCommit(time.Since(since))
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
		createRev: cur.CreateRevision, view: t.storedSlices}
	if s != nil {
		op.val, op.obj = encodeSlice(s), s
	}
	return op
}

// sliceKey is where a slice is stored.
func (c *Controller) sliceKey(namespace, service, name string) string {
	return c.slicePrefix + namespace + "/" + service + "/" + name
}

// sliceNames returns the names of every stored slice of key, managed or not, as their
// etcd keys spell them: a create takes none of them, whatever name a value carries.
func (t *term) sliceNames(key string) map[string]bool { return t.storedSlices.names(key) }

// managedSlices returns the stored slices of key that the controller manages, sorted by
// name.
func (t *term) managedSlices(key string) []*kube.EndpointSlice {
	var out []*kube.EndpointSlice
	for _, s := range t.storedSlices.objects(key) {
		if managed(s) {
			out = append(out, s)
		}
	}
	return out
}

// managed reports whether the EndpointSlice controller manages s.
func managed(s *kube.EndpointSlice) bool {
	return s.Labels[kube.LabelSliceManagedBy] == kube.SliceControllerName
}

// newSlicesView is the term's view of the stored slices. A slice's namespace and name
// are its key's, whatever its value says (a value of another name, or none, would send
// the writes of its sync to another key, which holds nothing: they would conflict for
// ever); its Service is its key's already (slicesStore). A stored value that does not
// decode is kept (and logged) as a slice of its name that nobody manages, so that the
// name stays taken. Any change the term did not write is put right: the EndpointSlice
// controller owns its slices whole (kube-controller-manager's queues the Service on
// every change of a slice it manages).
func (t *term) newSlicesView() *view[*kube.EndpointSlice] {
	v := newView(t.c.slicesStore(), t.c.log)
	decode := v.decode
	v.decode = func(kv *mvccpb.KeyValue) (*kube.EndpointSlice, error) {
		s, err := decode(kv)
		if err != nil {
			return nil, err
		}
		svcKey, name, _ := v.split(kv.Key)
		s.Namespace, _, _ = strings.Cut(svcKey, "/")
		s.Name = name
		return s, nil
	}
	v.unreadable = func(kv *mvccpb.KeyValue, err error) (*kube.EndpointSlice, bool) {
		t.c.log.Warn("stored endpoint slice unreadable; its name is kept out of use", "key", string(kv.Key),
			"error", err)
		svcKey, name, _ := v.split(kv.Key)
		ns, svc, _ := strings.Cut(svcKey, "/")
		return &kube.EndpointSlice{Namespace: ns, Service: svc, Name: name, Revision: kv.ModRevision,
			CreateRevision: kv.CreateRevision}, true
	}
	v.stamp = func(s *kube.EndpointSlice, modRev, createRev int64) *kube.EndpointSlice {
		cp := *s
		cp.Revision, cp.CreateRevision = modRev, createRev
		return &cp
	}
	v.foreignPuts = true
	v.changed = func(key string) { t.requeue(t.slices, key) }
	v.metrics = t.c.metrics.viewCounters("EndpointSlice")
	return v
}
