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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// EndpointSliceController is the endpointslice.kubernetes.io/managed-by value of the
// slices kube-controller-manager's EndpointSlice controller writes, and allocd's.
const EndpointSliceController = "endpointslice-controller.k8s.io"

// EndpointSlices writes the EndpointSlices allocd computes into the cluster, each with
// the owner reference to its Service that kube-controller-manager sets (the garbage
// collector deletes them with the Service). Its Sync leaves the slices of a Service that
// exists without a selector alone, as upstream's reconciler leaves them.
type EndpointSlices struct {
	*clusterKind[*allocdv1.EndpointSlice, *discoveryv1.EndpointSlice]
	c          *client.Client
	kubernetes bool
}

// NewEndpointSlices returns the EndpointSlice kind over c (allocd) and kube (the
// cluster); its informer comes from f. With kubernetesSvc the slices of
// default/kubernetes are written too.
func NewEndpointSlices(c *client.Client, kube kubernetes.Interface, f informers.SharedInformerFactory, m *Metrics,
	kubernetesSvc bool) *EndpointSlices {
	api := func(ns string) clusterAPI[*discoveryv1.EndpointSlice] {
		return kube.DiscoveryV1().EndpointSlices(ns)
	}
	k := newClusterKind("endpointslices", f.Discovery().V1().EndpointSlices().Informer(),
		f.Core().V1().Services().Informer(), discoveryv1.Resource("endpointslices"), api, EndpointSliceObject,
		sliceRules{}, m)
	return &EndpointSlices{clusterKind: k, c: c, kubernetes: kubernetesSvc}
}

// Leftovers implements Kind: the slices labelled as the EndpointSlice controller's that
// allocd lacks, of a Service that is gone or has a selector, as the upstream
// reconciler deletes the slices of a Service it does not want (a Service whose ports
// changed: its old slices).
//
// A Service's leftovers wait until every slice allocd holds of it is in the cluster
// (the next sweep takes them): as the upstream reconciler creates before it deletes, so
// that a create that fails or waits does not leave the Service without endpoints.
func (e *EndpointSlices) Leftovers(listed map[string]*allocdv1.EndpointSlice) ([]string, error) {
	stale, err := leftovers(e.clusterKind, listed, e.ServiceOf)
	if err != nil || len(stale) == 0 {
		return stale, err
	}
	waiting := map[string]bool{} // Services with a slice of allocd's not yet in the cluster
	for key, s := range listed {
		if _, ok := e.cached(key); !ok {
			waiting[e.ServiceOf(s)] = true
		}
	}
	out := stale[:0]
	for _, key := range stale {
		if s, ok := e.cached(key); ok && waiting[sliceRules{}.service(s)] {
			continue
		}
		out = append(out, key)
	}
	return out, nil
}

// ServiceOf implements Kind: a slice names its Service in its service-name label.
func (*EndpointSlices) ServiceOf(s *allocdv1.EndpointSlice) string {
	return s.GetNamespace() + "/" + s.GetLabels()[discoveryv1.LabelServiceName]
}

// Name implements Kind.
func (*EndpointSlices) Name() string { return "endpointslices" }

// keep reports whether the writer follows allocd's slice s: default/kubernetes' only
// when told to.
func (e *EndpointSlices) keep(s *allocdv1.EndpointSlice) bool {
	return e.kubernetes || e.ServiceOf(s) != kubernetesKey
}

// List implements Kind.
func (e *EndpointSlices) List(ctx context.Context) (map[string]*allocdv1.EndpointSlice, int64, error) {
	req := &allocdv1.ListEndpointSlicesRequest{PageSize: 5000}
	list := func(ctx context.Context) (*allocdv1.ListEndpointSlicesResponse, error) {
		return e.c.ListEndpointSlices(ctx, req)
	}
	return listAll(ctx, &req.PageToken, list, (*allocdv1.ListEndpointSlicesResponse).GetEndpointSlices,
		e.keep)
}

// Watch implements Kind.
func (e *EndpointSlices) Watch(ctx context.Context, rev int64,
	fn func(key string, s *allocdv1.EndpointSlice, rev int64)) error {
	return e.c.WatchEndpointSlices(ctx, &allocdv1.WatchEndpointSlicesRequest{StartRevision: rev},
		eachChange((*allocdv1.WatchEndpointSlicesResponse).GetEndpointSlice, e.keep, fn))
}

// sliceRules are the rules of writing a slice: only one labelled as the EndpointSlice
// controller's is written over or deleted, with the owner references others set kept;
// one whose address type changes is made again.
type sliceRules struct{}

func (sliceRules) service(s *discoveryv1.EndpointSlice) string {
	return s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]
}

func (sliceRules) managed(s *discoveryv1.EndpointSlice) bool {
	return s.Labels[discoveryv1.LabelManagedBy] == EndpointSliceController
}

// prepare refuses a slice that is not the EndpointSlice controller's (its name came by
// chance: left alone, as the upstream reconciler leaves slices without its label), and
// keeps the owner references others set on cur.
func (r sliceRules) prepare(cur, desired *discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, error) {
	if !r.managed(cur) {
		return nil, errNotManaged
	}
	desired = desired.DeepCopy()
	desired.OwnerReferences = ownerReferences(cur.OwnerReferences, desired.OwnerReferences)
	return desired, nil
}

func (sliceRules) match(cur, desired *discoveryv1.EndpointSlice) bool {
	return EndpointSliceMatch(cur, desired)
}

// merge keeps cur's annotations but the trigger time, and writes desired's labels,
// owner references, address type, endpoints and ports.
func (sliceRules) merge(cur, desired *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	next := cur.DeepCopy()
	next.Labels, next.OwnerReferences = desired.Labels, desired.OwnerReferences
	if next.Annotations == nil {
		next.Annotations = map[string]string{}
	}
	delete(next.Annotations, AnnotationTriggerTime)
	maps.Copy(next.Annotations, desired.Annotations)
	next.AddressType, next.Endpoints, next.Ports = desired.AddressType, desired.Endpoints, desired.Ports
	return next
}

// immutable: addressType is immutable; a slice that changed family is made again.
func (sliceRules) immutable(cur, next *discoveryv1.EndpointSlice) string {
	if next.AddressType != cur.AddressType {
		return "address type"
	}
	return ""
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
