package endpoints

import (
	"cmp"
	"slices"
	"strings"

	"github.com/allocd/allocd/endpoints/endpointslice"
	"github.com/allocd/allocd/endpoints/kube"
)

// ComputeSubsets returns the canonical subsets of svc over pods, which the caller has
// selected (the Service's namespace, its selector). Each Pod that should be in the
// Endpoints and has an address of the Service's family contributes its address on
// every Service port it resolves (or, for a Service with clusterIP None and no ports,
// with no port), ready when it is ready or the Service publishes not-ready addresses.
func ComputeSubsets(svc *kube.Service, pods []*kube.Pod) []kube.Subset {
	if out, ok := onePortSubsets(svc, pods); ok {
		return out
	}
	return repackedSubsets(svc, pods)
}

// repackedSubsets is ComputeSubsets in general: a subset per Pod and port, repacked.
func repackedSubsets(svc *kube.Service, pods []*kube.Pod) []kube.Subset {
	var subsets []kube.Subset
	for _, p := range pods {
		if !endpointslice.ShouldPodBeInEndpoints(p, svc.PublishNotReadyAddresses) {
			continue
		}
		a, ok := podAddress(svc, p)
		if !ok {
			continue
		}
		ready := svc.PublishNotReadyAddresses || p.Ready
		if len(svc.Ports) == 0 {
			if svc.ClusterIP() == "None" {
				subsets = append(subsets, oneSubset(a, nil, ready))
			}
			continue
		}
		for i := range svc.Ports {
			sp := &svc.Ports[i]
			n, ok := endpointslice.FindPort(p, sp)
			if !ok {
				continue
			}
			port := kube.Port{Name: sp.Name, Port: n, Protocol: sp.Protocol, AppProtocol: sp.AppProtocol}
			subsets = append(subsets, oneSubset(a, []kube.Port{port}, ready))
		}
	}
	return Repack(subsets)
}

// onePortSubsets is ComputeSubsets for the common case, without Repack's maps: a
// Service with one port that every Pod resolves to the same number, or none, or a
// headless one without ports. Its result is Repack's: at most one subset, each
// address (by IP and target uid) once as its first Pod gave it, not ready if any of
// its Pods is not, in compareAddresses' order. ok is false in any other case.
func onePortSubsets(svc *kube.Service, pods []*kube.Pod) (out []kube.Subset, ok bool) {
	switch {
	case len(svc.Ports) > 1:
		return nil, false
	case len(svc.Ports) == 0 && svc.ClusterIP() != "None":
		return make([]kube.Subset, 0), true // no Pod contributes
	}
	entries := make([]readyAddress, 0, len(pods))
	var port kube.Port
	for _, p := range pods {
		if !endpointslice.ShouldPodBeInEndpoints(p, svc.PublishNotReadyAddresses) {
			continue
		}
		a, found := podAddress(svc, p)
		if !found {
			continue
		}
		if len(svc.Ports) == 1 {
			sp := &svc.Ports[0]
			n, found := endpointslice.FindPort(p, sp)
			switch {
			case !found:
				continue
			case len(entries) > 0 && n != port.Port:
				return nil, false // two port numbers: two subsets, Repack's case
			}
			port = kube.Port{Name: sp.Name, Port: n, Protocol: sp.Protocol, AppProtocol: sp.AppProtocol}
		}
		entries = append(entries, readyAddress{a, svc.PublishNotReadyAddresses || p.Ready})
	}
	if len(entries) == 0 {
		return make([]kube.Subset, 0), true
	}
	sub := mergeAddresses(entries)
	if port.Port > 0 { // as Repack: neither "no port" nor a port 0 is listed
		sub.Ports = []kube.Port{port}
	}
	return []kube.Subset{sub}, true
}

// readyAddress is an address a Pod gives, and whether it is ready.
type readyAddress struct {
	a     kube.Address
	ready bool
}

