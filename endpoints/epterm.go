package endpoints

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/endpoints/kube"
	"github.com/allocd/allocd/internal/etcd/watch"
)

// This file is the Endpoints controller's half of a term: its sync of a Service key,
// and the term's view of the stored Endpoints objects.

// newEndpointsHalf is the Endpoints controller of t.
func (t *term) newEndpointsHalf() *half {
	return &half{
		name:    "endpoints",
		queue:   newQueue(t.c.cfg.Clock),
		workers: t.c.cfg.Workers,
		batch:   t.c.cfg.BatchPeriod,
		needs:   []Kind{KindService, KindPod},
		listed:  t.listed,
		startc:  make(chan struct{}),
		sync:    t.syncEndpoints,
		synced:  t.c.metrics.synced,
		sweep:   t.storedKeys,
	}
}

// syncEndpoints computes what the stored Endpoints of key must become (a.5 of the
// reference) and returns the write that makes them so, nil when none is needed.
func (t *term) syncEndpoints(ctx context.Context, key string) (*write, func(int64, time.Time), error) {
	if key == masterKey && t.c.masterEndpoints() != nil {
		return nil, nil, nil // keepMaster owns it
	}
	if err := t.reloadUnsure(ctx, t.c.etcdKey(key)); err != nil {
		return nil, nil, err
	}
	t.mu.RLock()
	svc := t.in.services[key]
	var pods []*kube.Pod
	if svc != nil && svc.Type != kube.TypeExternalName && svc.Selector != nil {
		pods = t.in.selectPods(svc.Namespace, svc.Selector)
	}
	t.mu.RUnlock()
	cur := t.storedObj(key)
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
	desired := Desired(svc, ComputeSubsets(svc, pods), cur.ep, trigger)
	if !NeedsWrite(cur.ep, desired) {
		return nil, nil, nil
	}
	return t.endpointsWrite(key, cur, desired)
}

// deleteOwned is the delete of the stored object of key if this controller wrote it;
// objects of others (hand-made ones, the master leases', leader-election records) are
// left alone.
func (t *term) deleteOwned(key string, cur storedObj) (*write, func(int64, time.Time), error) {
	if cur.ep == nil || cur.ep.ManagedBy != kube.ManagedByController || cur.ep.Annotations[kube.AnnotationLeader] != "" {
		return nil, nil, nil
	}
	return t.endpointsWrite(key, cur, nil)
}

// endpointsWrite is the write of desired (nil: the delete) at key over cur, and what
// records it once committed: metrics and one log line.
func (t *term) endpointsWrite(key string, cur storedObj, desired *kube.Endpoints) (*write, func(int64, time.Time), error) {
	op, err := t.endpointsOp(key, cur, desired)
	if err != nil {
		return nil, nil, err
	}
	after := func(rev int64, since time.Time) { t.wroteEndpoints(key, cur.ep, desired, rev, since) }
	return &write{ops: []writeOp{op}}, after, nil
}

