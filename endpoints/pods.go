package endpoints

import (
	"maps"
	"slices"

	"github.com/allocd/allocd/endpoints/endpointslice"
	"github.com/allocd/allocd/endpoints/kube"
)

// selects reports whether labels carry every pair of selector. A nil selector selects
// nothing; an empty one selects everything (the feed turns an empty selector into nil,
// as the API server stores it).
func selects(selector, labels map[string]string) bool {
	if selector == nil {
		return false
	}
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// podAddress returns the address of p for svc: the first of the Pod's IPs of the
// Service's family, which is its first ipFamily, else the family of its cluster IP,
// else (headless, no families) the family of the Pod's first IP. ok is false when the
// Pod has no IP of that family.
func podAddress(svc *kube.Service, p *kube.Pod) (kube.Address, bool) {
	v6 := false
	switch {
	case len(svc.IPFamilies) > 0:
		v6 = svc.IPFamilies[0] == kube.FamilyIPv6
	case !svc.Headless():
		v6 = kube.IsIPv6(svc.ClusterIP())
	case len(p.PodIPs) > 0:
		v6 = kube.IsIPv6(p.PodIPs[0])
	}
	for _, ip := range p.PodIPs {
		if kube.IsIPv6(ip) != v6 {
			continue
		}
		if c, ok := kube.CanonicalIP(ip); ok {
			ip = c
		}
		a := kube.Address{IP: ip, NodeName: p.NodeName,
			TargetRef: &kube.ObjectRef{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID}}
		if endpointslice.ShouldSetHostname(p, svc) {
			a.Hostname = p.Hostname
		}
		return a, true
	}
	return kube.Address{}, false
}

// podChange tells how cur differs from old for the controller, as Kubernetes'
// podEndpointsChanged: podChanged when the Pod is or was terminating (upstream compares
// deletionTimestamp pointers, which differ between two copies), its readiness flipped,
// or its IPs changed; labelsChanged when its labels, hostname or subdomain changed.
// Other changes (phase alone, node name, ports) enqueue nothing, as upstream: the new
// state is still what the next sync of its Services reads.
func podChange(old, cur *kube.Pod) (podChanged, labelsChanged bool) {
	labelsChanged = !maps.Equal(old.Labels, cur.Labels) || old.Hostname != cur.Hostname ||
		old.Subdomain != cur.Subdomain
	podChanged = old.Deleting || cur.Deleting || old.Ready != cur.Ready ||
		!slices.Equal(old.PodIPs, cur.PodIPs)
	return podChanged, labelsChanged
}
