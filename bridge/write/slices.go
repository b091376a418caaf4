package write

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
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

// EndpointSliceController is the endpointslice.kubernetes.io/managed-by value of the
// slices kube-controller-manager's EndpointSlice controller writes, and allocd's.
const EndpointSliceController = "endpointslice-controller.k8s.io"

// EndpointSlices writes the EndpointSlices allocd computes into the cluster, each with
// the owner reference to its Service that kube-controller-manager sets (the garbage
// collector deletes them with the Service).
type EndpointSlices struct {
	c          *client.Client
	kube       kubernetes.Interface
	inf        cache.SharedIndexInformer
	svcs       cache.SharedIndexInformer
	m          *Metrics
	last       *lastWritten[*discoveryv1.EndpointSlice]
	kubernetes bool
}

// NewEndpointSlices returns the EndpointSlice kind over c (allocd) and kube (the
// cluster); its informer comes from f. With kubernetesSvc the slices of
// default/kubernetes are written too.
func NewEndpointSlices(c *client.Client, kube kubernetes.Interface, f informers.SharedInformerFactory, m *Metrics,
	kubernetesSvc bool) *EndpointSlices {
	inf := f.Discovery().V1().EndpointSlices().Informer()
	_ = inf.SetTransform(dropManagedFields) // fails only once started
	return &EndpointSlices{c: c, kube: kube, inf: inf, svcs: f.Core().V1().Services().Informer(), m: m,
		kubernetes: kubernetesSvc, last: newLastWritten[*discoveryv1.EndpointSlice]()}
}

// Forget implements Kind.
func (e *EndpointSlices) Forget(key string) { e.last.forget(key) }

// HasSynced implements Kind.
func (e *EndpointSlices) HasSynced() bool { return e.inf.HasSynced() && e.svcs.HasSynced() }

// Leftovers implements Kind: the slices labelled as the EndpointSlice controller's that
// allocd lacks, of a Service that is gone or has a selector, as the upstream
// reconciler deletes the slices of a Service it does not want (a Service whose ports
// changed: its old slices).
//
// A Service's leftovers wait until every slice allocd holds of it is in the cluster
// (the next sweep takes them): as the upstream reconciler creates before it deletes, so
// that a create that fails or waits does not leave the Service without endpoints.
func (e *EndpointSlices) Leftovers(listed map[string]any) ([]string, error) {
	stale, err := e.leftovers(listed)
	if err != nil || len(stale) == 0 {
		return stale, err
	}
	waiting := map[string]bool{} // Services with a slice of allocd's not yet in the cluster
	for key, o := range listed {
		if _, ok, _ := e.inf.GetStore().GetByKey(key); !ok {
			waiting[e.ServiceOf(o)] = true
		}
	}
	out := stale[:0]
	for _, key := range stale {
		o, ok, _ := e.inf.GetStore().GetByKey(key)
		if s, isSlice := o.(*discoveryv1.EndpointSlice); ok && isSlice &&
			waiting[s.Namespace+"/"+s.Labels[discoveryv1.LabelServiceName]] {
			continue
		}
		out = append(out, key)
	}
	return out, nil
}

func (e *EndpointSlices) leftovers(listed map[string]any) ([]string, error) {
	return leftovers(e.inf.GetStore().List(), func(o any) clusterObject {
		s := o.(*discoveryv1.EndpointSlice)
		return clusterObject{key: s.Namespace + "/" + s.Name,
			service: s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName],
			managed: s.Labels[discoveryv1.LabelManagedBy] == EndpointSliceController &&
				s.Labels[discoveryv1.LabelServiceName] != ""}
	}, e.svcs.GetStore(), listed, e.ServiceOf)
}

// Services implements Kind.
func (e *EndpointSlices) Services() cache.SharedIndexInformer { return e.svcs }

// ServiceOf implements Kind: a slice names its Service in its service-name label.
func (*EndpointSlices) ServiceOf(o any) string {
	s := o.(*allocdv1.EndpointSlice)
	return s.GetNamespace() + "/" + s.GetLabels()[discoveryv1.LabelServiceName]
}

