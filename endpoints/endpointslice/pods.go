package endpointslice

import "github.com/allocd/allocd/endpoints/kube"

// What one Pod gives a Service's endpoints, read from the Pod (and the Service port)
// alone: the rules both controllers follow, as kube-controller-manager's Endpoints
// controller takes them from k8s.io/endpointslice (ShouldPodBeInEndpoints,
// ShouldSetHostname in util/controller_utils.go; FindPort in utils.go).

// ShouldPodBeInEndpoints reports whether p contributes an address at all: never when
// it is terminal (Failed or Succeeded, whatever publishNotReadyAddresses says, v1.25+),
// has no IP, or is terminating and terminating Pods are not included.
func ShouldPodBeInEndpoints(p *kube.Pod, includeTerminating bool) bool {
	switch {
	case p.Phase == kube.PhaseFailed || p.Phase == kube.PhaseSucceeded:
		return false
	case len(p.PodIPs) == 0:
		return false
	case p.Deleting && !includeTerminating:
		return false
	}
	return true
}

// FindPort resolves the target port of sp on p: a number as is (never checked against
// the containers); a name by the first container port with that name and sp's
// protocol, in containers, then in sidecars (init containers with restartPolicy
// Always, v1.32+). ok is false when no port matches.
func FindPort(p *kube.Pod, sp *kube.ServicePort) (int32, bool) {
	if sp.TargetPort.Name == "" {
		return sp.TargetPort.Number, true
	}
	for _, c := range p.Containers {
		if n, ok := namedPort(c, sp); ok {
			return n, true
		}
	}
	for _, c := range p.InitContainers {
		if c.RestartPolicy != kube.RestartPolicyAlways {
			continue
		}
		if n, ok := namedPort(c, sp); ok {
			return n, true
		}
	}
	return 0, false
}

func namedPort(c kube.Container, sp *kube.ServicePort) (int32, bool) {
	for _, cp := range c.Ports {
		if cp.Name == sp.TargetPort.Name && cp.Protocol == sp.Protocol {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

// ShouldSetHostname reports whether pod's endpoint for svc carries the Pod's hostname:
// when it has one and names the Service as its subdomain, in the Service's namespace.
func ShouldSetHostname(pod *kube.Pod, svc *kube.Service) bool {
	return pod.Hostname != "" && pod.Subdomain == svc.Name && pod.Namespace == svc.Namespace
}
