package feed

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// kind indexes the per-kind state of a Source.
type kind int

const (
	services kind = iota
	pods
	nodes
	kinds
)

func (k kind) String() string { return [...]string{"services", "pods", "nodes"}[k] }

// Source feeds allocd from a cluster: its informers' callbacks become the Feeder's
// events, their caches its snapshots. It is the Feeder's Lister.
//
// Snapshots are listed from the API server, not from the informers' caches: a list
// is exact at its resourceVersion, so an event the leader then ignores as not newer is
// one the snapshot holds, and a restarted bridge's snapshot is never older than what
// the bridge before it pushed (a Service deleted at revision N makes the leader's
// Service revision N, newer than every remaining Service's own resourceVersion).
type Source struct {
	log      *slog.Logger
	kube     kubernetes.Interface
	feeder   *client.Feeder
	informer [kinds]cache.SharedIndexInformer

	resyncs   atomic.Int64
	onService func(old, cur *corev1.Service)
	// seen is, per kind, the highest revision of a change handed to the Feeder (each
	// informer calls its handler from one goroutine).
	seen        [kinds]atomic.Int64
	loggedOrder atomic.Int64 // when inOrder last logged, Unix nanoseconds

	droppedN  *prometheus.CounterVec
	droppedMu sync.Mutex
	logged    map[string]bool // what was dropped and logged: object, field and value
}

// Option configures New.
type Option func(*Source)

// WithServiceHandler sets a function called with every Service change after the
// Feeder was told of it: (nil, s) for an add, (old, s) for an update, (s, nil) for a
// delete. It runs in the informer's goroutine.
func WithServiceHandler(f func(old, cur *corev1.Service)) Option {
	return func(s *Source) { s.onService = f }
}

// WithRegisterer registers the Source's metric on reg: allocd_bridge_feed_dropped_total,
// the values of the cluster's objects left out because allocd refuses them.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(s *Source) { reg.MustRegister(s.droppedN) }
}

// dropped logs (once per object, field and value) and counts a value left out.
func (s *Source) dropped(kind, object, field, value string) {
	s.droppedN.WithLabelValues(kind, field).Inc()
	key := object + " " + field + " " + value
	s.droppedMu.Lock()
	seen := s.logged[key]
	if !seen && len(s.logged) < 10000 {
		s.logged[key] = true
	}
	s.droppedMu.Unlock()
	if !seen {
		s.log.Warn("value allocd does not know left out of the feed", "kind", kind, "object", object,
			"field", field, "value", value)
	}
}

// New returns a Source over the Services and Pods informers of f (of the cluster kube),
// pushing to c through a Feeder made with fopts. Call it before f.Start: it registers its handlers.
func New(log *slog.Logger, kube kubernetes.Interface, f informers.SharedInformerFactory, c *client.Client,
	fopts []client.FeederOption, opts ...Option) (*Source, error) {
	s := &Source{log: log, kube: kube, onService: func(_, _ *corev1.Service) {}, logged: map[string]bool{},
		droppedN: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allocd_bridge_feed_dropped_total",
			Help: "Values of the cluster's objects left out of the feed because allocd does not know them.",
		}, []string{"kind", "field"})}
	for _, o := range opts {
		o(s)
	}
	pushed := client.WithPushed(func(n int, rev int64, took time.Duration) {
		s.log.Debug("pushed events", "count", n, "revision", rev, "took", took)
	})
	s.feeder = client.NewFeeder(c, s, append([]client.FeederOption{pushed}, fopts...)...)
	s.informer[services] = f.Core().V1().Services().Informer()
	s.informer[pods] = f.Core().V1().Pods().Informer()
	s.informer[nodes] = f.Core().V1().Nodes().Informer()
	for k := range kinds {
		inf := s.informer[k]
		if err := inf.SetTransform(dropManagedFields); err != nil {
			return nil, fmt.Errorf("feed: %s informer: %w", k, err)
		}
		// A watch that broke (expired, cut) is followed by a relist whose deletes
		// come as tombstones without their revision: snapshots cover them.
		if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			s.log.Info("watch ended; feeding snapshots again", "kind", k.String(), "error", err)
			s.resync()
		}); err != nil {
			return nil, fmt.Errorf("feed: %s informer: %w", k, err)
		}
		if _, err := inf.AddEventHandler(s.handler()); err != nil {
			return nil, fmt.Errorf("feed: %s informer: %w", k, err)
		}
	}
	return s, nil
}

