package kube

import "time"

// Pod phases, as Kubernetes spells them.
const (
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
)

// RestartPolicyAlways on an init container makes it a sidecar.
const RestartPolicyAlways = "Always"

// Pod is what the controllers need of a Kubernetes Pod.
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
