package write

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/allocd/allocd/client"
)

// Object is one of allocd's objects a Writer follows: the API message of an Endpoints
// (*allocdv1.ServiceEndpoints) or an EndpointSlice (*allocdv1.EndpointSlice); its zero
// value (nil) stands for none.
type Object interface {
	comparable
	GetNamespace() string
	GetName() string
}

// Kind is one kind of object a Writer keeps in the cluster, A being allocd's object of
// the kind: how allocd's objects are listed and watched, and how one is written into
// the cluster. Endpoints and EndpointSlices are the two.
type Kind[A Object] interface {
	// Name names the kind in logs and metrics ("endpoints", "endpointslices").
	Name() string
	// List returns every object allocd holds of the kind by key, and the revision
	// the listing was read at.
	List(ctx context.Context) (map[string]A, int64, error)
	// Watch calls fn with every change after rev, in order (obj nil when allocd
	// deleted the object), until ctx ends or the watch breaks; client.ErrCompacted
	// when rev is gone.
	Watch(ctx context.Context, rev int64, fn func(key string, obj A, rev int64)) error
	// Sync makes the cluster's object of key what obj says; obj nil means that allocd
	// holds none: the cluster's is deleted only when allocd's controller manages it.
	Sync(ctx context.Context, key string, obj A) error
	// Informer is the informer of the kind's cluster objects: a change there that
	// someone else made is put right. Its store is what Sync compares against.
	Informer() cache.SharedIndexInformer
	// Services is the informer of the cluster's Services the kind reads.
	Services() cache.SharedIndexInformer
	// Forget drops what the kind remembers of key's cluster object beside the
	// informer (the object it wrote last): the informer saw it deleted.
	Forget(key string)
	// ServiceOf returns namespace/name of the Service of one of allocd's objects.
	ServiceOf(obj A) string
	// Leftovers returns the keys of the cluster's objects that allocd's controller
	// manages and that listed (every object allocd holds, by key) lacks, as upstream's
	// controllers would delete them; a *ResetError when allocd looks reset.
	Leftovers(listed map[string]A) ([]string, error)
}

// Writer follows allocd's objects of one Kind and writes them into the cluster with a
// pool of workers, one key at a time per worker (a key is never synced by two workers
// at once: client-go's work queue guarantees it). A failed write is retried with
// backoff from allocd's state as it then stands, so a conflict (someone else wrote
// the object) ends with allocd's state written.
//
// The desired state of a key changes only when allocd says so (an event, or a
// complete listing after a broken watch): a Writer never deletes because its own view
// is incomplete. After each complete listing, once its informers have synced, it
// sweeps: what allocd deleted while no bridge ran (the cluster's objects with the
// managed-by label the bridge writes that allocd's listing lacks, see Kind.Leftovers)
// is deleted too, unless allocd looks reset (a ResetError: the sweep is held off, logged
// and counted). A held sweep is tried again soon (after a quarter of a second, doubling
// up to SweepInterval): at start, allocd has not yet computed the objects of what the
// bridge's feed just gave it, and the leftovers of before go as soon as it has, as
// kube-controller-manager deletes them at its start. It sweeps again every
// SweepInterval: what kube-controller-manager's controllers left behind when they were
// turned off (their old slices) goes.
type Writer[A Object] struct {
	kind    Kind[A]
	log     *slog.Logger
	workers int
	m       *Metrics
	queue   workqueue.TypedRateLimitingInterface[string]

	// SweepInterval is how often the writer sweeps after its first listing; set it
	// before Run.
	SweepInterval time.Duration
	heldRetry     time.Duration // the first wait after a held sweep
	sweepNow      chan struct{} // a listing asks the sweeper for a sweep

	mu       sync.Mutex
	desired  map[string]A    // nil value: allocd deleted it
	synced   bool            // the first listing was queued
	swept    bool            // a sweep went through
	leftover map[string]bool // what the first sweep that went through deletes, not yet written
}

// New returns a Writer of k with workers workers.
func New[A Object](log *slog.Logger, k Kind[A], workers int, m *Metrics) *Writer[A] {
	return &Writer[A]{
		kind:    k,
		log:     log.With("kind", k.Name()),
		workers: max(workers, 1),
		m:       m,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: k.Name()}),
		desired:       map[string]A{},
		leftover:      map[string]bool{},
		SweepInterval: time.Minute,
		heldRetry:     250 * time.Millisecond,
		sweepNow:      make(chan struct{}, 1),
	}
}

