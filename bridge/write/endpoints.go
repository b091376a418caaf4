package write

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// Labels and annotations of Endpoints, as Kubernetes spells them.
const (
	// LabelManagedBy is the label kube-controller-manager's endpoint controller puts
	// on every Endpoints it writes.
	LabelManagedBy = "endpoints.kubernetes.io/managed-by"
	// EndpointController is LabelManagedBy's value.
	EndpointController = "endpoint-controller"
	// AnnotationTriggerTime is endpoints.kubernetes.io/last-change-trigger-time.
	AnnotationTriggerTime = corev1.EndpointsLastChangeTriggerTime
	// AnnotationOverCapacity is endpoints.kubernetes.io/over-capacity.
	AnnotationOverCapacity = corev1.EndpointsOverCapacity
)

// managedAnnotations are the annotations allocd owns on an Endpoints; others are kept,
// as kube-controller-manager keeps them.
var managedAnnotations = []string{AnnotationTriggerTime, AnnotationOverCapacity}

// Endpoints writes the Endpoints allocd computes into the cluster.
type Endpoints struct {
	c    *client.Client
	kube kubernetes.Interface
	inf  cache.SharedIndexInformer
	svcs cache.SharedIndexInformer
	m    *Metrics
	last *lastWritten[*corev1.Endpoints]
	// kubernetes: default/kubernetes is written too (from allocd's master leases).
	kubernetes bool
}

// kubernetesKey is the Service whose Endpoints kube-apiserver writes, unless it runs
// with --endpoint-reconciler-type=none and allocd's master leases stand in.
const kubernetesKey = "default/kubernetes"

// NewEndpoints returns the Endpoints kind over c (allocd) and kube (the cluster); its
// informer comes from f. With kubernetesSvc the Endpoints of default/kubernetes that
// allocd's master leases produce are written too; without, they are left to
// kube-apiserver.
func NewEndpoints(c *client.Client, kube kubernetes.Interface, f informers.SharedInformerFactory, m *Metrics,
	kubernetesSvc bool) *Endpoints {
	inf := f.Core().V1().Endpoints().Informer()
	_ = inf.SetTransform(dropManagedFields) // fails only once started
	return &Endpoints{c: c, kube: kube, inf: inf, svcs: f.Core().V1().Services().Informer(), m: m,
		last: newLastWritten[*corev1.Endpoints](), kubernetes: kubernetesSvc}
}

func (e *Endpoints) skip(key string) bool { return key == kubernetesKey && !e.kubernetes }

// Name implements Kind.
func (*Endpoints) Name() string { return "endpoints" }

// Informer implements Kind.
func (e *Endpoints) Informer() cache.SharedIndexInformer { return e.inf }

// Forget implements Kind.
func (e *Endpoints) Forget(key string) { e.last.forget(key) }

// HasSynced implements Kind.
func (e *Endpoints) HasSynced() bool { return e.inf.HasSynced() && e.svcs.HasSynced() }

// Leftovers implements Kind: the Endpoints labelled by the endpoint controller that
// allocd lacks, of a Service that is gone (kube-controller-manager's
// checkLeftoverEndpoints; allocd always holds the Endpoints of a Service with a
// selector, so lacking one of those means allocd looks reset).
func (e *Endpoints) Leftovers(listed map[string]any) ([]string, error) {
	return leftovers(e.inf.GetStore().List(), func(o any) clusterObject {
		ep := o.(*corev1.Endpoints)
		key := ep.Namespace + "/" + ep.Name
		return clusterObject{key: key, service: key, managed: ep.Labels[LabelManagedBy] == EndpointController}
	}, e.svcs.GetStore(), listed, e.ServiceOf)
}

// Services implements Kind.
func (e *Endpoints) Services() cache.SharedIndexInformer { return e.svcs }

// ServiceOf implements Kind: an Endpoints object is its Service's namesake.
func (*Endpoints) ServiceOf(o any) string {
	ep := o.(*allocdv1.ServiceEndpoints)
	return ep.GetNamespace() + "/" + ep.GetName()
}

// List implements Kind: every Endpoints allocd stores, paged, read at one revision.
func (e *Endpoints) List(ctx context.Context) (map[string]any, int64, error) {
	req := &allocdv1.ListServiceEndpointsRequest{PageSize: 5000}
	list := func(ctx context.Context) (*allocdv1.ListServiceEndpointsResponse, error) {
		return e.c.ListServiceEndpoints(ctx, req)
	}
	return listAll(ctx, &req.PageToken, list, (*allocdv1.ListServiceEndpointsResponse).GetEndpoints,
		func(_ *allocdv1.ServiceEndpoints, key string) bool { return !e.skip(key) })
}