// Name implements Kind.
func (*EndpointSlices) Name() string { return "endpointslices" }

// Informer implements Kind.
func (e *EndpointSlices) Informer() cache.SharedIndexInformer { return e.inf }

func (e *EndpointSlices) skip(s *allocdv1.EndpointSlice) bool {
	return !e.kubernetes && s.GetNamespace() == "default" &&
		s.GetLabels()[discoveryv1.LabelServiceName] == "kubernetes"
}

// List implements Kind.
func (e *EndpointSlices) List(ctx context.Context) (map[string]any, int64, error) {
	req := &allocdv1.ListEndpointSlicesRequest{PageSize: 5000}
	list := func(ctx context.Context) (*allocdv1.ListEndpointSlicesResponse, error) {
		return e.c.ListEndpointSlices(ctx, req)
	}
	return listAll(ctx, &req.PageToken, list, (*allocdv1.ListEndpointSlicesResponse).GetEndpointSlices,
		func(s *allocdv1.EndpointSlice, _ string) bool { return !e.skip(s) })
}

// Watch implements Kind.
func (e *EndpointSlices) Watch(ctx context.Context, rev int64, fn func(string, any, int64)) error {
	return e.c.WatchEndpointSlices(ctx, &allocdv1.WatchEndpointSlicesRequest{StartRevision: rev},
		func(r *allocdv1.WatchEndpointSlicesResponse) error {
			s := r.GetEndpointSlice()
			if e.skip(s) {
				return nil
			}
			key := s.GetNamespace() + "/" + s.GetName()
			if r.GetType() == allocdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED {
				fn(key, nil, r.GetRevision())
			} else {
				fn(key, s, r.GetRevision())
			}
			return nil
		})
}

// Sync implements Kind. The slices of a Service that exists without a selector are
// left alone, as upstream's reconciler leaves them.
func (e *EndpointSlices) Sync(ctx context.Context, key string, obj any) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	var cur *discoveryv1.EndpointSlice
	if o, ok, _ := e.inf.GetStore().GetByKey(key); ok {
		cur = o.(*discoveryv1.EndpointSlice)
	}
	cur = e.last.newer(key, cur)
	if obj == nil {
		if cur == nil || leftAlone(e.svcs.GetStore(), ns+"/"+cur.Labels[discoveryv1.LabelServiceName]) {
			return nil
		}
		return e.remove(ctx, key, cur)
	}
	desired := EndpointSliceObject(obj.(*allocdv1.EndpointSlice))
	if leftAlone(e.svcs.GetStore(), ns+"/"+desired.Labels[discoveryv1.LabelServiceName]) {
		return nil
	}
	api := e.kube.DiscoveryV1().EndpointSlices(ns)
	if cur == nil {
		created, err := api.Create(ctx, desired, metav1.CreateOptions{})
		switch {
		case err == nil:
			e.m.Wrote("endpointslices", "create")
			e.last.put(key, created)
			return nil
		case apierrors.IsAlreadyExists(err):
			if cur, err = api.Get(ctx, name, metav1.GetOptions{}); err != nil {
				return fmt.Errorf("get %s: %w", key, err)
			}
		case namespaceGone(err):
			return nil
		default:
			return fmt.Errorf("create %s: %w", key, err)
		}
	}
	return e.update(ctx, key, cur, desired)
}