// Register sets the kind's informer's transform (its cache drops the objects' managed
// fields) and adds the handler that puts right what someone else changes or deletes in
// the cluster. Call it before the informer starts: both fail once it has.
func (w *Writer[A]) Register() error {
	if err := w.kind.Informer().SetTransform(dropManagedFields); err != nil {
		return fmt.Errorf("write: %s informer: %w", w.kind.Name(), err)
	}
	requeue := func(obj any) {
		key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		if err != nil {
			return
		}
		w.mu.Lock()
		_, known := w.desired[key]
		w.mu.Unlock()
		if known {
			w.queue.Add(key)
		}
	}
	_, err := w.kind.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, cur any) { requeue(cur) },
		DeleteFunc: func(obj any) {
			if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
				w.kind.Forget(key)
			}
			requeue(obj)
		},
	})
	if err != nil {
		return err
	}
	_, err = w.kind.Services().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Service)
			c, ok2 := cur.(*corev1.Service)
			if ok1 && ok2 && (o.Spec.Selector == nil) != (c.Spec.Selector == nil) {
				w.requeueService(c.Namespace + "/" + c.Name)
			}
		},
	})
	return err
}

// requeueService queues every key of allocd's objects of the Service svc: it gained or
// lost its selector, so what the bridge leaves alone or writes of it changed (a
// Service given its selector back has its objects written over what someone wrote
// meanwhile, as upstream's controllers do on the Service's update).
func (w *Writer[A]) requeueService(svc string) {
	w.mu.Lock()
	var keys []string
	var none A
	for key, obj := range w.desired {
		if obj != none && w.kind.ServiceOf(obj) == svc {
			keys = append(keys, key)
		}
	}
	w.mu.Unlock()
	for _, key := range keys {
		w.queue.Add(key)
	}
}

// Synced reports whether allocd's objects were listed once and every key of the
// listing was written or tried.
func (w *Writer[A]) Synced() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.synced
}

// Ready reports whether the writer has done what a controller does at its start:
// listed allocd's objects, swept once (not held off: allocd does not look reset), and
// written the deletions of that sweep, the leftovers of before.
func (w *Writer[A]) Ready() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.synced && w.swept && len(w.leftover) == 0
}

// Run waits for the informer's cache, then writes until ctx ends and returns nil.
// Follow errors are logged and followed by a new listing, with backoff.
func (w *Writer[A]) Run(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), w.kind.Informer().HasSynced, w.kind.Services().HasSynced) {
		return nil
	}
	var wg sync.WaitGroup
	wg.Go(func() { w.sweeper(ctx) })
	for range w.workers {
		wg.Go(func() {
			for w.next(ctx) {
			}
		})
	}
	go func() {
		<-ctx.Done()
		w.queue.ShutDown()
	}()
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := w.follow(ctx)
		if ctx.Err() != nil {
			break
		}
		if time.Since(start) > time.Minute {
			backoff = 100 * time.Millisecond
		}
		w.log.Warn("following allocd failed; listing again", "error", err, "backoff", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff/2 + rand.N(backoff/2+1)):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	wg.Wait()
	return nil
}

// follow lists allocd's objects, queues every key whose state it learns, then watches
// from the listing's revision. A key known before and absent from the listing is
// forgotten, not deleted: the sweep that follows the listing deletes its cluster object
// if allocd deleted it, and holds off if allocd looks reset (restored from a backup,
// restarted on an empty data directory), where a listing lacks what allocd still wants.
func (w *Writer[A]) follow(ctx context.Context) error {
	objs, rev, err := w.kind.List(ctx)
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	w.mu.Lock()
	for key := range w.desired {
		if _, ok := objs[key]; !ok {
			delete(w.desired, key)
		}
	}
	for key, obj := range objs {
		w.desired[key] = obj
		w.queue.Add(key)
	}
	w.synced = true
	w.mu.Unlock()
	w.log.Info("listed allocd's objects", "count", len(objs), "revision", rev)
	select {
	case w.sweepNow <- struct{}{}:
	default: // one is asked for already
	}
	err = w.kind.Watch(ctx, rev, func(key string, obj A, rev int64) {
		w.log.Debug("allocd changed", "key", key, "revision", rev)
		w.mu.Lock()
		w.desired[key] = obj
		w.mu.Unlock()
		w.queue.Add(key)
	})
	if errors.Is(err, client.ErrCompacted) {
		return fmt.Errorf("watch from %d: %w", rev, err)
	}
	return err
}

