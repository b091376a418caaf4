package endpoints

import (
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/allocd/allocd/endpoints/kube"
)

// This file holds what the EndpointSlice controller wants of one Service: per address
// type, the endpoints of its Pods grouped by the ports they resolve (the library's
// podToEndpoint, getEndpointPorts and getAddressTypesForService; reference a.4, a.5).

// sliceAddressTypes returns the address types of svc's slices: one per ipFamily; else
// the family of its cluster IP; else (headless without families) both. IPv4 first.
func sliceAddressTypes(svc *kube.Service) []string {
	var v4, v6 bool
	for _, f := range svc.IPFamilies {
		v4 = v4 || f == kube.FamilyIPv4
		v6 = v6 || f == kube.FamilyIPv6
	}
	switch {
	case v4 || v6:
	case !svc.Headless():
		v6 = kube.IsIPv6(svc.ClusterIP())
		v4 = !v6
	default:
		v4, v6 = true, true
	}
	var out []string
	if v4 {
		out = append(out, kube.AddressTypeIPv4)
	}
	if v6 {
		out = append(out, kube.AddressTypeIPv6)
	}
	return out
}

// slicePorts resolves svc's ports on pod, in the order allocd writes them: a named
// target port the Pod lacks is left out, so Pods resolving different ports land in
// different groups.
func slicePorts(svc *kube.Service, pod *kube.Pod) []kube.Port {
	out := make([]kube.Port, 0, len(svc.Ports))
	for i := range svc.Ports {
		sp := &svc.Ports[i]
		n, ok := findPort(pod, sp)
		if !ok {
			continue
		}
		out = append(out, kube.Port{Name: sp.Name, Port: n, Protocol: sp.Protocol, AppProtocol: sp.AppProtocol})
	}
	sortSlicePorts(out)
	return out
}

// portsKey identifies a group of slices by its ports, sorted (nil and empty alike, as
// upstream since v1.36).
func portsKey(ps []kube.Port) string {
	var b strings.Builder
	for _, p := range ps {
		b.WriteString(p.Name)
		b.WriteByte(0)
		b.WriteString(p.Protocol)
		b.WriteByte(0)
		b.WriteString(strconv.Itoa(int(p.Port)))
		if p.AppProtocol != nil {
			b.WriteByte(0)
			b.WriteString(*p.AppProtocol)
		}
		b.WriteByte(1)
	}
	return b.String()
}