// endpointsOp is the op that puts desired (nil: deletes) at key over cur.
func (t *term) endpointsOp(key string, cur storedObj, desired *kube.Endpoints) (writeOp, error) {
	op := writeOp{key: t.c.etcdKey(key), modRev: cur.modRev(), view: endpointsView{t}}
	if cur.ep != nil {
		op.createRev = cur.ep.CreateRevision
	}
	if desired != nil {
		val, err := encode(desired)
		if err != nil {
			return writeOp{}, err
		}
		op.val, op.obj = val, desired
	}
	return op, nil
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

// modRev is the ModRevision etcd must still have for the object (0: absent).
func (s storedObj) modRev() int64 {
	if s.ep == nil {
		return 0
	}
	return s.ep.Revision
}

// endpointsView is the term's view of the stored Endpoints, for the committer.
type endpointsView struct{ t *term }

func (v endpointsView) committed(op *writeOp, rev int64) {
	key := v.t.c.objectKey([]byte(op.key))
	if op.obj == nil {
		v.t.see(key, nil, rev)
		return
	}
	cp := *op.obj.(*kube.Endpoints)
	cp.Revision, cp.CreateRevision = rev, rev
	if op.createRev != 0 {
		cp.CreateRevision = op.createRev
	}
	v.t.see(key, &cp, rev)
}

func (v endpointsView) unknown(etcdKey string) { v.t.markUnsure(etcdKey) }

func (v endpointsView) refresh(etcdKey string, kv *mvccpb.KeyValue, rev int64) {
	key := v.t.c.objectKey([]byte(etcdKey))
	if kv == nil {
		v.t.see(key, nil, rev)
		return
	}
	e, err := decode(kv.Value, kv.ModRevision, kv.CreateRevision)
	if err != nil {
		v.t.c.log.Warn("stored endpoints unreadable; ignored", "key", etcdKey, "error", err)
		return
	}
	v.t.see(key, e, kv.ModRevision)
}

// see records the state of key at rev, unless the term already saw a newer one.
func (t *term) see(key string, ep *kube.Endpoints, rev int64) {
	t.storedMu.Lock()
	defer t.storedMu.Unlock()
	if cur, ok := t.stored[key]; ok && cur.rev >= rev {
		return
	}
	t.stored[key] = storedObj{ep: ep, rev: rev}
}

// storedKeys returns the keys of the stored Endpoints objects.
func (t *term) storedKeys() []string {
	t.storedMu.Lock()
	defer t.storedMu.Unlock()
	keys := make([]string, 0, len(t.stored))
	for k := range t.stored {
		keys = append(keys, k)
	}
	return keys
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
	listed := make(map[string]*kube.Endpoints, len(resp.Kvs))
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
	gone := t.mergeListed(listed, rev)
	select {
	case <-t.listed:
		t.requeue(t.eps, gone)
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

// mergeListed folds a listing at rev into t.stored and returns the keys that are gone.
func (t *term) mergeListed(listed map[string]*kube.Endpoints, rev int64) []string {
	t.storedMu.Lock()
	defer t.storedMu.Unlock()
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
	return gone
}

// requeue queues keys on h (when h is on).
func (t *term) requeue(h *half, keys []string) {
	if h == nil {
		return
	}
	for _, k := range keys {
		h.queue.add(k, time.Time{})
	}
}

// applyStoredEvent folds one etcd event into t.stored; a delete by someone else queues
// the key (Kubernetes watches Endpoints deletions for the same reason).
func (t *term) applyStoredEvent(ev *clientv3.Event) {
	key := t.c.objectKey(ev.Kv.Key)
	if key == "" {
		return
	}
	rev := ev.Kv.ModRevision
	t.storedMu.Lock()
	cur, ok := t.stored[key]
	t.storedMu.Unlock()
	if ok && cur.rev >= rev {
		return // the term's own write, learnt when it committed: no need to decode it again
	}
	var e *kube.Endpoints
	if ev.Type == mvccpb.PUT {
		var err error
		if e, err = decode(ev.Kv.Value, ev.Kv.ModRevision, ev.Kv.CreateRevision); err != nil {
			t.c.log.Warn("stored endpoints unreadable; ignored", "key", string(ev.Kv.Key), "error", err)
			return
		}
	}
	t.storedMu.Lock()
	cur, ok = t.stored[key]
	newer := !ok || cur.rev < rev
	if newer {
		t.stored[key] = storedObj{ep: e, rev: rev}
	}
	t.storedMu.Unlock()
	if newer && ev.Type == mvccpb.DELETE {
		t.requeue(t.eps, []string{key})
	}
}

// storedObj returns what etcd holds for key, as the term last saw it.
func (t *term) storedObj(key string) storedObj {
	t.storedMu.Lock()
	defer t.storedMu.Unlock()
	return t.stored[key]
}

// markUnsure records that a write under prefix (an Endpoints object's key, or the
// prefix of a Service's slices) may or may not have committed.
func (t *term) markUnsure(prefix string) {
	t.storedMu.Lock()
	t.unsure[prefix] = true
	t.storedMu.Unlock()
}

// reloadUnsure reads again what is under prefix (an Endpoints object's key, or the
// prefix of a Service's slices) when a write there had an unknown outcome, and
// refreshes the views with what etcd holds, so that the sync builds on what etcd has,
// not on what the term last knew.
func (t *term) reloadUnsure(ctx context.Context, prefix string) error {
	t.storedMu.Lock()
	unsure := t.unsure[prefix]
	t.storedMu.Unlock()
	if !unsure {
		return nil
	}
	var opts []clientv3.OpOption
	slices := strings.HasSuffix(prefix, "/")
	if slices {
		opts = append(opts, clientv3.WithPrefix())
	}
	resp, err := t.c.cli.Get(ctx, prefix, opts...)
	if err != nil {
		return fmt.Errorf("read %s again after a write of unknown outcome: %w", prefix, err)
	}
	rev := resp.Header.Revision
	if slices {
		t.reloadSlices(prefix, resp.Kvs, rev)
	} else {
		var kv *mvccpb.KeyValue
		if len(resp.Kvs) == 1 {
			kv = resp.Kvs[0]
		}
		endpointsView{t}.refresh(prefix, kv, rev)
	}
	t.storedMu.Lock()
	delete(t.unsure, prefix)
	t.storedMu.Unlock()
	return nil
}
