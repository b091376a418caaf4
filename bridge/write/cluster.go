package write

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/listers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// ClusterObject is an object of the cluster a writer writes: *corev1.Endpoints or
// *discoveryv1.EndpointSlice.
type ClusterObject interface {
	comparable
	metav1.Object
	runtime.Object
}

// clusterAPI is the typed client of one kind of object in one namespace (client-go's
// EndpointsInterface and EndpointSliceInterface have these methods).
type clusterAPI[C ClusterObject] interface {
	Create(ctx context.Context, obj C, opts metav1.CreateOptions) (C, error)
	Update(ctx context.Context, obj C, opts metav1.UpdateOptions) (C, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
	Get(ctx context.Context, name string, opts metav1.GetOptions) (C, error)
}

// rules are what the kinds differ in when the cluster's object is written over.
type rules[C ClusterObject] interface {
	// service is namespace/name of the Service of one of the cluster's objects.
	service(obj C) string
	// managed reports whether obj carries the managed-by label the bridge writes: only
	// such an object is deleted.
	managed(obj C) bool
	// prepare returns desired as it is written over cur (what cur holds that others
	// own kept), or an error when cur must not be written over.
	prepare(cur, desired C) (C, error)
	// match reports whether cur already says what desired says: no write.
	match(cur, desired C) bool
	// merge returns the object that an update writes: cur with desired's content.
	merge(cur, desired C) C
	// immutable names the immutable field next changes of cur ("" when none): an
	// update refused as invalid then deletes cur, to be created again.
	immutable(cur, next C) string
}

// clusterKind is the cluster's objects of one kind as a writer reads and writes them
// (A is allocd's object of the kind, C the cluster's): the kind's informer (its store is
// what a sync compares against), the Services' informer, the object written last per
// key, and the one loop of create, update and delete that both kinds write through,
// their differences in rules.
type clusterKind[A Object, C ClusterObject] struct {
	name   string // the kind in metrics
	object func(A) C
	inf    cache.SharedIndexInformer
	store  listers.ResourceIndexer[C]
	svcs   cache.SharedIndexInformer
	svc    corelisters.ServiceLister
	api    func(namespace string) clusterAPI[C]
	rules  rules[C]
	m      *Metrics
	last   *lastWritten[C]
}

// newClusterKind returns the clusterKind of the objects of inf (resource res), written
// through api; object makes the cluster's object of one of allocd's.
func newClusterKind[A Object, C ClusterObject](name string, inf, svcs cache.SharedIndexInformer,
	res schema.GroupResource, api func(string) clusterAPI[C], object func(A) C, r rules[C],
	m *Metrics) *clusterKind[A, C] {
	return &clusterKind[A, C]{name: name, object: object, inf: inf,
		store: listers.New[C](inf.GetIndexer(), res), svcs: svcs,
		svc: corelisters.NewServiceLister(svcs.GetIndexer()), api: api, rules: r, m: m,
		last: newLastWritten[C]()}
}

// Informer is the informer of the kind's cluster objects: a change there that someone
// else made is put right.
func (k *clusterKind[A, C]) Informer() cache.SharedIndexInformer { return k.inf }

// Services is the informer of the cluster's Services the kind reads.
func (k *clusterKind[A, C]) Services() cache.SharedIndexInformer { return k.svcs }

// Forget drops the object written last of key: the informer saw it deleted.
func (k *clusterKind[A, C]) Forget(key string) { k.last.forget(key) }

// cached is the informer's object of key (ok false when it has none).
func (k *clusterKind[A, C]) cached(key string) (obj C, ok bool) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return obj, false
	}
	obj, err = listers.NewNamespaced(k.store, ns).Get(name)
	return obj, err == nil
}

// cachedAll is every object in the informer's store.
func (k *clusterKind[A, C]) cachedAll() []C {
	objs, _ := k.store.List(labels.Everything()) // a store's listing does not fail
	return objs
}

// current is the newest state of key known: the informer's, or the one written last
// when the informer has not caught up with it yet; the zero C when there is none.
func (k *clusterKind[A, C]) current(key string) C {
	cached, _ := k.cached(key)
	return k.last.newer(key, cached)
}

// leftAlone reports whether the objects of the Service namespace/name are not the
// bridge's to write: the Service exists without a selector (its objects are kept by
// someone else, as upstream's controllers leave them; allocd keeps its last computed
// object, which must not be written over theirs). The kubernetes Service, whose
// Endpoints the bridge writes from master leases when asked to, is not left alone.
func (k *clusterKind[A, C]) leftAlone(key string) bool {
	if key == kubernetesKey {
		return false
	}
	s, ok := k.service(key)
	return ok && s.Spec.Selector == nil
}

// service is the cluster's Service namespace/name, ok false when there is none.
func (k *clusterKind[A, C]) service(key string) (*corev1.Service, bool) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil, false
	}
	s, err := k.svc.Services(ns).Get(name)
	return s, err == nil
}

