package endpoints

import "sort"

// Kubernetes' names that the EndpointSlice controller writes or reads.
const (
	// LabelServiceName names a slice's Service.
	LabelServiceName = "kubernetes.io/service-name"
	// LabelSliceManagedBy is the label naming who manages a slice; the controller's
	// slices carry SliceControllerName.
	LabelSliceManagedBy = "endpointslice.kubernetes.io/managed-by"
	// SliceControllerName is kube-controller-manager's EndpointSlice controller.
	SliceControllerName = "endpointslice-controller.k8s.io"
	// LabelZone is a Node's zone, copied to its endpoints.
	LabelZone = "topology.kubernetes.io/zone"
	// AnnotationTopologyMode "Auto" asks for topology hints; the deprecated
	// AnnotationTopologyAwareHints wins when both are set.
	AnnotationTopologyMode       = "service.kubernetes.io/topology-mode"
	AnnotationTopologyAwareHints = "service.kubernetes.io/topology-aware-hints"
	// LabelControlPlane and LabelMaster keep a Node out of the hints' CPU shares.
	LabelControlPlane = "node-role.kubernetes.io/control-plane"
	LabelMaster       = "node-role.kubernetes.io/master"

	AddressTypeIPv4 = "IPv4"
	AddressTypeIPv6 = "IPv6"

	// The values of a Service's spec.trafficDistribution.
	TrafficPreferClose    = "PreferClose"
	TrafficPreferSameZone = "PreferSameZone"
	TrafficPreferSameNode = "PreferSameNode"

	// DefaultMaxEndpointsPerSlice is --max-endpoints-per-slice's default; it takes
	// 1 to MaxMaxEndpointsPerSlice.
	DefaultMaxEndpointsPerSlice = 100
	MaxMaxEndpointsPerSlice     = 1000
)

// Node is what the EndpointSlice controller needs of a Kubernetes Node.
type Node struct {
	Name, ResourceVersion string
	Labels                map[string]string
	// Ready is the Node's Ready condition.
	Ready bool
	// AllocatableCPUMillis is status.allocatable.cpu in millicores.
	AllocatableCPUMillis int64
}

// Zone returns the Node's topology.kubernetes.io/zone label, "" without one.
func (n *Node) Zone() string { return n.Labels[LabelZone] }

// EndpointSlice is one discovery.k8s.io/v1 EndpointSlice plus allocd's bookkeeping.
type EndpointSlice struct {
	Namespace, Name string
	// Service is the name of the Service whose key the slice is stored under (its
	// kubernetes.io/service-name label, as the controller writes it).
	Service     string
	Labels      map[string]string
	Annotations map[string]string
	AddressType string
	// ServiceUID is the uid of the owning Service (its controller owner reference);
	// "" for a slice without one (default/kubernetes').
	ServiceUID string
	Endpoints  []SliceEndpoint
	Ports      []Port
	// Revision and CreateRevision are the slice's ModRevision and CreateRevision in
	// etcd (0 for a slice not read from etcd).
	Revision, CreateRevision int64
}

// ServiceKey returns the "namespace/name" of the slice's Service.
func (s *EndpointSlice) ServiceKey() string { return s.Namespace + "/" + s.Service }

// managed reports whether the EndpointSlice controller manages s.
func (s *EndpointSlice) managed() bool { return s.Labels[LabelSliceManagedBy] == SliceControllerName }

// clone copies s with its own Endpoints and Labels, to be changed.
func (s *EndpointSlice) clone() *EndpointSlice {
	cp := *s
	cp.Endpoints = append([]SliceEndpoint(nil), s.Endpoints...)
	cp.Labels = copyMap(s.Labels)
	cp.Annotations = copyMap(s.Annotations)
	return &cp
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// SliceEndpoint is one endpoint of a slice. A string field that is "" is absent, as
// the controller leaves it unset (it never sets one to "").
type SliceEndpoint struct {
	Addresses []string
	// Ready, Serving and Terminating are the conditions; nil is unset (the controller
	// sets all three; default/kubernetes' slice only Ready, as kube-apiserver does).
	Ready, Serving, Terminating *bool
	Hostname, NodeName, Zone    string
	TargetRef                   *ObjectRef
	// Hints is nil without hints.
	Hints *Hints
}

// Hints of an endpoint: the zones and nodes that should use it.
type Hints struct {
	ForZones, ForNodes []string
}

// isReady is the endpoint's Ready condition (unset is false, as consumers of hints
// read it).
func (e *SliceEndpoint) isReady() bool { return e.Ready != nil && *e.Ready }

// The values the condition pointers point at: never written through.
var (
	trueValue  = true
	falseValue = false
)

// boolPtr returns a pointer to a shared true or false.
func boolPtr(b bool) *bool {
	if b {
		return &trueValue
	}
	return &falseValue
}

// sortSlicePorts sorts ports by name, protocol and number: the order allocd writes.
// (Kubernetes sorts them by a hash of each; consumers take them as a set.)
func sortSlicePorts(ps []Port) {
	sort.Slice(ps, func(i, j int) bool {
		a, b := ps[i], ps[j]
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		if a.Protocol != b.Protocol {
			return a.Protocol < b.Protocol
		}
		return a.Port < b.Port
	})
}