// listAll reads every page of one of allocd's listings (list reads the page of *token,
// items its objects), read at the first page's revision, into a map by namespace/name
// of the objects keep keeps; it returns the revision.
func listAll[R interface {
	GetRevision() int64
	GetNextPageToken() string
}, T interface {
	GetNamespace() string
	GetName() string
}](ctx context.Context, token *string, list func(context.Context) (R, error), items func(R) []T,
	keep func(obj T, key string) bool) (map[string]any, int64, error) {
	out := map[string]any{}
	var rev int64
	for {
		resp, err := list(ctx)
		if err != nil {
			return nil, 0, err
		}
		if rev == 0 {
			rev = resp.GetRevision()
		}
		for _, o := range items(resp) {
			if key := o.GetNamespace() + "/" + o.GetName(); keep(o, key) {
				out[key] = o
			}
		}
		if *token = resp.GetNextPageToken(); *token == "" {
			return out, rev, nil
		}
	}
}

// Watch implements Kind.
func (e *Endpoints) Watch(ctx context.Context, rev int64, fn func(string, any, int64)) error {
	return e.c.WatchServiceEndpoints(ctx, &allocdv1.WatchServiceEndpointsRequest{StartRevision: rev},
		func(r *allocdv1.WatchServiceEndpointsResponse) error {
			ep := r.GetEndpoints()
			key := ep.GetNamespace() + "/" + ep.GetName()
			if e.skip(key) {
				return nil
			}
			if r.GetType() == allocdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED {
				fn(key, nil, r.GetRevision())
			} else {
				fn(key, ep, r.GetRevision())
			}
			return nil
		})
}

// Sync implements Kind. The Endpoints of a Service that exists without a selector are
// left alone (not created, updated or deleted), as kube-controller-manager's syncService
// leaves them: allocd keeps its last object of such a Service, which must not be written
// over the one its user keeps.
func (e *Endpoints) Sync(ctx context.Context, key string, obj any) error {
	if _, _, err := cache.SplitMetaNamespaceKey(key); err != nil {
		return nil // not a key this writer made
	}
	if leftAlone(e.svcs.GetStore(), key) {
		return nil
	}
	cur := e.current(key)
	if obj == nil {
		return e.remove(ctx, key, cur)
	}
	desired := EndpointsObject(obj.(*allocdv1.ServiceEndpoints))
	if cur == nil {
		return e.create(ctx, key, desired)
	}
	return e.update(ctx, key, cur, desired)
}

// create creates desired, or updates what is there when the cache lagged.
func (e *Endpoints) create(ctx context.Context, key string, desired *corev1.Endpoints) error {
	api := e.kube.CoreV1().Endpoints(desired.Namespace)
	created, err := api.Create(ctx, desired, metav1.CreateOptions{})
	switch {
	case err == nil:
		e.m.Wrote("endpoints", "create")
		e.last.put(key, created)
		return nil
	case apierrors.IsAlreadyExists(err):
		// The cache lags: update what is there.
		cur, err := api.Get(ctx, desired.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get %s: %w", key, err)
		}
		return e.update(ctx, key, cur, desired)
	case namespaceGone(err):
		return nil // as kube-controller-manager: the namespace is going away
	default:
		return fmt.Errorf("create %s: %w", key, err)
	}
}

// update writes desired over cur unless they already match; on a conflict it reads the
// object again and tries once more before giving the key back to the queue. An object
// deleted meanwhile is forgotten and created (once: the next try reads it again).
func (e *Endpoints) update(ctx context.Context, key string, cur, desired *corev1.Endpoints) error {
	for attempt := 0; ; attempt++ {
		if EndpointsMatch(cur, desired) {
			return nil
		}
		next := cur.DeepCopy()
		next.Labels = desired.Labels
		if next.Annotations == nil {
			next.Annotations = map[string]string{}
		}
		for _, a := range managedAnnotations {
			delete(next.Annotations, a)
		}
		maps.Copy(next.Annotations, desired.Annotations)
		next.Subsets = desired.Subsets
		updated, err := e.kube.CoreV1().Endpoints(cur.Namespace).Update(ctx, next, metav1.UpdateOptions{})
		switch {
		case err == nil:
			e.m.Wrote("endpoints", "update")
			e.last.put(key, updated)
			return nil
		case apierrors.IsNotFound(err) && attempt == 0:
			e.last.forget(key)
			api := e.kube.CoreV1().Endpoints(cur.Namespace)
			created, err := api.Create(ctx, desired, metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("update %s: deleted meanwhile; create: %w", key, err)
			}
			e.m.Wrote("endpoints", "create")
			e.last.put(key, created)
			return nil
		case apierrors.IsConflict(err) && attempt == 0:
			cur, err = e.kube.CoreV1().Endpoints(cur.Namespace).Get(ctx, cur.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				e.last.forget(key)
				return fmt.Errorf("update %s: deleted meanwhile", key)
			}
			if err != nil {
				return fmt.Errorf("get %s: %w", key, err)
			}
		default:
			return fmt.Errorf("update %s: %w", key, err)
		}
	}
}

