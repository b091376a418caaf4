package adopt

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Controller keeps allocd's allocations in step with the cluster's Services: every
// Service is adopted once the informer has synced and again whenever its addresses or
// ports change; a deleted Service's allocations are released. Each address and port is
// adopted on its own: one that fails (a conflict standing, a ClusterIP outside allocd's
// ranges, allocd unreachable) is reported and retried with backoff up to 5 minutes,
// the others adopted. SyncCIDRs makes allocd's ServiceCIDRs follow the cluster's
// beside it, as they change (ServiceCIDRChanged).
type Controller struct {
	a       *Adopter
	log     *slog.Logger
	store   cache.Store
	workers int
	queue   workqueue.TypedRateLimitingInterface[string]
	cidrErr prometheus.Counter

	cidrKick chan struct{} // a ServiceCIDR of the cluster changed

	mu sync.Mutex
	// goneCIDRs are ServiceCIDRs deleted from the cluster, not yet deleted in allocd.
	goneCIDRs map[string]*networkingv1.ServiceCIDR
	uids      map[string]string // key → UID adopted, for releasing after a delete
	// initial are the Services of the first listing not tried yet; nil before it.
	initial map[string]bool
	ran     bool // every Service of the first listing was tried once
}

// NewController returns a Controller of the Services in store (an informer's), run by
// workers workers.
func NewController(a *Adopter, log *slog.Logger, store cache.Store, workers int) *Controller {
	return &Controller{a: a, log: log, store: store, workers: max(workers, 1), uids: map[string]string{},
		cidrKick: make(chan struct{}, 1), goneCIDRs: map[string]*networkingv1.ServiceCIDR{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 5*time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "adopt"}),
		cidrErr: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "allocd_bridge_servicecidr_sync_failures_total",
			Help: "Syncs of the cluster's ServiceCIDRs into allocd that failed or found a conflict.",
		})}
}

// Register registers the Controller's metrics on reg: the failed ServiceCIDR syncs, the
// conflicts and failures standing, and the admission webhook's allocations bound to
// their Service and freed (by the Controller and the Sweeper of its Adopter).
func (c *Controller) Register(reg prometheus.Registerer) error {
	conflicts := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "allocd_bridge_adoption_conflicts",
		Help: "Addresses and ports the cluster's Services hold that allocd gives to another owner.",
	}, func() float64 { return float64(len(c.a.Conflicts())) })
	failures := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "allocd_bridge_adoption_failures",
		Help: "Addresses and ports the cluster's Services hold that could not be adopted (retried).",
	}, func() float64 { return float64(len(c.a.Failures())) })
	for _, m := range []prometheus.Collector{c.cidrErr, conflicts, failures, c.a.bound, c.a.freed} {
		if err := reg.Register(m); err != nil {
			return err
		}
	}
	return nil
}

// Ran reports whether every Service the informer listed first was tried once (adopted,
// or its conflicts and failures reported): the bridge's readiness.
func (c *Controller) Ran() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ran
}

// cidrRetryMin is the first wait before a failed sync of the ServiceCIDRs is tried
// again; the wait doubles up to the interval of SyncCIDRs.
const cidrRetryMin = time.Second

// ServiceCIDRChanged is the handler of the cluster's ServiceCIDR informer: (nil, sc)
// add, (old, sc) update, (sc, nil) delete. Each change makes SyncCIDRs sync at once. A
// ServiceCIDR gone from the cluster is remembered as being deleted until a sync has
// deleted it in allocd, in case its deletion's first step (its deletionTimestamp) was
// not seen.
func (c *Controller) ServiceCIDRChanged(old, cur *networkingv1.ServiceCIDR) {
	c.mu.Lock()
	switch {
	case cur == nil && old != nil:
		gone := old.DeepCopy()
		if gone.DeletionTimestamp == nil {
			now := metav1.Now()
			gone.DeletionTimestamp = &now
		}
		c.goneCIDRs[gone.Name] = gone
	case cur != nil:
		delete(c.goneCIDRs, cur.Name)
	}
	c.mu.Unlock()
	select {
	case c.cidrKick <- struct{}{}:
	default:
	}
}