// sliceEndpoint is the endpoint of pod in a slice of addrType for svc (podToEndpoint):
// the Pod's IPs of that family, the three conditions, the Pod as target, its node and
// the node's zone (node nil: unknown), and the hostname when the Pod names the Service
// as its subdomain.
func sliceEndpoint(svc *kube.Service, pod *kube.Pod, node *kube.Node, addrType string) kube.SliceEndpoint {
	serving, terminating := pod.Ready, pod.Deleting
	e := kube.SliceEndpoint{
		Ready:       kube.Bool(svc.PublishNotReadyAddresses || (serving && !terminating)),
		Serving:     kube.Bool(serving),
		Terminating: kube.Bool(terminating),
		NodeName:    pod.NodeName,
		TargetRef:   &kube.ObjectRef{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
	}
	for _, ip := range pod.PodIPs {
		if kube.IsIPv6(ip) == (addrType == kube.AddressTypeIPv6) {
			e.Addresses = append(e.Addresses, ip)
		}
	}
	if node != nil {
		e.Zone = node.Zone()
	}
	if pod.Hostname != "" && pod.Subdomain == svc.Name && pod.Namespace == svc.Namespace {
		e.Hostname = pod.Hostname
	}
	return e
}

// endpointKey is an endpoint's identity (the library's hashEndpoint): its sorted
// addresses, hostname, and target's namespace and name; not its uid, conditions, node
// or zone, which change in place.
func endpointKey(e *kube.SliceEndpoint) string {
	addrs := e.Addresses
	if !slices.IsSorted(addrs) {
		addrs = slices.Sorted(slices.Values(addrs))
	}
	var b strings.Builder
	for _, a := range addrs {
		b.WriteString(a)
		b.WriteByte(',')
	}
	b.WriteByte(0)
	b.WriteString(e.Hostname)
	if r := e.TargetRef; r != nil {
		b.WriteByte(0)
		b.WriteString(r.Namespace)
		b.WriteByte(0)
		b.WriteString(r.Name)
	}
	return b.String()
}

// equalBeyondKey reports whether two endpoints of one identity are the same in what
// else the controller writes (EndpointsEqualBeyondHash): node, zone, conditions and
// target. Hints are not compared.
func equalBeyondKey(a, b *kube.SliceEndpoint) bool {
	return a.NodeName == b.NodeName && a.Zone == b.Zone &&
		boolPtrEqual(a.Ready, b.Ready) && boolPtrEqual(a.Serving, b.Serving) &&
		boolPtrEqual(a.Terminating, b.Terminating) && refEqual(a.TargetRef, b.TargetRef)
}

func boolPtrEqual(a, b *bool) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func refEqual(a, b *kube.ObjectRef) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// desiredGroup is the endpoints one port group of one address type wants.
type desiredGroup struct {
	ports     []kube.Port
	endpoints []kube.SliceEndpoint // sorted by key
	keys      []string             // endpointKey of each
}

// nodeLookup finds a Node by name (nil, false when the feed has none of that name).
type nodeLookup func(name string) (*kube.Node, bool)

// desiredEndpoints groups the endpoints of pods (the Service's selected Pods) for one
// address type by port key. A Pod whose Node is unknown is left out unless the
// Service publishes not-ready addresses (then it has no zone); skipped counts those
// left out (the sync reports them and tries again, as upstream does). A Pod without an
// address of the type still makes its port group exist.
func desiredEndpoints(svc *kube.Service, pods []*kube.Pod, nodes nodeLookup, addrType string) (groups map[string]*desiredGroup, skipped []string) {
	groups = map[string]*desiredGroup{}
	for _, pod := range pods {
		if !shouldPodBeInEndpoints(pod, true) {
			continue
		}
		ports := slicePorts(svc, pod)
		key := portsKey(ports)
		g := groups[key]
		if g == nil {
			g = &desiredGroup{ports: ports}
			if len(groups) == 0 {
				g.endpoints = make([]kube.SliceEndpoint, 0, len(pods)) // most Services: one group
			}
			groups[key] = g
		}
		node, ok := nodes(pod.NodeName)
		if !ok {
			if !svc.PublishNotReadyAddresses {
				skipped = append(skipped, pod.Name)
				continue
			}
			node = nil
		}
		e := sliceEndpoint(svc, pod, node, addrType)
		if len(e.Addresses) > 0 {
			g.endpoints = append(g.endpoints, e)
		}
	}
	for _, g := range groups {
		g.keys = make([]string, len(g.endpoints))
		for i := range g.endpoints {
			g.keys[i] = endpointKey(&g.endpoints[i])
		}
		sortEndpoints(g)
	}
	return groups, skipped
}

// sortEndpoints sorts a group's endpoints by key, in place, dropping a second endpoint
// of one identity (two Pods cannot share a namespace and name).
func sortEndpoints(g *desiredGroup) {
	sort.Sort((*byKey)(g))
	n := 0
	for i := range g.keys {
		if n > 0 && g.keys[n-1] == g.keys[i] {
			continue
		}
		g.keys[n], g.endpoints[n] = g.keys[i], g.endpoints[i]
		n++
	}
	g.keys, g.endpoints = g.keys[:n], g.endpoints[:n]
}

// byKey sorts a group's endpoints and keys together, by key.
type byKey desiredGroup

func (g *byKey) Len() int           { return len(g.keys) }
func (g *byKey) Less(i, j int) bool { return g.keys[i] < g.keys[j] }
func (g *byKey) Swap(i, j int) {
	g.keys[i], g.keys[j] = g.keys[j], g.keys[i]
	g.endpoints[i], g.endpoints[j] = g.endpoints[j], g.endpoints[i]
}
