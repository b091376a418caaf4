package admit

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// defaultServiceCIDR is the ServiceCIDR kube-apiserver creates from its
// --service-cluster-ip-range (pkg/controlplane/controller/defaultservicecidr).
const defaultServiceCIDR = "kubernetes"

// nodePortIndex indexes Services by the node ports they use (spec.ports[].nodePort and
// spec.healthCheckNodePort); uidIndex by UID.
const (
	nodePortIndex = "allocd.io/nodeport"
	uidIndex      = "allocd.io/uid"
)

// deletedMemory is how long the Cluster remembers the UID of a Service it saw deleted:
// allocd may still hold that Service's addresses and ports until the bridge releases
// them, and the webhook takes them back for a new Service meanwhile (Cluster.known).
const deletedMemory = time.Hour

// Cluster is what the webhook knows of the cluster from informers: its IP families
// (kube-apiserver's --service-cluster-ip-range when given, else the default
// ServiceCIDR's), its ServiceCIDRs and which of them kube-apiserver allocates from, the
// IPAddress objects of kube-apiserver's ClusterIP allocator, the node ports its
// Services use, and the UIDs of its Services (those deleted since it started
// included). The webhook checks allocd's answers against it: an address or port the
// cluster uses, or one kube-apiserver would not allocate, is never written into a new
// Service. It reads a Service from the API server itself (a quorum read) where an
// informer's lag would matter.
type Cluster struct {
	kube     kubernetes.Interface
	services cache.SharedIndexInformer
	ips      cache.SharedIndexInformer
	cidrs    cache.SharedIndexInformer
	// families are kube-apiserver's, when the webhook was told them (SetFamilies).
	families Families

	mu      sync.Mutex
	deleted map[types.UID]time.Time // Services seen deleted, when
}

// NewCluster registers the informers of the Cluster on factory, a factory of kube; the
// caller starts the factory.
func NewCluster(kube kubernetes.Interface, factory informers.SharedInformerFactory) (*Cluster, error) {
	c := &Cluster{
		kube:     kube,
		services: factory.Core().V1().Services().Informer(),
		ips:      factory.Networking().V1().IPAddresses().Informer(),
		cidrs:    factory.Networking().V1().ServiceCIDRs().Informer(),
		deleted:  map[types.UID]time.Time{},
	}
	err := c.services.AddIndexers(cache.Indexers{nodePortIndex: indexNodePorts, uidIndex: indexUID})
	if err != nil {
		return nil, fmt.Errorf("admit: index Services: %w", err)
	}
	_, err = c.services.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: c.serviceDeleted})
	if err != nil {
		return nil, fmt.Errorf("admit: watch Service deletions: %w", err)
	}
	return c, nil
}

// SetFamilies makes fs the cluster's IP families (kube-apiserver's
// --service-cluster-ip-range, primary first), instead of the default ServiceCIDR's:
// kube-apiserver defaults a Service's families from its flag, which can differ from
// the object (a single-stack to dual-stack upgrade turns the object dual-stack while
// kube-apiservers not yet restarted still run single-stack). Call it before serving.
func (c *Cluster) SetFamilies(fs Families) { c.families = fs }

func indexUID(obj any) ([]string, error) {
	s, ok := obj.(*corev1.Service)
	if !ok {
		return nil, nil
	}
	return []string{string(s.UID)}, nil
}

// serviceDeleted remembers the UID of a deleted Service for deletedMemory.
func (c *Cluster) serviceDeleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	s, ok := obj.(*corev1.Service)
	if !ok {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for uid, at := range c.deleted {
		if now.Sub(at) > deletedMemory {
			delete(c.deleted, uid)
		}
	}
	c.deleted[s.UID] = now
}