// remove deletes cur, allocd having deleted its slice, when the EndpointSlice
// controller wrote it, with the UID and resourceVersion read as preconditions.
func (e *EndpointSlices) remove(ctx context.Context, key string, cur *discoveryv1.EndpointSlice) error {
	if cur.Labels[discoveryv1.LabelManagedBy] != EndpointSliceController {
		return nil
	}
	uid, rv := cur.UID, cur.ResourceVersion
	err := e.kube.DiscoveryV1().EndpointSlices(cur.Namespace).Delete(ctx, cur.Name,
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	if err == nil || apierrors.IsNotFound(err) {
		e.m.Wrote("endpointslices", "delete")
		e.last.forget(key)
		return nil
	}
	return fmt.Errorf("delete %s: %w", key, err)
}

// update writes desired over cur unless they already match; on a conflict it reads the
// slice again and tries once more before giving the key back to the queue.
func (e *EndpointSlices) update(ctx context.Context, key string,
	cur, desired *discoveryv1.EndpointSlice) error {
	api := e.kube.DiscoveryV1().EndpointSlices(cur.Namespace)
	for attempt := 0; ; attempt++ {
		if cur.Labels[discoveryv1.LabelManagedBy] != EndpointSliceController {
			// Not the EndpointSlice controller's (its name came by chance): left alone, as
			// the upstream reconciler leaves slices without its label.
			return fmt.Errorf("update %s: %w", key, errNotManaged)
		}
		desired := desired.DeepCopy()
		desired.OwnerReferences = ownerReferences(cur.OwnerReferences, desired.OwnerReferences)
		if EndpointSliceMatch(cur, desired) {
			return nil
		}
		next := cur.DeepCopy()
		next.Labels, next.OwnerReferences = desired.Labels, desired.OwnerReferences
		if next.Annotations == nil {
			next.Annotations = map[string]string{}
		}
		delete(next.Annotations, AnnotationTriggerTime)
		maps.Copy(next.Annotations, desired.Annotations)
		next.AddressType, next.Endpoints, next.Ports = desired.AddressType, desired.Endpoints, desired.Ports
		updated, err := api.Update(ctx, next, metav1.UpdateOptions{})
		switch {
		case err == nil:
			e.m.Wrote("endpointslices", "update")
			e.last.put(key, updated)
			return nil
		case apierrors.IsNotFound(err) && attempt == 0:
			// Deleted meanwhile: forgotten, and created.
			e.last.forget(key)
			created, err := api.Create(ctx, desired, metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("update %s: deleted meanwhile; create: %w", key, err)
			}
			e.m.Wrote("endpointslices", "create")
			e.last.put(key, created)
			return nil
		case apierrors.IsConflict(err) && attempt == 0:
			if cur, err = api.Get(ctx, cur.Name, metav1.GetOptions{}); err != nil {
				if apierrors.IsNotFound(err) {
					e.last.forget(key)
				}
				return fmt.Errorf("get %s: %w", key, err)
			}
		case apierrors.IsInvalid(err) && next.AddressType != cur.AddressType:
			// addressType is immutable: a slice that changed family is made again.
			uid, rv := cur.UID, cur.ResourceVersion
			err := api.Delete(ctx, cur.Name,
				metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete %s to change its address type: %w", key, err)
			}
			e.last.forget(key)
			return fmt.Errorf("update %s: address type changed; created again next", key)
		default:
			return fmt.Errorf("update %s: %w", key, err)
		}
	}
}

// errNotManaged is a slice of the name allocd gives that the EndpointSlice controller
// did not write.
var errNotManaged = errors.New("the cluster's slice is not labelled as the EndpointSlice " +
	"controller's; left alone")

// ownerReferences is the owner references a slice is written with, in cur's order:
// desired's (the controller reference to its Service) and the others set on cur, except
// another controller reference (an object has one controller: a Service made again has
// a new UID).
func ownerReferences(cur, desired []metav1.OwnerReference) []metav1.OwnerReference {
	var out []metav1.OwnerReference
	for _, r := range cur {
		i := slices.IndexFunc(desired, func(d metav1.OwnerReference) bool { return d.UID == r.UID })
		switch {
		case i >= 0:
			out = append(out, desired[i])
		case r.Controller == nil || !*r.Controller:
			out = append(out, r)
		}
	}
	for _, d := range desired {
		if !slices.ContainsFunc(out, func(r metav1.OwnerReference) bool { return r.UID == d.UID }) {
			out = append(out, d)
		}
	}
	return out
}

// EndpointSliceObject is the Kubernetes object of allocd's EndpointSlice, as
// kube-controller-manager writes it: its labels and annotations, the owner reference to
// the Service (controller, blocking its deletion), and the fields upstream sets.
func EndpointSliceObject(s *allocdv1.EndpointSlice) *discoveryv1.EndpointSlice {
	t := true
	out := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.GetNamespace(), Name: s.GetName(), Labels: s.GetLabels(),
			Annotations: s.GetAnnotations()},
		AddressType: discoveryv1.AddressType(s.GetAddressType()),
	}
	if uid := s.GetServiceUid(); uid != "" {
		out.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service",
			Name: s.GetLabels()[discoveryv1.LabelServiceName], UID: types.UID(uid), Controller: &t, BlockOwnerDeletion: &t}}
	}
	for _, ep := range s.GetEndpoints() {
		c := ep.GetConditions()
		if c == nil { // every condition unknown
			c = &allocdv1.EndpointConditions{}
		}
		e := discoveryv1.Endpoint{Addresses: ep.GetAddresses(), Hostname: ep.Hostname, NodeName: ep.NodeName, Zone: ep.Zone,
			Conditions: discoveryv1.EndpointConditions{Ready: c.Ready, Serving: c.Serving, Terminating: c.Terminating}}
		if r := ep.GetTargetRef(); r != nil {
			e.TargetRef = &corev1.ObjectReference{Kind: r.GetKind(), Namespace: r.GetNamespace(), Name: r.GetName(),
				UID: types.UID(r.GetUid())}
		}
		if h := ep.GetHints(); h != nil {
			e.Hints = &discoveryv1.EndpointHints{}
			for _, z := range h.GetForZones() {
				e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z.GetName()})
			}
			for _, n := range h.GetForNodes() {
				e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: n.GetName()})
			}
		}
		out.Endpoints = append(out.Endpoints, e)
	}
	for _, p := range s.GetPorts() {
		port := discoveryv1.EndpointPort{Name: p.Name, Port: p.Port, AppProtocol: p.AppProtocol}
		if p.Protocol != nil {
			proto := corev1.Protocol(*p.Protocol)
			port.Protocol = &proto
		}
		out.Ports = append(out.Ports, port)
	}
	return out
}

