package endpoints

import (
	"time"
)

// Kubernetes' names that the controller writes or reads.
const (
	// LabelHeadless marks the Endpoints of a headless Service (clusterIP "" or None).
	LabelHeadless = "service.kubernetes.io/headless"
	// LabelManagedBy is the label kube-controller-manager (v1.33+) puts on every
	// Endpoints its endpoint controller writes, with the value ControllerName.
	LabelManagedBy = "endpoints.kubernetes.io/managed-by"
	// ControllerName is the value of LabelManagedBy.
	ControllerName = "endpoint-controller"
	// AnnotationTriggerTime is the time of the change that triggered the write.
	AnnotationTriggerTime = "endpoints.kubernetes.io/last-change-trigger-time"
	// AnnotationOverCapacity is "truncated" when the addresses were cut to MaxAddresses.
	AnnotationOverCapacity = "endpoints.kubernetes.io/over-capacity"
	// AnnotationLeader marks the leader-election Endpoints that the start-up sweep
	// leaves alone.
	AnnotationLeader = "control-plane.alpha.kubernetes.io/leader"
	// MaxAddresses is the cap on address entries (ready and not-ready, over every
	// subset) of one Endpoints object.
	MaxAddresses = 1000
	// Truncated is the value of AnnotationOverCapacity.
	Truncated = "truncated"
)

// ManagedBy values of Endpoints.ManagedBy: who wrote the object.
const (
	// ManagedByController: written by this controller for the Service of ServiceUID.
	ManagedByController = "endpoint-controller"
	// ManagedByMasterLease: the Endpoints of default/kubernetes, from the master leases.
	ManagedByMasterLease = "masterlease"
)

// Service types, phases and protocols as Kubernetes spells them.
const (
	// TypeClusterIP is a Service reached on its cluster IP, inside the cluster.
	TypeClusterIP = "ClusterIP"
	// TypeNodePort is a ClusterIP Service also reached on a port of every node.
	TypeNodePort = "NodePort"
	// TypeLoadBalancer is a NodePort Service also reached through a load balancer.
	TypeLoadBalancer = "LoadBalancer"
	// TypeExternalName is a DNS name for another name: it has no endpoints.
	TypeExternalName = "ExternalName"

	// PhasePending is a Pod accepted but not running yet.
	PhasePending = "Pending"
	// PhaseRunning is a Pod bound to a node with a container running.
	PhaseRunning = "Running"
	// PhaseSucceeded is a Pod whose containers all ended with success (terminal).
	PhaseSucceeded = "Succeeded"
	// PhaseFailed is a Pod whose containers all ended, one at least in failure
	// (terminal).
	PhaseFailed = "Failed"
	// PhaseUnknown is a Pod whose state could not be read.
	PhaseUnknown = "Unknown"

	// ProtocolTCP is the TCP protocol of a port.
	ProtocolTCP = "TCP"
	// ProtocolUDP is the UDP protocol of a port.
	ProtocolUDP = "UDP"
	// ProtocolSCTP is the SCTP protocol of a port.
	ProtocolSCTP = "SCTP"

	// FamilyIPv4 is the IPv4 family.
	FamilyIPv4 = "IPv4"
	// FamilyIPv6 is the IPv6 family.
	FamilyIPv6 = "IPv6"

	// RestartPolicyAlways on an init container makes it a sidecar.
	RestartPolicyAlways = "Always"
)

// Service is what the controller needs of a Kubernetes Service. Values are defaulted
// as the API server defaults them (Type "ClusterIP" when empty, Protocol "TCP" when
// empty, TargetPort = Port when unset) by the feed's conversion.
type Service struct {
	Namespace, Name, UID string
	Labels               map[string]string
	Type                 string
	// ClusterIPs are spec.clusterIPs; ClusterIP() is the first, "" when none.
	ClusterIPs []string
	IPFamilies []string
	// Selector is nil when the Service has none (an empty selector is none too).
	Selector                 map[string]string
	PublishNotReadyAddresses bool
	Ports                    []ServicePort
	// CreationTime is metadata.creationTimestamp, zero when unknown.
	CreationTime time.Time
	// Annotations carry the topology-mode annotation (EndpointSlice controller).
	Annotations map[string]string
	// TrafficDistribution is spec.trafficDistribution ("" when unset).
	TrafficDistribution string
}

// ClusterIP returns spec.clusterIP: the first of ClusterIPs, "" when there is none.
func (s *Service) ClusterIP() string {
	if len(s.ClusterIPs) == 0 {
		return ""
	}
	return s.ClusterIPs[0]
}

// Key returns "namespace/name".
func (s *Service) Key() string { return s.Namespace + "/" + s.Name }

// ServicePort is one port of a Service.
type ServicePort struct {
	Name       string
	Port       int32
	TargetPort TargetPort
	Protocol   string
	// AppProtocol is nil when unset.
	AppProtocol *string
	NodePort    int32
}

// TargetPort is an int-or-string: Name when it is a name, else Number.
type TargetPort struct {
	Number int32
	Name   string
}

// Pod is what the controller needs of a Kubernetes Pod.
type Pod struct {
	Namespace, Name, UID string
	ResourceVersion      string
	Labels               map[string]string
	NodeName             string
	Hostname, Subdomain  string
	// PodIPs are status.podIPs in order (the first is status.podIP), canonical.
	PodIPs   []string
	Phase    string
	Ready    bool
	Deleting bool
	// ReadyTransitionTime is the Ready condition's lastTransitionTime, zero when unknown.
	ReadyTransitionTime time.Time
	Containers          []Container
	InitContainers      []Container
}

// Key returns "namespace/name".
func (p *Pod) Key() string { return p.Namespace + "/" + p.Name }

// Container is one container of a Pod.
type Container struct {
	Name          string
	Ports         []ContainerPort
	RestartPolicy string
}

// ContainerPort is one port of a container.
type ContainerPort struct {
	Name          string
	ContainerPort int32
	Protocol      string
}

// Endpoints is one Endpoints object: a v1.Endpoints plus allocd's bookkeeping.
type Endpoints struct {
	Namespace, Name string
	Labels          map[string]string
	Annotations     map[string]string
	Subsets         []Subset
	// ServiceUID is the uid of the Service this controller wrote the object for.
	ServiceUID string
	// ManagedBy is ManagedByController, ManagedByMasterLease, or "" for an object
	// allocd did not write.
	ManagedBy string
	// AddressCount is the number of address entries before truncation.
	AddressCount int
	// Revision and CreateRevision are the object's ModRevision and CreateRevision in
	// etcd (0 for an object not read from etcd).
	Revision, CreateRevision int64
}

// Key returns "namespace/name".
func (e *Endpoints) Key() string { return e.Namespace + "/" + e.Name }

// Subset is a set of addresses with a set of ports.
type Subset struct {
	Addresses         []Address
	NotReadyAddresses []Address
	Ports             []Port
}

// Address is one address of a subset.
type Address struct {
	IP       string
	Hostname string
	NodeName string
	// TargetRef is nil for an address that names no object.
	TargetRef *ObjectRef
}

// ObjectRef names the object behind an address.
type ObjectRef struct {
	Kind, Namespace, Name, UID string
}

// Port is one port of a subset, or of a slice.
type Port struct {
	Name     string
	Port     int32
	Protocol string
	// AppProtocol is nil when unset.
	AppProtocol *string
}