// dropManagedFields keeps the informers' caches small: nothing here reads them.
func dropManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

func (s *Source) resync() {
	s.resyncs.Add(1)
	s.feeder.Resync()
}

// Resyncs is how many times the Source asked for snapshots after a broken watch, a
// tombstone, or a change older than one fed before.
func (s *Source) Resyncs() int64 { return s.resyncs.Load() }

func (s *Source) handler() cache.ResourceEventHandlerDetailedFuncs {
	return cache.ResourceEventHandlerDetailedFuncs{
		// The first list comes in no order, before the first snapshots: not checked.
		AddFunc:    func(obj any, initial bool) { s.upsert(nil, obj, !initial) },
		UpdateFunc: func(old, cur any) { s.upsert(old, cur, true) },
		DeleteFunc: s.remove,
	}
}

// upsert feeds an add or update; check says whether its revision order is checked.
func (s *Source) upsert(old, obj any, check bool) {
	changed := check
	if o, ok := old.(metav1.Object); ok {
		// An informer's periodic resync hands the same object again: not a change.
		changed = changed && o.GetResourceVersion() != obj.(metav1.Object).GetResourceVersion()
	}
	if m, ok := obj.(metav1.Object); ok && changed && s.log.Enabled(context.Background(), slog.LevelDebug) {
		s.log.Debug("fed", "object", m.GetNamespace()+"/"+m.GetName(), "revision", m.GetResourceVersion())
	}
	switch o := obj.(type) {
	case *corev1.Service:
		s.feeder.UpsertService(convertService(o, s.dropped), Revision(o))
		s.inOrder(services, o, changed)
		prev, _ := old.(*corev1.Service)
		s.onService(prev, o)
	case *corev1.Pod:
		s.feeder.UpsertPod(convertPod(o, s.dropped), Revision(o))
		s.inOrder(pods, o, changed)
	case *corev1.Node:
		s.feeder.UpsertNode(Node(o), Revision(o))
		s.inOrder(nodes, o, changed)
	}
}

// inOrder notes the revision of a change of kind k handed to the Feeder and asks for
// snapshots when it is older than one handed before. After a watch broke, the
// reflector relists and replays what changed meanwhile in name order, not revision
// order, and allocd ignores an event older than one it applied (a readiness flip would
// be lost until that Pod changes again): a snapshot listed now covers the change.
func (s *Source) inOrder(k kind, obj metav1.Object, changed bool) {
	rev := Revision(obj)
	if !changed || rev == 0 {
		return
	}
	if prev := s.seen[k].Load(); rev < prev {
		// One line a second at most: a relist replays many.
		if now := time.Now().UnixNano(); now-s.loggedOrder.Load() > int64(time.Second) {
			s.loggedOrder.Store(now)
			s.log.Info("change older than one fed already (an informer's relist); feeding snapshots again",
				"kind", k.String(), "object", obj.GetNamespace()+"/"+obj.GetName(), "revision", rev,
				"newest", prev)
		}
		s.resync()
		return
	}
	s.seen[k].Store(rev)
}

