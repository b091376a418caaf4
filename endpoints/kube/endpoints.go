package kube

// Kubernetes' names on an Endpoints object.
const (
	// LabelHeadless marks the Endpoints, and the slices, of a headless Service
	// (clusterIP "" or None).
	LabelHeadless = "service.kubernetes.io/headless"
	// LabelManagedBy is the label kube-controller-manager (v1.33+) puts on every
	// Endpoints its endpoint controller writes, with the value ControllerName.
	LabelManagedBy = "endpoints.kubernetes.io/managed-by"
	// ControllerName is the value of LabelManagedBy.
	ControllerName = "endpoint-controller"
	// AnnotationTriggerTime is the time of the change that triggered the write (on
	// Endpoints and on slices).
	AnnotationTriggerTime = "endpoints.kubernetes.io/last-change-trigger-time"
	// AnnotationOverCapacity is Truncated when the addresses were cut to the
	// Endpoints controller's cap.
	AnnotationOverCapacity = "endpoints.kubernetes.io/over-capacity"
	// Truncated is the value of AnnotationOverCapacity.
	Truncated = "truncated"
	// AnnotationLeader marks the leader-election Endpoints that the start-up sweep
	// leaves alone.
	AnnotationLeader = "control-plane.alpha.kubernetes.io/leader"
)

// ManagedBy values of Endpoints.ManagedBy: who wrote the object.
const (
	// ManagedByController: written by the Endpoints controller for the Service of
	// ServiceUID.
	ManagedByController = "endpoint-controller"
	// ManagedByMasterLease: the Endpoints of default/kubernetes, from the master leases.
	ManagedByMasterLease = "masterlease"
)

// Endpoints is one Endpoints object: a v1.Endpoints plus allocd's bookkeeping.
type Endpoints struct {
	Namespace, Name string
	Labels          map[string]string
	Annotations     map[string]string
	Subsets         []Subset
	// ServiceUID is the uid of the Service the controller wrote the object for.
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

// ObjectRef names the object behind an address or a slice's endpoint.
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
