package endpoints

import (
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
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

// shouldPodBeInEndpoints reports whether p contributes an address at all: never when
// it is terminal (Failed or Succeeded, whatever publishNotReadyAddresses says, v1.25+),
// has no IP, or is terminating and terminating Pods are not included.
func shouldPodBeInEndpoints(p *Pod, includeTerminating bool) bool {
	switch {
	case p.Phase == PhaseFailed || p.Phase == PhaseSucceeded:
		return false
	case len(p.PodIPs) == 0:
		return false
	case p.Deleting && !includeTerminating:
		return false
	}
	return true
}

// parseIPSloppy parses an IP as Kubernetes' ParseIPSloppy: IPv4 octets with leading
// zeros are decimal, and an IPv4-mapped IPv6 address is IPv4.
func parseIPSloppy(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err == nil {
		return a.Unmap(), true
	}
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return netip.Addr{}, false
	}
	var b [4]byte
	for i, p := range parts {
		if p == "" || len(p) > 3 {
			return netip.Addr{}, false
		}
		n, err := strconv.Atoi(p)
		if err != nil || n > 255 {
			return netip.Addr{}, false
		}
		b[i] = byte(n)
	}
	return netip.AddrFrom4(b), true
}

// CanonicalIP returns s as Kubernetes publishes it (ParseIPSloppy(s).String()): IPv6
// compressed, IPv4 without leading zeros. ok is false when s is not an IP.
func CanonicalIP(s string) (string, bool) {
	a, ok := parseIPSloppy(s)
	if !ok {
		return "", false
	}
	return a.String(), true
}

// isIPv6 reports whether s is an IPv6 address (utilnet.IsIPv6String: an unparseable
// string is not).
func isIPv6(s string) bool {
	a, ok := parseIPSloppy(s)
	return ok && a.Is6()
}

// isHeadless reports whether the Service has no cluster IP ("" or "None").
func isHeadless(svc *Service) bool {
	ip := svc.ClusterIP()
	return ip == "" || ip == "None"
}

// podAddress returns the address of p for svc: the first of the Pod's IPs of the
// Service's family, which is its first ipFamily, else the family of its cluster IP,
// else (headless, no families) the family of the Pod's first IP. ok is false when the
// Pod has no IP of that family.
func podAddress(svc *Service, p *Pod) (Address, bool) {
	v6 := false
	switch {
	case len(svc.IPFamilies) > 0:
		v6 = svc.IPFamilies[0] == FamilyIPv6
	case !isHeadless(svc):
		v6 = isIPv6(svc.ClusterIP())
	case len(p.PodIPs) > 0:
		v6 = isIPv6(p.PodIPs[0])
	}
	for _, ip := range p.PodIPs {
		if isIPv6(ip) != v6 {
			continue
		}
		if c, ok := CanonicalIP(ip); ok {
			ip = c
		}
		a := Address{IP: ip, NodeName: p.NodeName,
			TargetRef: &ObjectRef{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID}}
		if p.Hostname != "" && p.Subdomain == svc.Name && p.Namespace == svc.Namespace {
			a.Hostname = p.Hostname
		}
		return a, true
	}
	return Address{}, false
}

// podChange tells how cur differs from old for the controller, as Kubernetes'
// podEndpointsChanged: podChanged when the Pod is or was terminating (upstream compares
// deletionTimestamp pointers, which differ between two copies), its readiness flipped,
// or its IPs changed; labelsChanged when its labels, hostname or subdomain changed.
// Other changes (phase alone, node name, ports) enqueue nothing, as upstream: the new
// state is still what the next sync of its Services reads.
func podChange(old, cur *Pod) (podChanged, labelsChanged bool) {
	labelsChanged = !maps.Equal(old.Labels, cur.Labels) || old.Hostname != cur.Hostname ||
		old.Subdomain != cur.Subdomain
	podChanged = old.Deleting || cur.Deleting || old.Ready != cur.Ready ||
		!slices.Equal(old.PodIPs, cur.PodIPs)
	return podChanged, labelsChanged
}
