package endpoints

import (
	"context"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/allocd/allocd/endpoints/kube"
)

// This file is the Endpoints controller's half of a term: its sync of a Service key,
// and what the term's view of the stored Endpoints objects does its own way.

// newEndpointsHalf is the Endpoints controller of t.
func (t *term) newEndpointsHalf() *half {
	return &half{
		name:    "endpoints",
		queue:   newQueue(t.c.cfg.Clock),
		workers: t.c.cfg.Workers,
		batch:   t.c.cfg.BatchPeriod,
		needs:   []Kind{KindService, KindPod},
		listed:  t.storedEndpoints.listed,
		startc:  make(chan struct{}),
		sync:    t.syncEndpoints,
		synced:  t.c.metrics.synced,
		sweep:   t.storedEndpoints.keys,
	}
}

// syncEndpoints computes what the stored Endpoints of key must become (as
// kube-controller-manager's syncService in pkg/controller/endpoint/endpoints_controller.go)
// and returns the write that makes them so, nil when none is needed.
func (t *term) syncEndpoints(ctx context.Context, key string) (*write, func(int64, time.Time), error) {
	if key == masterKey && t.c.masterEndpoints() != nil {
		return nil, nil, nil // keepMaster owns it
	}
	if err := t.storedEndpoints.reloadUnsure(ctx, key); err != nil {
		return nil, nil, err
	}
	t.mu.RLock()
	svc := t.in.services[key]
	var pods []*kube.Pod
	if svc != nil && svc.Type != kube.TypeExternalName && svc.Selector != nil {
		pods = t.in.selectPods(svc.Namespace, svc.Selector)
	}
	t.mu.RUnlock()
	cur := t.storedEndpoints.get(key, "")
	switch {
	case svc == nil:
		t.epTracker.Forget(key)
		return t.deleteOwned(key, cur)
	case svc.Type == kube.TypeExternalName:
		// Deliberate deviation: Kubernetes leaves what it wrote before the Service
		// became ExternalName; allocd deletes the object it wrote.
		return t.deleteOwned(key, cur)
	case svc.Selector == nil:
		return nil, nil, nil // Endpoints of a Service without selector are not ours
	}
	trigger := t.epTracker.Compute(svc, pods)
	desired := Desired(svc, ComputeSubsets(svc, pods), cur.obj, trigger)
	if !NeedsWrite(cur.obj, desired) {
		return nil, nil, nil
	}
	return t.endpointsWrite(key, cur, desired)
}

// deleteOwned is the delete of the stored object of key if this controller wrote it;
// objects of others (hand-made ones, the master leases', leader-election records) are
// left alone.
func (t *term) deleteOwned(key string, cur sight[*kube.Endpoints]) (*write, func(int64, time.Time), error) {
	if cur.obj == nil || cur.obj.ManagedBy != kube.ManagedByController ||
		cur.obj.Annotations[kube.AnnotationLeader] != "" {
		return nil, nil, nil
	}
	return t.endpointsWrite(key, cur, nil)
}

// endpointsWrite is the write of desired (nil: the delete) at key over cur, and what
// records it once committed: metrics and one log line.
func (t *term) endpointsWrite(key string, cur sight[*kube.Endpoints],
	desired *kube.Endpoints) (*write, func(int64, time.Time), error) {
	op := t.endpointsOp(key, cur, desired)
	after := func(rev int64, since time.Time) { t.wroteEndpoints(key, cur.obj, desired, rev, since) }
	return &write{ops: []writeOp{op}}, after, nil
}

// endpointsOp is the op that puts desired (nil: deletes) at key over cur.
func (t *term) endpointsOp(key string, cur sight[*kube.Endpoints], desired *kube.Endpoints) writeOp {
	op := writeOp{key: t.c.etcdKey(key), view: t.storedEndpoints}
	if cur.obj != nil {
		op.modRev, op.createRev = cur.obj.Revision, cur.obj.CreateRevision
	}
	if desired != nil {
		op.val, op.obj = encodeEndpoints(desired), desired
	}
	return op
}

// wroteEndpoints records a committed write: metrics and one log line.
func (t *term) wroteEndpoints(key string, cur, ep *kube.Endpoints, rev int64, since time.Time) {
	kind := "update"
	switch {
	case ep == nil:
		kind = "delete"
	case cur == nil:
		kind = "create"
	}
	t.c.metrics.wrote(kind)
	if ep == nil {
		t.c.log.Info("endpoints deleted", "service", key, "revision", rev)
		return
	}
	if !since.IsZero() {
		t.c.metrics.eventToCommit(time.Since(since))
	}
	ready, notReady := CountAddresses(ep.Subsets)
	t.c.log.Info("endpoints "+kind+"d", "service", key, "managed_by", ep.ManagedBy, "ready", ready,
		"not_ready", notReady, "addresses_before_truncation", ep.AddressCount, "revision", rev)
}

// newEndpointsView is the term's view of the stored Endpoints objects. A stored value
// that does not decode is kept (and logged) as an empty object of its key that nobody
// wrote, at the value's revisions: a sync that wants an object there (of a Service with
// a selector, or of the master leases) writes over it, comparing that revision, and
// nothing deletes it. A change of someone else's is put right only when it deletes an
// object (kube-controller-manager watches Endpoints deletions alone).
func (t *term) newEndpointsView() *view[*kube.Endpoints] {
	v := newView(t.c.endpointsStore(), t.c.log)
	v.unreadable = func(kv *mvccpb.KeyValue, err error) (*kube.Endpoints, bool) {
		t.c.log.Warn("stored endpoints unreadable; kept as an object nobody wrote, to be written over",
			"key", string(kv.Key), "error", err)
		svcKey, _, _ := v.split(kv.Key)
		ns, name, _ := strings.Cut(svcKey, "/")
		return &kube.Endpoints{Namespace: ns, Name: name, Revision: kv.ModRevision,
			CreateRevision: kv.CreateRevision}, true
	}
	v.stamp = func(e *kube.Endpoints, modRev, createRev int64) *kube.Endpoints {
		cp := *e
		cp.Revision, cp.CreateRevision = modRev, createRev
		return &cp
	}
	v.changed = func(key string) { t.requeue(t.eps, key) }
	v.metrics = t.c.metrics.viewCounters("Endpoints")
	return v
}