// Sync implements Kind: it makes the cluster's object of key what allocd's obj says;
// obj nil means that allocd holds none: the cluster's is deleted only when allocd's
// controller manages it. The objects of a Service that exists without a selector are
// left alone.
func (k *clusterKind[A, C]) Sync(ctx context.Context, key string, obj A) error {
	if _, _, err := cache.SplitMetaNamespaceKey(key); err != nil {
		return nil // not a key a writer made
	}
	var deleted A // allocd holds none
	var desired, none C
	if obj != deleted {
		desired = k.object(obj)
	}
	cur := k.current(key)
	if desired == none {
		if cur == none || k.leftAlone(k.rules.service(cur)) || !k.rules.managed(cur) {
			return nil
		}
		return k.remove(ctx, key, cur)
	}
	if k.leftAlone(k.rules.service(desired)) {
		return nil
	}
	if cur == none {
		return k.create(ctx, key, desired)
	}
	return k.update(ctx, key, cur, desired)
}

// create creates desired, or updates what is there when the cache lagged.
func (k *clusterKind[A, C]) create(ctx context.Context, key string, desired C) error {
	api := k.api(desired.GetNamespace())
	created, err := api.Create(ctx, desired, metav1.CreateOptions{})
	switch {
	case err == nil:
		k.wrote("create", key, created)
		return nil
	case apierrors.IsAlreadyExists(err):
		// The cache lags: update what is there.
		cur, err := api.Get(ctx, desired.GetName(), metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get %s: %w", key, err)
		}
		return k.update(ctx, key, cur, desired)
	case namespaceGone(err):
		return nil // as kube-controller-manager: the namespace is going away
	default:
		return fmt.Errorf("create %s: %w", key, err)
	}
}

// update writes desired over cur unless they already match; on a conflict it reads the
// object again and tries once more before giving the key back to the queue. An object
// deleted meanwhile is forgotten and created (once: the next try reads it again). An
// update that changes an immutable field deletes cur: the next try creates it again.
func (k *clusterKind[A, C]) update(ctx context.Context, key string, cur, desired C) error {
	api := k.api(cur.GetNamespace())
	for attempt := 0; ; attempt++ {
		want, err := k.rules.prepare(cur, desired)
		if err != nil {
			return fmt.Errorf("update %s: %w", key, err)
		}
		if k.rules.match(cur, want) {
			return nil
		}
		next := k.rules.merge(cur, want)
		updated, err := api.Update(ctx, next, metav1.UpdateOptions{})
		switch {
		case err == nil:
			k.wrote("update", key, updated)
			return nil
		case apierrors.IsNotFound(err) && attempt == 0:
			k.last.forget(key)
			created, err := api.Create(ctx, want, metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("update %s: deleted meanwhile; create: %w", key, err)
			}
			k.wrote("create", key, created)
			return nil
		case apierrors.IsConflict(err) && attempt == 0:
			if cur, err = api.Get(ctx, cur.GetName(), metav1.GetOptions{}); err != nil {
				if apierrors.IsNotFound(err) {
					k.last.forget(key)
				}
				return fmt.Errorf("get %s: %w", key, err)
			}
		case apierrors.IsInvalid(err) && k.rules.immutable(cur, next) != "":
			if err := k.delete(ctx, cur); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete %s to change its %s: %w", key, k.rules.immutable(cur, next), err)
			}
			k.last.forget(key)
			return fmt.Errorf("update %s: %s changed; created again next", key, k.rules.immutable(cur, next))
		default:
			return fmt.Errorf("update %s: %w", key, err)
		}
	}
}

// wrote counts a write of verb and keeps obj, its answer, as key's object written last.
func (k *clusterKind[A, C]) wrote(verb, key string, obj C) {
	k.m.Wrote(k.name, verb)
	k.last.put(key, obj)
}

// remove deletes cur, allocd having deleted its object.
func (k *clusterKind[A, C]) remove(ctx context.Context, key string, cur C) error {
	err := k.delete(ctx, cur)
	switch {
	case err == nil:
		k.m.Wrote(k.name, "delete")
		k.last.forget(key)
		return nil
	case apierrors.IsNotFound(err):
		k.last.forget(key)
		return nil
	default:
		// A conflict: the object changed; the next try judges it again.
		return fmt.Errorf("delete %s: %w", key, err)
	}
}

// delete deletes cur with its UID and resourceVersion as preconditions.
func (k *clusterKind[A, C]) delete(ctx context.Context, cur C) error {
	uid, rv := cur.GetUID(), cur.GetResourceVersion()
	return k.api(cur.GetNamespace()).Delete(ctx, cur.GetName(),
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
}

// namespaceGone is a create refused because the namespace is terminating or absent.
func namespaceGone(err error) bool {
	return apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) ||
		(apierrors.IsNotFound(err) && apiStatusKind(err) == "namespaces")
}

func apiStatusKind(err error) string {
	if s, ok := err.(apierrors.APIStatus); ok && s.Status().Details != nil {
		return s.Status().Details.Kind
	}
	return ""
}
