package endpoints

import "github.com/allocd/allocd/endpoints/kube"

// findPort resolves the target port of sp on p: a number as is (never checked against
// the containers); a name by the first container port with that name and sp's
// protocol, in containers, then in sidecars (init containers with restartPolicy
// Always, v1.32+). ok is false when no port matches.
func findPort(p *kube.Pod, sp *kube.ServicePort) (int32, bool) {
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