func (s *Source) remove(obj any) {
	switch o := obj.(type) {
	case *corev1.Service:
		s.feeder.DeleteService(o.Namespace, o.Name, Revision(o))
		s.inOrder(services, o, true)
		s.onService(o, nil)
	case *corev1.Pod:
		s.feeder.DeletePod(o.Namespace, o.Name, Revision(o))
		s.inOrder(pods, o, true)
	case *corev1.Node:
		s.feeder.DeleteNode(o.Name, Revision(o))
		s.inOrder(nodes, o, true)
	case cache.DeletedFinalStateUnknown:
		// The delete was missed (a relist found the object gone): its revision is
		// unknown, so an event could be ignored as old. A snapshot is exact.
		s.resync()
		if svc, ok := o.Obj.(*corev1.Service); ok {
			s.onService(svc, nil)
		}
	}
}

// ListServices lists every Service from the API server (the Feeder's Lister): a
// snapshot at the list's resourceVersion, exact whatever the informers' caches hold at
// the time (an informer's cache can be mid-relist, in no revision order) and never
// older than what an earlier bridge pushed.
func (s *Source) ListServices() ([]*allocdv1.Service, int64, error) {
	var out []*allocdv1.Service
	rev, err := listAll(func(ctx context.Context, opts metav1.ListOptions) (string, string, error) {
		l, err := s.kube.CoreV1().Services("").List(ctx, opts)
		if err != nil {
			return "", "", err
		}
		for i := range l.Items {
			out = append(out, convertService(&l.Items[i], s.dropped))
		}
		return l.ResourceVersion, l.Continue, nil
	})
	return out, rev, err
}

// ListPods lists every Pod from the API server (the Feeder's Lister), as ListServices.
func (s *Source) ListPods() ([]*allocdv1.Pod, int64, error) {
	var out []*allocdv1.Pod
	rev, err := listAll(func(ctx context.Context, opts metav1.ListOptions) (string, string, error) {
		l, err := s.kube.CoreV1().Pods("").List(ctx, opts)
		if err != nil {
			return "", "", err
		}
		for i := range l.Items {
			out = append(out, convertPod(&l.Items[i], s.dropped))
		}
		return l.ResourceVersion, l.Continue, nil
	})
	return out, rev, err
}

// ListNodes lists every Node from the API server (the Feeder's Lister), as ListServices.
func (s *Source) ListNodes() ([]*allocdv1.Node, int64, error) {
	var out []*allocdv1.Node
	rev, err := listAll(func(ctx context.Context, opts metav1.ListOptions) (string, string, error) {
		l, err := s.kube.CoreV1().Nodes().List(ctx, opts)
		if err != nil {
			return "", "", err
		}
		for i := range l.Items {
			out = append(out, Node(&l.Items[i]))
		}
		return l.ResourceVersion, l.Continue, nil
	})
	return out, rev, err
}

// listAll pages through a list (every page at the first's resourceVersion), within
// two minutes (the Lister interface has no context), and returns that resourceVersion
// as a revision.
func listAll(page func(context.Context, metav1.ListOptions) (rv, cont string, err error)) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := metav1.ListOptions{Limit: 500}
	var first string
	for {
		rv, cont, err := page(ctx, opts)
		if err != nil {
			return 0, fmt.Errorf("feed: list: %w", err)
		}
		if first == "" {
			first = rv
		}
		if cont == "" {
			break
		}
		opts.Continue = cont
	}
	rev, err := strconv.ParseInt(first, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("feed: list resourceVersion %q: %w", first, err)
	}
	return rev, nil
}

// HasSynced reports whether the informers have their initial lists.
func (s *Source) HasSynced() bool {
	for _, inf := range s.informer {
		if !inf.HasSynced() {
			return false
		}
	}
	return true
}

// Run waits for the informers' caches (started by the caller's factory), then feeds
// allocd until ctx ends: snapshots first, then events in order, and snapshots again
// whenever a watch breaks, a delete is seen as a tombstone, or allocd asks for them.
func (s *Source) Run(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), s.HasSynced) {
		return ctx.Err()
	}
	s.log.Info("informers synced; feeding allocd")
	return s.feeder.Run(ctx)
}