// mergeAddresses is the subset of one port's addresses, as Repack merges them.
func mergeAddresses(entries []readyAddress) kube.Subset {
	// By IP and target uid, first Pod first: an address's copies are then next to
	// each other, and distinct addresses in compareAddresses' order.
	slices.SortStableFunc(entries, func(x, y readyAddress) int {
		kx, ky := keyOf(&x.a), keyOf(&y.a)
		return cmp.Or(strings.Compare(kx.ip, ky.ip), strings.Compare(kx.uid, ky.uid))
	})
	var sub kube.Subset
	for i := 0; i < len(entries); {
		e, k := entries[i], keyOf(&entries[i].a)
		for i++; i < len(entries) && keyOf(&entries[i].a) == k; i++ {
			e.ready = e.ready && entries[i].ready
		}
		if e.ready {
			sub.Addresses = append(sub.Addresses, e.a)
		} else {
			sub.NotReadyAddresses = append(sub.NotReadyAddresses, e.a)
		}
	}
	return sub
}

func oneSubset(a kube.Address, ports []kube.Port, ready bool) kube.Subset {
	if ready {
		return kube.Subset{Addresses: []kube.Address{a}, Ports: ports}
	}
	return kube.Subset{NotReadyAddresses: []kube.Address{a}, Ports: ports}
}

// addrKey identifies an address: its IP and the uid of its target (Kubernetes keeps
// two Pods with one IP apart, for attribution).
type addrKey struct{ ip, uid string }

func keyOf(a *kube.Address) addrKey {
	k := addrKey{ip: a.IP}
	if a.TargetRef != nil {
		k.uid = a.TargetRef.UID
	}
	return k
}

// portKey identifies a port by value (appProtocol's value, not its pointer).
type portKey struct {
	name, protocol, app string
	hasApp              bool
	port                int32
}

func keyOfPort(p kube.Port) portKey {
	k := portKey{name: p.Name, protocol: p.Protocol, port: p.Port}
	if p.AppProtocol != nil {
		k.app, k.hasApp = *p.AppProtocol, true
	}
	return k
}

// noPort stands for "no port" (a headless Service without ports), as Kubernetes'
// sentinel port -1.
var noPort = portKey{port: -1}

// Repack returns subsets in canonical form (Kubernetes' RepackSubsets): every
// (address, port) pair once, an address not ready on a port where it is both ready
// and not ready, the first copy of an address (by IP and target uid) kept, and one
// subset per distinct set of (address, readiness) with every port that has exactly
// that set. Order, used both to store and to compare: addresses by IP (byte-wise, as
// Kubernetes sorts them) then target uid, no target first; ports by name, number,
// protocol and appProtocol; subsets by their ports, then their addresses. (Kubernetes
// orders ports and subsets by a hash of their content; allocd does not reproduce it.)
func Repack(subsets []kube.Subset) []kube.Subset {
	addrs := map[addrKey]*kube.Address{}
	byPort := map[portKey]map[addrKey]bool{} // port -> address -> ready
	var portOf = map[portKey]kube.Port{}
	add := func(a *kube.Address, pk portKey, ready bool) {
		k := keyOf(a)
		if _, ok := addrs[k]; !ok {
			cp := *a
			addrs[k] = &cp
		}
		set := byPort[pk]
		if set == nil {
			set = map[addrKey]bool{}
			byPort[pk] = set
		}
		if was, ok := set[k]; !ok || was {
			set[k] = ready
		}
	}
	for i := range subsets {
		s := &subsets[i]
		pks := []portKey{noPort}
		if len(s.Ports) > 0 {
			pks = pks[:0]
			for _, p := range s.Ports {
				pk := keyOfPort(p)
				portOf[pk] = p
				pks = append(pks, pk)
			}
		}
		for _, pk := range pks {
			for j := range s.Addresses {
				add(&s.Addresses[j], pk, true)
			}
			for j := range s.NotReadyAddresses {
				add(&s.NotReadyAddresses[j], pk, false)
			}
		}
	}
	type group struct {
		set   map[addrKey]bool
		ports []kube.Port
	}
	groups := map[string]*group{}
	for pk, set := range byPort {
		sig := signature(set)
		g := groups[sig]
		if g == nil {
			g = &group{set: set}
			groups[sig] = g
		}
		if pk.port > 0 { // as upstream: neither the "no port" sentinel nor a port 0 is listed
			g.ports = append(g.ports, portOf[pk])
		}
	}
	out := make([]kube.Subset, 0, len(groups))
	for _, g := range groups {
		var s kube.Subset
		for k, ready := range g.set {
			if ready {
				s.Addresses = append(s.Addresses, *addrs[k])
			} else {
				s.NotReadyAddresses = append(s.NotReadyAddresses, *addrs[k])
			}
		}
		s.Ports = g.ports
		sortSubset(&s)
		out = append(out, s)
	}
	slices.SortFunc(out, compareSubsets)
	return out
}

