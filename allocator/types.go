package allocator

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/allocd/allocd/internal/badrequest"
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

// CheckUID reports what is wrong with an owner UID, "" when nothing is. A UID is the
// last part of its owner record's key (<prefix>/owners/<uid>), so it must be a usable
// key part: not empty, printable UTF-8 without spaces, and no empty, "." or ".."
// segment between slashes (Kubernetes UIDs are UUIDs and never have a slash;
// KubernetesOwner's "default/kubernetes" has two segments).
func CheckUID(uid string) string {
	if uid == "" {
		return "required"
	}
	if !utf8.ValidString(uid) {
		return "not valid UTF-8"
	}
	for _, r := range uid {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return fmt.Sprintf("contains %q; want printable characters without spaces", r)
		}
	}
	for seg := range strings.SplitSeq(uid, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Sprintf("%q has an empty, \".\" or \"..\" segment between slashes", uid)
		}
	}
	return ""
}

// checkOwner returns an *InvalidError for an owner whose UID CheckUID refuses.
func checkOwner(field string, o Owner) error {
	if why := CheckUID(o.UID); why != "" {
		return badrequest.New(field, why)
	}
	return nil
}

// KubernetesCIDR is the name of the ServiceCIDR that --service-cluster-ip-range
// seeds on first start, as Kubernetes' default ServiceCIDR.
const KubernetesCIDR = "kubernetes"

// CIDRState is the state of a ServiceCIDR.
type CIDRState int

const (
	// CIDRReady: addresses are allocated from it.
	CIDRReady CIDRState = iota + 1
	// CIDRTerminating: deleted, no longer allocated from, and removed once no
	// allocated address lies in it alone.
	CIDRTerminating
)

// String returns "ready" or "terminating".
func (s CIDRState) String() string {
	switch s {
	case CIDRReady:
		return "ready"
	case CIDRTerminating:
		return "terminating"
	}
	return "unknown"
}

// ServiceCIDR is a named set of one or two ClusterIP ranges (at most one per family)
// that addresses are allocated from, stored at <prefix>/config/servicecidrs/<name>.
type ServiceCIDR struct {
	Name  string
	CIDRs []netip.Prefix
	State CIDRState
	// Created is when it was created; Terminating when it was deleted (zero while
	// ready).
	Created, Terminating time.Time
	// CreateRevision and Revision are its key's etcd revisions.
	CreateRevision, Revision int64
	// Blockers is, for a terminating ServiceCIDR, how many allocated addresses lie in
	// it and in no ready ServiceCIDR; Sample lists some of them (at most
	// BlockerSample), as the index sees them. Filled by GetServiceCIDR.
	Blockers int
	Sample   []Allocation
}

// BlockerSample is the most blocking allocations GetServiceCIDR lists.
const BlockerSample = 10
