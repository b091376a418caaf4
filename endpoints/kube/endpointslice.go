package kube

// Kubernetes' names on an EndpointSlice, and on the Service that asks for its hints.
const (
	// LabelServiceName names a slice's Service.
	LabelServiceName = "kubernetes.io/service-name"
	// LabelSliceManagedBy is the label naming who manages a slice; the EndpointSlice
	// controller's slices carry SliceControllerName.
	LabelSliceManagedBy = "endpointslice.kubernetes.io/managed-by"
	// SliceControllerName is kube-controller-manager's EndpointSlice controller.
	SliceControllerName = "endpointslice-controller.k8s.io"
	// AnnotationTopologyMode "Auto" on a Service asks for topology hints.
	AnnotationTopologyMode = "service.kubernetes.io/topology-mode"
	// AnnotationTopologyAwareHints is AnnotationTopologyMode's deprecated name; it wins
	// when both are set.
	AnnotationTopologyAwareHints = "service.kubernetes.io/topology-aware-hints"

	// AddressTypeIPv4 is the address type of a slice of IPv4 addresses.
	AddressTypeIPv4 = "IPv4"
	// AddressTypeIPv6 is the address type of a slice of IPv6 addresses.
	AddressTypeIPv6 = "IPv6"
)

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

// The values the condition pointers point at: never written through.
var (
	trueValue  = true
	falseValue = false
)

// Bool returns a pointer to a shared true or false, for a SliceEndpoint's conditions:
// a slice's conditions cost no allocation. What it points at must never be written.
func Bool(b bool) *bool {
	if b {
		return &trueValue
	}
	return &falseValue
}