// sweeper sweeps after each listing and every SweepInterval until ctx ends; after a
// held sweep sooner, heldRetry doubling up to SweepInterval.
func (w *Writer[A]) sweeper(ctx context.Context) {
	t := time.NewTimer(w.SweepInterval)
	defer t.Stop()
	retry := min(w.heldRetry, w.SweepInterval)
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.sweepNow:
		case <-t.C:
		}
		err := w.sweepOnce()
		if err == nil {
			retry = min(w.heldRetry, w.SweepInterval)
			t.Reset(w.SweepInterval)
			continue
		}
		w.mu.Lock()
		swept := w.swept
		w.mu.Unlock()
		log := w.log.Warn
		if !swept {
			// At start: allocd has not yet computed what the bridge's feed gave it.
			log = w.log.Info
		}
		log("sweep of what allocd deleted held off; trying again", "error", err, "retry", retry)
		t.Reset(retry)
		retry = min(2*retry, w.SweepInterval)
	}
}

// sweepOnce, once allocd was listed, queues the deletion of every leftover of allocd's
// state as it now stands (its listing and the events since); a *ResetError, and
// nothing queued, when allocd looks reset.
func (w *Writer[A]) sweepOnce() error {
	w.mu.Lock()
	if !w.synced {
		w.mu.Unlock()
		return nil
	}
	listed := make(map[string]A, len(w.desired))
	var none A
	for key, obj := range w.desired {
		if obj != none {
			listed[key] = obj
		}
	}
	w.mu.Unlock()
	stale, err := w.kind.Leftovers(listed)
	if err != nil {
		w.m.swept(w.kind.Name(), "held")
		return err
	}
	w.mu.Lock()
	for _, key := range stale {
		if _, known := w.desired[key]; !known { // allocd has not made it meanwhile
			w.desired[key] = none
			w.queue.Add(key)
			if !w.swept {
				w.leftover[key] = true
			}
		}
	}
	w.swept = true
	w.mu.Unlock()
	w.m.swept(w.kind.Name(), "done")
	if len(stale) > 0 {
		w.log.Info("deleting the cluster's objects allocd does not hold (deleted while no bridge ran, "+
			"or left by kube-controller-manager)", "count", len(stale),
			"keys", stale[:min(len(stale), 10)])
	}
	return nil
}

// next syncs one key; false when the queue is shut down.
func (w *Writer[A]) next(ctx context.Context) bool {
	key, quit := w.queue.Get()
	if quit {
		return false
	}
	defer w.queue.Done(key)
	w.mu.Lock()
	obj, known := w.desired[key]
	w.mu.Unlock()
	if !known {
		w.queue.Forget(key)
		w.written(key)
		return true
	}
	start := time.Now()
	err := w.kind.Sync(ctx, key, obj)
	took := time.Since(start)
	w.m.observeSync(w.kind.Name(), took, err)
	w.log.Debug("synced", "key", key, "took", took, "error", err)
	switch {
	case err == nil:
		w.queue.Forget(key)
		var none A
		if obj == none {
			w.forgetDeleted(key)
		}
		w.written(key)
	case ctx.Err() != nil:
	default:
		w.log.Info("sync failed; retrying", "key", key, "error", err, "retries", w.queue.NumRequeues(key))
		w.queue.AddRateLimited(key)
	}
	return true
}

// written notes that key is as allocd wants it: no longer a leftover the writer's
// readiness waits for.
func (w *Writer[A]) written(key string) {
	w.mu.Lock()
	delete(w.leftover, key)
	w.mu.Unlock()
}

// forgetDeleted drops a key whose deletion is written, unless allocd has a new object
// for it since.
func (w *Writer[A]) forgetDeleted(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var none A
	if obj, ok := w.desired[key]; ok && obj == none {
		delete(w.desired, key)
	}
}

// Len is the number of keys waiting to be synced.
func (w *Writer[A]) Len() int { return w.queue.Len() }