// known reports whether uid is the UID of a Service of this cluster: one the informer
// holds, or one it saw deleted within deletedMemory. allocd's owners include others
// (another consumer of allocd's ranges, a provisional owner, the kubernetes Service's
// reservation), whose items the webhook never takes.
func (c *Cluster) known(uid string) bool {
	if uid == "" {
		return false
	}
	if objs, err := c.services.GetIndexer().ByIndex(uidIndex, uid); err == nil && len(objs) > 0 {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.deleted[types.UID(uid)]
	return ok
}

// serviceNow reads Service namespace/name from the API server at its current state (a
// GET without resourceVersion: a quorum read of etcd); nil when there is none.
func (c *Cluster) serviceNow(ctx context.Context, namespace, name string) (*corev1.Service, error) {
	s, err := c.kube.CoreV1().Services(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("%w: read Service %s/%s: %w", ErrAPIServer, namespace, name, err)
	}
	return s, nil
}

func indexNodePorts(obj any) ([]string, error) {
	s, ok := obj.(*corev1.Service)
	if !ok {
		return nil, nil
	}
	var out []string
	for _, p := range nodePorts(s) {
		out = append(out, strconv.Itoa(int(p)))
	}
	if s.Spec.HealthCheckNodePort != 0 {
		out = append(out, strconv.Itoa(int(s.Spec.HealthCheckNodePort)))
	}
	return out, nil
}

// Synced reports whether the three informers have listed the cluster once.
func (c *Cluster) Synced() bool {
	return c.services.HasSynced() && c.ips.HasSynced() && c.cidrs.HasSynced()
}

// Families returns the cluster's IP families: those SetFamilies gave, else those of
// the default ServiceCIDR's CIDRs; false while they are not known.
func (c *Cluster) Families() (Families, bool) {
	if len(c.families) > 0 {
		return c.families, true
	}
	obj, ok, err := c.cidrs.GetStore().GetByKey(defaultServiceCIDR)
	if err != nil || !ok {
		return nil, false
	}
	return FamiliesOf(obj.(*networkingv1.ServiceCIDR).Spec.CIDRs)
}

// ServiceCIDRReady reports whether kube-apiserver allocates from sc (the rule of its
// MetaAllocator in pkg/registry/core/service/ipallocator/cidrallocator.go,
// syncAllocators and isReady): not being deleted, and its Ready condition true or not
// set yet.
func ServiceCIDRReady(sc *networkingv1.ServiceCIDR) bool {
	if sc.DeletionTimestamp != nil {
		return false
	}
	for _, cond := range sc.Status.Conditions {
		if cond.Type == networkingv1.ServiceCIDRConditionReady {
			return cond.Status == metav1.ConditionTrue
		}
	}
	return true
}

// readyPrefixes returns the CIDRs of the ServiceCIDRs kube-apiserver allocates from,
// with the name of the ServiceCIDR of each.
func (c *Cluster) readyPrefixes() (prefixes []netip.Prefix, names []string) {
	for _, obj := range c.cidrs.GetStore().List() {
		sc := obj.(*networkingv1.ServiceCIDR)
		if !ServiceCIDRReady(sc) {
			continue
		}
		for _, s := range sc.Spec.CIDRs {
			if p, err := netip.ParsePrefix(s); err == nil {
				prefixes, names = append(prefixes, p.Masked()), append(names, sc.Name)
			}
		}
	}
	return prefixes, names
}

// ipUser reports whether the cluster uses a (an IPAddress object names it), and the
// Service that holds it, when that Service is known and lists a (nil otherwise: a
// leftover IPAddress, or a Service the informer has not seen yet).
func (c *Cluster) ipUser(a netip.Addr) (holder *allocdv1.Owner, used bool) {
	obj, ok, err := c.ips.GetStore().GetByKey(a.String())
	if err != nil || !ok {
		return nil, false
	}
	ref := obj.(*networkingv1.IPAddress).Spec.ParentRef
	if ref == nil || ref.Resource != "services" || ref.Group != "" {
		return nil, true
	}
	s := c.service(ref.Namespace, ref.Name)
	if s == nil {
		return nil, true
	}
	for _, ip := range s.Spec.ClusterIPs {
		if b, ok := parseIP(ip); ok && b == a {
			return ownerOf(s), true
		}
	}
	return nil, true
}

// portUser reports whether a Service of the cluster other than namespace/name uses
// node port p, and which.
func (c *Cluster) portUser(p int32, namespace, name string) (holder *allocdv1.Owner, used bool) {
	objs, err := c.services.GetIndexer().ByIndex(nodePortIndex, strconv.Itoa(int(p)))
	if err != nil {
		return nil, false
	}
	for _, obj := range objs {
		s := obj.(*corev1.Service)
		if s.Namespace != namespace || s.Name != name {
			return ownerOf(s), true
		}
	}
	return nil, false
}

// ipParent returns the namespace and name of the Service an IPAddress object names as
// its parent; none ("", ip) when it names no Service.
func (c *Cluster) ipParent(ip string) (namespace, name string) {
	obj, ok, err := c.ips.GetStore().GetByKey(ip)
	if err != nil || !ok {
		return "", ip
	}
	ref := obj.(*networkingv1.IPAddress).Spec.ParentRef
	if ref == nil || ref.Resource != "services" || ref.Group != "" {
		return "", ip
	}
	return ref.Namespace, ref.Name
}

func (c *Cluster) service(namespace, name string) *corev1.Service {
	obj, ok, err := c.services.GetStore().GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return nil
	}
	return obj.(*corev1.Service)
}

func ownerOf(s *corev1.Service) *allocdv1.Owner {
	return &allocdv1.Owner{Namespace: s.Namespace, Name: s.Name, Uid: string(s.UID)}
}

// serviceItems lists the ClusterIPs and node ports s uses (its health check node port
// included), as allocd names them.
func serviceItems(s *corev1.Service) []string {
	var out []string
	for _, ip := range s.Spec.ClusterIPs {
		if a, ok := parseIP(ip); ok {
			out = append(out, a.String())
		}
	}
	for _, p := range nodePorts(s) {
		out = append(out, strconv.Itoa(int(p)))
	}
	if hc := s.Spec.HealthCheckNodePort; hc != 0 {
		out = append(out, strconv.Itoa(int(hc)))
	}
	return out
}
