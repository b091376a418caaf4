package adopt

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Controller keeps allocd's allocations in step with the cluster's Services: every
// Service is adopted once the informer has synced and again whenever its addresses or
// ports change; a deleted Service's allocations are released. A failure (allocd
// unreachable, a conflict standing) is retried with backoff up to 5 minutes.
type Controller struct {
	a       *Adopter
	log     *slog.Logger
	store   cache.Store
	workers int
	queue   workqueue.TypedRateLimitingInterface[string]

	mu   sync.Mutex
	uids map[string]string // key → UID adopted, for releasing after a delete
}

// NewController returns a Controller of the Services in store (an informer's), run by
// workers workers.
func NewController(a *Adopter, log *slog.Logger, store cache.Store, workers int) *Controller {
	return &Controller{a: a, log: log, store: store, workers: max(workers, 1), uids: map[string]string{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 5*time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "adopt"})}
}

// ServiceChanged is the feed's Service handler: (nil, s) add, (old, s) update, (s, nil)
// delete. Updates that change no address or port are not queued.
func (c *Controller) ServiceChanged(old, cur *corev1.Service) {
	s := cur
	if s == nil {
		s = old
	}
	if old != nil && cur != nil && old.UID == cur.UID && sameWants(serviceWants(old), serviceWants(cur)) {
		return
	}
	c.mu.Lock()
	if old != nil && cur == nil {
		if _, ok := c.uids[key(s)]; !ok {
			c.uids[key(s)] = string(s.UID)
		}
	}
	c.mu.Unlock()
	c.queue.Add(key(s))
}

func key(s *corev1.Service) string { return s.Namespace + "/" + s.Name }

func sameWants(a, b wants) bool {
	return slices.Equal(a.ips, b.ips) && slices.Equal(a.ports, b.ports)
}

// Run syncs until ctx ends; the caller has started the informer.
func (c *Controller) Run(ctx context.Context, synced cache.InformerSynced) error {
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), synced) {
		return nil
	}
	var wg sync.WaitGroup
	for range c.workers {
		wg.Go(func() {
			for c.next(ctx) {
			}
		})
	}
	wg.Wait()
	return nil
}

func (c *Controller) next(ctx context.Context) bool {
	k, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(k)
	err := c.sync(ctx, k)
	if err != nil && ctx.Err() == nil {
		c.log.Info("adoption failed; retrying", "service", k, "error", err)
		c.queue.AddRateLimited(k)
		return true
	}
	c.queue.Forget(k)
	return true
}

func (c *Controller) sync(ctx context.Context, k string) error {
	obj, exists, err := c.store.GetByKey(k)
	if err != nil {
		return err
	}
	c.mu.Lock()
	prevUID, had := c.uids[k]
	c.mu.Unlock()
	var s *corev1.Service
	if exists {
		s = obj.(*corev1.Service)
	}
	if had && (s == nil || string(s.UID) != prevUID) {
		ns, name, _ := cache.SplitMetaNamespaceKey(k)
		if err := c.a.Deleted(ctx, ns, name, prevUID); err != nil {
			return err
		}
		c.mu.Lock()
		if c.uids[k] == prevUID {
			delete(c.uids, k)
		}
		c.mu.Unlock()
	}
	if s == nil {
		return nil
	}
	res, err := c.a.Service(ctx, s)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.uids[k] = string(s.UID)
	c.mu.Unlock()
	if len(res.Adopted)+len(res.Released) > 0 {
		c.log.Info("allocations adopted", "service", k, "uid", s.UID, "adopted", res.Adopted, "released", res.Released)
	}
	if len(res.Conflicts) > 0 {
		return errConflicts
	}
	return nil
}

// errConflicts makes a Service with conflicts be looked at again later: the holder may
// have let go.
var errConflicts = conflictError("some of the Service's addresses or ports are held by another owner in allocd")

type conflictError string

func (e conflictError) Error() string { return string(e) }
