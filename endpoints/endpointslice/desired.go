package endpointslice

import (
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/allocd/allocd/endpoints/kube"
)

// This file holds what the EndpointSlice controller wants of one Service: per address
// type, the endpoints of its Pods grouped by the ports they resolve (k8s.io/endpointslice's
// podToEndpoint, getEndpointPorts and getAddressTypesForService in utils.go).

// addressTypes returns the address types of svc's slices: one per ipFamily; else
// the family of its cluster IP; else (headless without families) both. IPv4 first.
func addressTypes(svc *kube.Service) []string {
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

// EndpointPorts resolves svc's ports on pod, in the order allocd writes them: a named
// target port the Pod lacks is left out, so Pods resolving different ports land in
// different groups (getEndpointPorts).
func EndpointPorts(svc *kube.Service, pod *kube.Pod) []kube.Port {
	out := make([]kube.Port, 0, len(svc.Ports))
	for i := range svc.Ports {
		sp := &svc.Ports[i]
		n, ok := FindPort(pod, sp)
		if !ok {
			continue
		}
		out = append(out, kube.Port{Name: sp.Name, Port: n, Protocol: sp.Protocol,
			AppProtocol: sp.AppProtocol})
	}
	sortPorts(out)
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

// Endpoint is the endpoint of pod in a slice of addrType for svc (podToEndpoint):
// the Pod's IPs of that family, the three conditions, the Pod as target, its node and
// the node's zone (node nil: unknown), and the hostname when the Pod names the Service
// as its subdomain.
func Endpoint(svc *kube.Service, pod *kube.Pod, node *kube.Node, addrType string) kube.SliceEndpoint {
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
	if ShouldSetHostname(pod, svc) {
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

// group is the endpoints one port group of one address type wants.
type group struct {
	ports     []kube.Port
	endpoints []kube.SliceEndpoint // sorted by key
	keys      []string             // endpointKey of each
}

// NodeLookup finds a Node by name (nil, false when the feed has none of that name).
type NodeLookup func(name string) (*kube.Node, bool)

// Desired is what a Service's Pods make of its slices: for each address type of the
// Service, the endpoints grouped by the ports they resolve.
type Desired struct {
	groups map[string]map[string]*group // address type -> ports key -> group
	// Skipped names the Pods left out because their Node is not known (the same Pods
	// for every address type): the sync reports them and tries again, as upstream does.
	Skipped []string
}

// Desire computes what pods (the Pods svc selects) make of svc's slices; nodes finds
// their Nodes (an endpoint's zone).
func Desire(svc *kube.Service, pods []*kube.Pod, nodes NodeLookup) *Desired {
	d := &Desired{groups: map[string]map[string]*group{}}
	for _, at := range addressTypes(svc) {
		groups, skipped := desiredEndpoints(svc, pods, nodes, at)
		d.groups[at] = groups
		if len(skipped) > len(d.Skipped) {
			d.Skipped = skipped
		}
	}
	return d
}

// desiredEndpoints groups the endpoints of pods (the Service's selected Pods) for one
// address type by port key. A Pod whose Node is unknown is left out unless the
// Service publishes not-ready addresses (then it has no zone); skipped counts those
// left out (the sync reports them and tries again, as upstream does). A Pod without an
// address of the type still makes its port group exist.
func desiredEndpoints(svc *kube.Service, pods []*kube.Pod, nodes NodeLookup,
	addrType string) (groups map[string]*group, skipped []string) {
	groups = map[string]*group{}
	for _, pod := range pods {
		if !ShouldPodBeInEndpoints(pod, true) {
			continue
		}
		ports := EndpointPorts(svc, pod)
		key := portsKey(ports)
		g := groups[key]
		if g == nil {
			g = &group{ports: ports}
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
		e := Endpoint(svc, pod, node, addrType)
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
func sortEndpoints(g *group) {
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
type byKey group

func (g *byKey) Len() int           { return len(g.keys) }
func (g *byKey) Less(i, j int) bool { return g.keys[i] < g.keys[j] }
func (g *byKey) Swap(i, j int) {
	g.keys[i], g.keys[j] = g.keys[j], g.keys[i]
	g.endpoints[i], g.endpoints[j] = g.endpoints[j], g.endpoints[i]
}

// sortPorts sorts ports by name, protocol and number: the order allocd writes.
// (Kubernetes sorts them by a hash of each; consumers take them as a set.)
func sortPorts(ps []kube.Port) {
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
