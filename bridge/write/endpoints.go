package write

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

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

// Endpoints writes the Endpoints allocd computes into the cluster. Its Sync leaves the
// Endpoints of a Service that exists without a selector alone (not created, updated or
// deleted), as kube-controller-manager's syncService leaves them: allocd keeps its last
// object of such a Service, which must not be written over the one its user keeps.
type Endpoints struct {
	*clusterKind[*allocdv1.ServiceEndpoints, *corev1.Endpoints]
	c *client.Client
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
	api := func(ns string) clusterAPI[*corev1.Endpoints] { return kube.CoreV1().Endpoints(ns) }
	k := newClusterKind("endpoints", f.Core().V1().Endpoints().Informer(),
		f.Core().V1().Services().Informer(), corev1.Resource("endpoints"), api, EndpointsObject,
		endpointsRules{}, m)
	return &Endpoints{clusterKind: k, c: c, kubernetes: kubernetesSvc}
}

// keep reports whether the writer follows allocd's ep: default/kubernetes' only when
// told to.
func (e *Endpoints) keep(ep *allocdv1.ServiceEndpoints) bool {
	return e.kubernetes || e.ServiceOf(ep) != kubernetesKey
}

// Name implements Kind.
func (*Endpoints) Name() string { return "endpoints" }

// Leftovers implements Kind: the Endpoints labelled by the endpoint controller that
// allocd lacks, of a Service that is gone (kube-controller-manager's
// checkLeftoverEndpoints; allocd always holds the Endpoints of a Service with a
// selector, so lacking one of those means allocd looks reset).
func (e *Endpoints) Leftovers(listed map[string]*allocdv1.ServiceEndpoints) ([]string, error) {
	return leftovers(e.clusterKind, listed, e.ServiceOf)
}

// ServiceOf implements Kind: an Endpoints object is its Service's namesake.
func (*Endpoints) ServiceOf(ep *allocdv1.ServiceEndpoints) string {
	return ep.GetNamespace() + "/" + ep.GetName()
}

// List implements Kind: every Endpoints allocd stores, paged, read at one revision.
func (e *Endpoints) List(ctx context.Context) (map[string]*allocdv1.ServiceEndpoints, int64, error) {
	req := &allocdv1.ListServiceEndpointsRequest{PageSize: 5000}
	list := func(ctx context.Context) (*allocdv1.ListServiceEndpointsResponse, error) {
		return e.c.ListServiceEndpoints(ctx, req)
	}
	return listAll(ctx, &req.PageToken, list, (*allocdv1.ListServiceEndpointsResponse).GetEndpoints, e.keep)
}

// Watch implements Kind.
func (e *Endpoints) Watch(ctx context.Context, rev int64,
	fn func(key string, ep *allocdv1.ServiceEndpoints, rev int64)) error {
	return e.c.WatchServiceEndpoints(ctx, &allocdv1.WatchServiceEndpointsRequest{StartRevision: rev},
		eachChange((*allocdv1.WatchServiceEndpointsResponse).GetEndpoints, e.keep, fn))
}

// endpointsRules are the rules of writing an Endpoints: any object of the name is
// written over (kube-controller-manager's endpoint controller takes them over), only
// one with its managed-by label deleted.
type endpointsRules struct{}

func (endpointsRules) service(ep *corev1.Endpoints) string { return ep.Namespace + "/" + ep.Name }

func (endpointsRules) managed(ep *corev1.Endpoints) bool {
	return ep.Labels[LabelManagedBy] == EndpointController
}

func (endpointsRules) prepare(_, desired *corev1.Endpoints) (*corev1.Endpoints, error) {
	return desired, nil
}

func (endpointsRules) match(cur, desired *corev1.Endpoints) bool { return EndpointsMatch(cur, desired) }

// merge keeps cur's annotations but those allocd owns, and writes desired's labels and
// subsets.
func (endpointsRules) merge(cur, desired *corev1.Endpoints) *corev1.Endpoints {
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
	return next
}

func (endpointsRules) immutable(_, _ *corev1.Endpoints) string { return "" }

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