// SyncCIDRs makes allocd's ServiceCIDRs follow the cluster's (Adopter.ServiceCIDRs;
// list returns the cluster's, an informer's store): now, at once after each change
// (ServiceCIDRChanged), and every interval. A failure (a ServiceCIDR of another range
// in allocd, allocd unreachable) is logged and counted and tried again after a second,
// then after waits that double up to the interval; it never holds adoption up. When a
// ServiceCIDR was created, the Services with failures standing are tried again at once.
func (c *Controller) SyncCIDRs(ctx context.Context,
	list func(context.Context) ([]networkingv1.ServiceCIDR, error), interval time.Duration) {
	t := time.NewTimer(0)
	defer t.Stop()
	wait := cidrRetryMin
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.cidrKick:
		}
		err := c.syncCIDRs(ctx, list)
		if ctx.Err() != nil {
			return
		}
		next := interval
		if err != nil {
			next, wait = min(wait, interval), min(2*wait, interval)
			c.cidrErr.Inc()
			c.log.Warn("ServiceCIDRs not all synced into allocd; trying again", "error", err, "retry", next)
		} else {
			wait = cidrRetryMin
		}
		t.Stop()
		t.Reset(next)
	}
}

// syncCIDRs is one sync: the cluster's ServiceCIDRs and those gone from it.
func (c *Controller) syncCIDRs(ctx context.Context,
	list func(context.Context) ([]networkingv1.ServiceCIDR, error)) error {
	cidrs, err := list(ctx)
	if err != nil {
		return err
	}
	c.mu.Lock()
	gone := map[string]*networkingv1.ServiceCIDR{}
	for name, sc := range c.goneCIDRs {
		if !slices.ContainsFunc(cidrs, func(x networkingv1.ServiceCIDR) bool { return x.Name == name }) {
			gone[name] = sc
			cidrs = append(cidrs, *sc)
		}
	}
	c.mu.Unlock()
	res, err := c.a.ServiceCIDRs(ctx, cidrs)
	c.mu.Lock()
	for name, sc := range gone {
		if c.goneCIDRs[name] == sc && !slices.Contains(res.Failed, name) {
			delete(c.goneCIDRs, name)
		}
	}
	c.mu.Unlock()
	if len(res.Deleted) > 0 {
		c.log.Info("ServiceCIDRs deleted in allocd: the cluster is deleting them", "deleted", res.Deleted)
	}
	if len(res.Created) > 0 {
		c.log.Info("ServiceCIDRs created in allocd", "created", res.Created)
		for _, f := range c.a.Failures() {
			c.queue.Add(f.Service)
		}
	}
	return err
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
	c.mu.Lock()
	c.initial = map[string]bool{}
	for _, k := range c.store.ListKeys() {
		c.initial[k] = true
	}
	c.ran = len(c.initial) == 0
	c.mu.Unlock()
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
	if ctx.Err() == nil {
		c.tried(k)
	}
	if err != nil && ctx.Err() == nil {
		c.log.Info("adoption failed; retrying", "service", k, "error", err)
		c.queue.AddRateLimited(k)
		return true
	}
	c.queue.Forget(k)
	return true
}

// tried marks k as tried once since the first listing.
func (c *Controller) tried(k string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.initial == nil || c.ran {
		return
	}
	delete(c.initial, k)
	if len(c.initial) == 0 {
		c.ran = true
		c.log.Info("adoption ran over every Service", "conflicts", len(c.a.Conflicts()),
			"failures", len(c.a.Failures()))
	}
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
	if len(res.Adopted)+len(res.Released)+len(res.Bound) > 0 {
		c.log.Info("allocations adopted", "service", k, "uid", s.UID, "adopted", res.Adopted,
			"bound", res.Bound, "released", res.Released)
	}
	if len(res.Conflicts)+len(res.Failed) > 0 {
		return errConflicts
	}
	return nil
}

// errConflicts makes a Service with conflicts or failures be looked at again later: the
// holder may have let go, the range may have come.
var errConflicts = conflictError("some of the Service's addresses or ports are held by another owner in " +
	"allocd or could not be adopted")

type conflictError string

func (e conflictError) Error() string { return string(e) }