// signature is a string naming a set of (address, readiness).
func signature(set map[addrKey]bool) string {
	keys := make([]addrKey, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	slices.SortFunc(keys,
		func(a, b addrKey) int { return cmp.Or(strings.Compare(a.ip, b.ip), strings.Compare(a.uid, b.uid)) })
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k.ip)
		b.WriteByte(0)
		b.WriteString(k.uid)
		if set[k] {
			b.WriteByte('+')
		} else {
			b.WriteByte('-')
		}
	}
	return b.String()
}

func sortSubset(s *kube.Subset) {
	slices.SortFunc(s.Addresses, compareAddresses)
	slices.SortFunc(s.NotReadyAddresses, compareAddresses)
	slices.SortFunc(s.Ports, comparePorts)
}

// compareAddresses orders as Kubernetes' LessEndpointAddress: IP byte-wise, then the
// target's uid, an address without target first.
func compareAddresses(a, b kube.Address) int {
	if c := strings.Compare(a.IP, b.IP); c != 0 {
		return c
	}
	switch {
	case a.TargetRef == nil && b.TargetRef == nil:
		return 0
	case a.TargetRef == nil:
		return -1
	case b.TargetRef == nil:
		return 1
	}
	return strings.Compare(a.TargetRef.UID, b.TargetRef.UID)
}

func comparePorts(a, b kube.Port) int {
	ka, kb := keyOfPort(a), keyOfPort(b)
	c := cmp.Or(strings.Compare(ka.name, kb.name), cmp.Compare(ka.port, kb.port),
		strings.Compare(ka.protocol, kb.protocol))
	if c != 0 {
		return c
	}
	if ka.hasApp != kb.hasApp {
		if !ka.hasApp {
			return -1
		}
		return 1
	}
	return strings.Compare(ka.app, kb.app)
}

func compareSubsets(a, b kube.Subset) int {
	if c := slices.CompareFunc(a.Ports, b.Ports, comparePorts); c != 0 {
		return c
	}
	if c := slices.CompareFunc(a.Addresses, b.Addresses, compareAddresses); c != 0 {
		return c
	}
	return slices.CompareFunc(a.NotReadyAddresses, b.NotReadyAddresses, compareAddresses)
}

// CountAddresses counts the ready and not-ready address entries of every subset (an
// address in two subsets counts twice, as Kubernetes counts them).
func CountAddresses(subsets []kube.Subset) (ready, notReady int) {
	for _, s := range subsets {
		ready += len(s.Addresses)
		notReady += len(s.NotReadyAddresses)
	}
	return ready, notReady
}

// subsetsEqual reports whether a and b are the same subsets, in the same order (both
// canonical): nil and empty are equal, appProtocols compare by value, and targets by
// kind, namespace, name and uid (Kubernetes ignores their resourceVersion, #50936).
func subsetsEqual(a, b []kube.Subset) bool {
	return slices.EqualFunc(a, b, func(x, y kube.Subset) bool {
		return slices.EqualFunc(x.Addresses, y.Addresses, addressEqual) &&
			slices.EqualFunc(x.NotReadyAddresses, y.NotReadyAddresses, addressEqual) &&
			slices.EqualFunc(x.Ports, y.Ports, func(p, q kube.Port) bool {
				return keyOfPort(p) == keyOfPort(q)
			})
	})
}

func addressEqual(a, b kube.Address) bool {
	if a.IP != b.IP || a.Hostname != b.Hostname || a.NodeName != b.NodeName ||
		(a.TargetRef == nil) != (b.TargetRef == nil) {
		return false
	}
	return a.TargetRef == nil || *a.TargetRef == *b.TargetRef
}
