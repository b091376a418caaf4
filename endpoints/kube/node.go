package kube

// Labels of a Node that the EndpointSlice controller reads.
const (
	// LabelZone is a Node's zone, copied to its endpoints.
	LabelZone = "topology.kubernetes.io/zone"
	// LabelControlPlane keeps a Node out of the topology hints' CPU shares.
	LabelControlPlane = "node-role.kubernetes.io/control-plane"
	// LabelMaster is LabelControlPlane's older name, which keeps a Node out too.
	LabelMaster = "node-role.kubernetes.io/master"
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