// EndpointSliceMatch reports whether the cluster's slice cur already says what desired
// says: labels, owner references, address type, endpoints and ports (in any order);
// the trigger time alone makes no write.
func EndpointSliceMatch(cur, desired *discoveryv1.EndpointSlice) bool {
	if !maps.Equal(cur.Labels, desired.Labels) || cur.AddressType != desired.AddressType ||
		!apiequality.Semantic.DeepEqual(cur.OwnerReferences, desired.OwnerReferences) {
		return false
	}
	if (cur.Annotations[AnnotationTriggerTime] == "") != (desired.Annotations[AnnotationTriggerTime] == "") {
		return false
	}
	return apiequality.Semantic.DeepEqual(sortedEndpoints(cur.Endpoints), sortedEndpoints(desired.Endpoints)) &&
		apiequality.Semantic.DeepEqual(sortedPorts(cur.Ports), sortedPorts(desired.Ports))
}

func sortedEndpoints(eps []discoveryv1.Endpoint) []discoveryv1.Endpoint {
	out := slices.Clone(eps)
	slices.SortFunc(out, func(a, b discoveryv1.Endpoint) int {
		return strings.Compare(strings.Join(a.Addresses, ","), strings.Join(b.Addresses, ","))
	})
	if len(out) == 0 {
		return nil
	}
	return out
}

func sortedPorts(ports []discoveryv1.EndpointPort) []discoveryv1.EndpointPort {
	out := slices.Clone(ports)
	slices.SortFunc(out, func(a, b discoveryv1.EndpointPort) int {
		return strings.Compare(fmt.Sprint(deref(a.Name), deref(a.Port)), fmt.Sprint(deref(b.Name), deref(b.Port)))
	})
	if len(out) == 0 {
		return nil
	}
	return out
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