// remove deletes cur, allocd having deleted its object, when the endpoint controller
// wrote it: an Endpoints someone else keeps (a Service without selector) stays.
func (e *Endpoints) remove(ctx context.Context, key string, cur *corev1.Endpoints) error {
	if cur == nil || cur.Labels[LabelManagedBy] != EndpointController {
		return nil
	}
	uid, rv := cur.UID, cur.ResourceVersion
	err := e.kube.CoreV1().Endpoints(cur.Namespace).Delete(ctx, cur.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	switch {
	case err == nil:
		e.m.Wrote("endpoints", "delete")
		e.last.forget(key)
		return nil
	case apierrors.IsNotFound(err):
		e.last.forget(key)
		return nil
	default:
		// A conflict: the object changed; the next try judges it again.
		return fmt.Errorf("delete %s: %w", key, err)
	}
}

// current is the newest state of key known: the informer's, or the one this writer
// wrote last when the informer has not caught up with it yet.
func (e *Endpoints) current(key string) *corev1.Endpoints {
	var cached *corev1.Endpoints
	if obj, ok, _ := e.inf.GetStore().GetByKey(key); ok {
		cached = obj.(*corev1.Endpoints)
	}
	return e.last.newer(key, cached)
}

// EndpointsObject is the Kubernetes object of allocd's Endpoints, as
// kube-controller-manager writes it: labels and annotations as allocd computed them,
// every address with its node name and Pod reference, no owner reference.
func EndpointsObject(ep *allocdv1.ServiceEndpoints) *corev1.Endpoints {
	out := &corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{Namespace: ep.GetNamespace(), Name: ep.GetName(),
			Labels: ep.GetLabels(), Annotations: ep.GetAnnotations()},
	}
	for _, s := range ep.GetSubsets() {
		sub := corev1.EndpointSubset{}
		for _, a := range s.GetAddresses() {
			sub.Addresses = append(sub.Addresses, address(a))
		}
		for _, a := range s.GetNotReadyAddresses() {
			sub.NotReadyAddresses = append(sub.NotReadyAddresses, address(a))
		}
		for _, p := range s.GetPorts() {
			sub.Ports = append(sub.Ports, corev1.EndpointPort{Name: p.GetName(), Port: p.GetPort(),
				Protocol: corev1.Protocol(p.GetProtocol()), AppProtocol: p.AppProtocol})
		}
		out.Subsets = append(out.Subsets, sub)
	}
	return out
}

func address(a *allocdv1.EndpointAddress) corev1.EndpointAddress {
	out := corev1.EndpointAddress{IP: a.GetIp(), Hostname: a.GetHostname()}
	if r := a.GetTargetRef(); r != nil {
		// kube-controller-manager always sets the node name of a Pod's address.
		node := a.GetNodeName()
		out.NodeName = &node
		out.TargetRef = &corev1.ObjectReference{Kind: r.GetKind(), Namespace: r.GetNamespace(),
			Name: r.GetName(), UID: types.UID(r.GetUid())}
	} else if a.GetNodeName() != "" {
		node := a.GetNodeName()
		out.NodeName = &node
	}
	return out
}

// EndpointsMatch reports whether the cluster's object cur already says what desired
// says: the same labels, the same over-capacity annotation, the same subsets (in any
// order). The trigger time alone does not make a write, as in kube-controller-manager.
func EndpointsMatch(cur, desired *corev1.Endpoints) bool {
	if !maps.Equal(cur.Labels, desired.Labels) && len(cur.Labels)+len(desired.Labels) > 0 {
		return false
	}
	if cur.Annotations[AnnotationOverCapacity] != desired.Annotations[AnnotationOverCapacity] {
		return false
	}
	if (cur.Annotations[AnnotationTriggerTime] == "") != (desired.Annotations[AnnotationTriggerTime] == "") {
		return false
	}
	return apiequality.Semantic.DeepEqual(SortedSubsets(cur.Subsets), SortedSubsets(desired.Subsets))
}

// SortedSubsets returns a copy of subsets with addresses and ports sorted, and the
// subsets sorted by their first port and address: one order for comparing.
func SortedSubsets(subsets []corev1.EndpointSubset) []corev1.EndpointSubset {
	out := make([]corev1.EndpointSubset, 0, len(subsets))
	for _, s := range subsets {
		s = *s.DeepCopy()
		byIP := func(a, b corev1.EndpointAddress) int { return strings.Compare(a.IP, b.IP) }
		slices.SortFunc(s.Addresses, byIP)
		slices.SortFunc(s.NotReadyAddresses, byIP)
		slices.SortFunc(s.Ports, func(a, b corev1.EndpointPort) int {
			return strings.Compare(fmt.Sprint(a.Name, a.Port, a.Protocol), fmt.Sprint(b.Name, b.Port, b.Protocol))
		})
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b corev1.EndpointSubset) int { return strings.Compare(subsetKey(a), subsetKey(b)) })
	return out
}

func subsetKey(s corev1.EndpointSubset) string {
	var b strings.Builder
	for _, p := range s.Ports {
		fmt.Fprint(&b, p.Name, p.Port, p.Protocol, ";")
	}
	for _, a := range append(s.Addresses, s.NotReadyAddresses...) {
		b.WriteString(a.IP + ";")
	}
	return b.String()
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
