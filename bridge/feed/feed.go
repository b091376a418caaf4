package feed

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// kind indexes the per-kind state of a Source.
type kind int

const (
	services kind = iota
	pods
	kinds
)

func (k kind) String() string { return [...]string{"services", "pods"}[k] }

// Source feeds allocd from a cluster: its informers' callbacks become the Feeder's
// events, their caches its snapshots. It is the Feeder's Lister.
//
// The revision of a snapshot of a kind is the highest resourceVersion the Source has
// handed to the Feeder for that kind: every change up to it is in the informer's cache
// (an informer updates its cache before it calls the handlers), so an event the leader
// then ignores as not newer is one the snapshot holds. It never goes down, so that a
// snapshot after a delete of the newest object is not refused as stale.
type Source struct {
	log      *slog.Logger
	feeder   *client.Feeder
	informer [kinds]cache.SharedIndexInformer

	mu   sync.Mutex
	seen [kinds]int64

	resyncs atomic.Int64
	// OnEvent, when set before Run, is called after each event handed to the Feeder
	// (adoption follows Services through it).
	onService func(old, cur *corev1.Service)
}

// Option configures New.
type Option func(*Source)

// WithServiceHandler sets a function called with every Service change after the
// Feeder was told of it: (nil, s) for an add, (old, s) for an update, (s, nil) for a
// delete. It runs in the informer's goroutine.
func WithServiceHandler(f func(old, cur *corev1.Service)) Option {
	return func(s *Source) { s.onService = f }
}

// New returns a Source over the Services and Pods informers of f, pushing to c through
// a Feeder made with fopts. Call it before f.Start: it registers its handlers.
func New(log *slog.Logger, f informers.SharedInformerFactory, c *client.Client, fopts []client.FeederOption,
	opts ...Option) (*Source, error) {
	s := &Source{log: log, onService: func(_, _ *corev1.Service) {}}
	for _, o := range opts {
		o(s)
	}
	s.feeder = client.NewFeeder(c, s, fopts...)
	s.informer[services] = f.Core().V1().Services().Informer()
	s.informer[pods] = f.Core().V1().Pods().Informer()
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
		if _, err := inf.AddEventHandler(s.handler(k)); err != nil {
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

// Resyncs is how many times the Source asked for snapshots after a broken watch or a
// tombstone.
func (s *Source) Resyncs() int64 { return s.resyncs.Load() }

func (s *Source) handler(k kind) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.upsert(k, nil, obj) },
		UpdateFunc: func(old, cur any) { s.upsert(k, old, cur) },
		DeleteFunc: func(obj any) { s.remove(k, obj) },
	}
}

// saw records rev as handed to the Feeder for k.
func (s *Source) saw(k kind, rev int64) {
	s.mu.Lock()
	s.seen[k] = max(s.seen[k], rev)
	s.mu.Unlock()
}

func (s *Source) upsert(k kind, old, obj any) {
	switch o := obj.(type) {
	case *corev1.Service:
		rev := Revision(o)
		s.feeder.UpsertService(Service(o), rev)
		s.saw(k, rev)
		prev, _ := old.(*corev1.Service)
		s.onService(prev, o)
	case *corev1.Pod:
		rev := Revision(o)
		s.feeder.UpsertPod(Pod(o), rev)
		s.saw(k, rev)
	}
}

func (s *Source) remove(k kind, obj any) {
	switch o := obj.(type) {
	case *corev1.Service:
		rev := Revision(o)
		s.feeder.DeleteService(o.Namespace, o.Name, rev)
		s.saw(k, rev)
		s.onService(o, nil)
	case *corev1.Pod:
		rev := Revision(o)
		s.feeder.DeletePod(o.Namespace, o.Name, rev)
		s.saw(k, rev)
	case cache.DeletedFinalStateUnknown:
		// The delete was missed (a relist found the object gone): its revision is
		// unknown, so an event could be ignored as old. A snapshot is exact.
		s.resync()
		if svc, ok := o.Obj.(*corev1.Service); ok {
			s.onService(svc, nil)
		}
	}
}

// ListServices lists the Services of the informer's cache (the Feeder's Lister).
func (s *Source) ListServices() ([]*allocdv1.Service, int64, error) {
	rev := s.revision(services)
	objs := s.informer[services].GetStore().List()
	out := make([]*allocdv1.Service, 0, len(objs))
	for _, o := range objs {
		out = append(out, Service(o.(*corev1.Service)))
	}
	return out, rev, nil
}

// ListPods lists the Pods of the informer's cache (the Feeder's Lister).
func (s *Source) ListPods() ([]*allocdv1.Pod, int64, error) {
	rev := s.revision(pods)
	objs := s.informer[pods].GetStore().List()
	out := make([]*allocdv1.Pod, 0, len(objs))
	for _, o := range objs {
		out = append(out, Pod(o.(*corev1.Pod)))
	}
	return out, rev, nil
}

// revision is the revision of a snapshot of k taken now. Read before the listing: the
// cache then holds at least every change up to it. With no object seen yet it is the
// informer's list revision.
func (s *Source) revision(k kind) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen[k] == 0 {
		if rv, err := strconv.ParseInt(s.informer[k].LastSyncResourceVersion(), 10, 64); err == nil {
			s.seen[k] = rv
		}
	}
	return max(s.seen[k], 1)
}

// HasSynced reports whether both informers have their initial lists.
func (s *Source) HasSynced() bool {
	return s.informer[services].HasSynced() && s.informer[pods].HasSynced()
}

// Run waits for the informers' caches (started by the caller's factory), then feeds
// allocd until ctx ends: snapshots first, then events in order, and snapshots again
// whenever a watch breaks, a delete is seen as a tombstone, or allocd asks for them.
func (s *Source) Run(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), s.informer[services].HasSynced, s.informer[pods].HasSynced) {
		return ctx.Err()
	}
	s.log.Info("informers synced; feeding allocd")
	return s.feeder.Run(ctx)
}
