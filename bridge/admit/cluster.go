package admit

import (
	"fmt"
	"net/netip"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// defaultServiceCIDR is the ServiceCIDR kube-apiserver creates from its
// --service-cluster-ip-range (pkg/controlplane/controller/defaultservicecidr).
const defaultServiceCIDR = "kubernetes"

// nodePortIndex indexes Services by the node ports they use (spec.ports[].nodePort and
// spec.healthCheckNodePort).
const nodePortIndex = "allocd.io/nodeport"

// Cluster is what the webhook knows of the cluster from informers: its IP families
// (the default ServiceCIDR's), its ServiceCIDRs, the IPAddress objects of
// kube-apiserver's ClusterIP allocator, and the node ports its Services use. The
// webhook checks allocd's answers against it: an address or port the cluster uses is
// never written into a new Service.
type Cluster struct {
	services cache.SharedIndexInformer
	ips      cache.SharedIndexInformer
	cidrs    cache.SharedIndexInformer
}

// NewCluster registers the informers of the Cluster on factory; the caller starts the
// factory.
func NewCluster(factory informers.SharedInformerFactory) (*Cluster, error) {
	c := &Cluster{
		services: factory.Core().V1().Services().Informer(),
		ips:      factory.Networking().V1().IPAddresses().Informer(),
		cidrs:    factory.Networking().V1().ServiceCIDRs().Informer(),
	}
	if err := c.services.AddIndexers(cache.Indexers{nodePortIndex: indexNodePorts}); err != nil {
		return nil, fmt.Errorf("admit: index Services by node port: %w", err)
	}
	return c, nil
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

// Families returns the cluster's IP families: those of the default ServiceCIDR's
// CIDRs; false while it is not known.
func (c *Cluster) Families() (Families, bool) {
	obj, ok, err := c.cidrs.GetStore().GetByKey(defaultServiceCIDR)
	if err != nil || !ok {
		return nil, false
	}
	return FamiliesOf(obj.(*networkingv1.ServiceCIDR).Spec.CIDRs)
}

// prefixes returns the CIDRs of every ServiceCIDR of the cluster.
func (c *Cluster) prefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, obj := range c.cidrs.GetStore().List() {
		for _, s := range obj.(*networkingv1.ServiceCIDR).Spec.CIDRs {
			if p, err := netip.ParsePrefix(s); err == nil {
				out = append(out, p.Masked())
			}
		}
	}
	return out
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
