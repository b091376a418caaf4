package allocator

import (
	"net/netip"
	"strconv"
	"time"
)

// Kind is the kind of an allocatable item.
type Kind int

const (
	// KindClusterIP is a ClusterIP address of a --service-cluster-ip-range.
	KindClusterIP Kind = iota + 1
	// KindNodePort is a port of the --service-node-port-range.
	KindNodePort
)

// String returns "ClusterIP" or "NodePort".
func (k Kind) String() string {
	switch k {
	case KindClusterIP:
		return "ClusterIP"
	case KindNodePort:
		return "NodePort"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Owner is the object an allocation belongs to, usually a Service. UID is the key of
// ownership checks and of idempotency.
type Owner struct {
	Namespace, Name, UID string
}

// String returns "namespace/name uid".
func (o Owner) String() string { return o.Namespace + "/" + o.Name + " " + o.UID }

// KubernetesOwner holds the first address of the primary range (and the
// --kubernetes-service-node-port), reserved at start as kube-apiserver does.
var KubernetesOwner = Owner{Namespace: "default", Name: "kubernetes", UID: "default/kubernetes"}

// Item is one allocatable thing: a ClusterIP (Addr) or a NodePort (Port).
type Item struct {
	Kind Kind
	// Addr is the address of a ClusterIP.
	Addr netip.Addr
	// Port is the port of a NodePort.
	Port int
}

// IP returns the Item of a ClusterIP.
func IP(a netip.Addr) Item { return Item{Kind: KindClusterIP, Addr: a} }

// Port returns the Item of a NodePort.
func Port(p int) Item { return Item{Kind: KindNodePort, Port: p} }

// String returns the address or the port number.
func (it Item) String() string {
	switch it.Kind {
	case KindClusterIP:
		return it.Addr.String()
	case KindNodePort:
		return strconv.Itoa(it.Port)
	}
	return "invalid item"
}

// Allocation is one allocated item as stored in etcd.
type Allocation struct {
	Item
	// Range is the name of the item's range: its CIDR, or "30000-32767".
	Range string
	// Owner holds the item.
	Owner Owner
	// AllocateTime is when the item was last written (allocated or reassigned).
	AllocateTime time.Time
	// CreateRevision and ModRevision are the etcd revisions of the item's key.
	CreateRevision, ModRevision int64
}
