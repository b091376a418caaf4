package endpoints

import (
	"cmp"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Selects reports whether labels carry every pair of selector. A nil selector selects
// nothing; an empty one selects everything (the feed turns an empty selector into nil,
// as the API server stores it).
func Selects(selector, labels map[string]string) bool {
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

// ShouldPodBeInEndpoints reports whether p contributes an address at all: never when
// it is terminal (Failed or Succeeded, whatever publishNotReadyAddresses says, v1.25+),
// has no IP, or is terminating and terminating Pods are not included.
func ShouldPodBeInEndpoints(p *Pod, includeTerminating bool) bool {
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

// PodAddress returns the address of p for svc: the first of the Pod's IPs of the
// Service's family, which is its first ipFamily, else the family of its cluster IP,
// else (headless, no families) the family of the Pod's first IP. ok is false when the
// Pod has no IP of that family.
func PodAddress(svc *Service, p *Pod) (Address, bool) {
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

// FindPort resolves the target port of sp on p: a number as is (never checked against
// the containers); a name by the first container port with that name and sp's
// protocol, in containers, then in sidecars (init containers with restartPolicy
// Always, v1.32+). ok is false when no port matches.
func FindPort(p *Pod, sp *ServicePort) (int32, bool) {
	if sp.TargetPort.Name == "" {
		return sp.TargetPort.Number, true
	}
	for _, c := range p.Containers {
		if n, ok := namedPort(c, sp); ok {
			return n, true
		}
	}
	for _, c := range p.InitContainers {
		if c.RestartPolicy != RestartPolicyAlways {
			continue
		}
		if n, ok := namedPort(c, sp); ok {
			return n, true
		}
	}
	return 0, false
}

func namedPort(c Container, sp *ServicePort) (int32, bool) {
	for _, cp := range c.Ports {
		if cp.Name == sp.TargetPort.Name && cp.Protocol == sp.Protocol {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

// ComputeSubsets returns the canonical subsets of svc over pods, which the caller has
// selected (the Service's namespace, its selector). Each Pod that should be in the
// Endpoints and has an address of the Service's family contributes its address on
// every Service port it resolves (or, for a Service with clusterIP None and no ports,
// with no port), ready when it is ready or the Service publishes not-ready addresses.
func ComputeSubsets(svc *Service, pods []*Pod) []Subset {
	if out, ok := onePortSubsets(svc, pods); ok {
		return out
	}
	return repackedSubsets(svc, pods)
}

// repackedSubsets is ComputeSubsets in general: a subset per Pod and port, repacked.
func repackedSubsets(svc *Service, pods []*Pod) []Subset {
	var subsets []Subset
	for _, p := range pods {
		if !ShouldPodBeInEndpoints(p, svc.PublishNotReadyAddresses) {
			continue
		}
		a, ok := PodAddress(svc, p)
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
			n, ok := FindPort(p, sp)
			if !ok {
				continue
			}
			port := Port{Name: sp.Name, Port: n, Protocol: sp.Protocol, AppProtocol: sp.AppProtocol}
			subsets = append(subsets, oneSubset(a, []Port{port}, ready))
		}
	}
	return Repack(subsets)
}

// onePortSubsets is ComputeSubsets for the common case, without Repack's maps: a
// Service with one port that every Pod resolves to the same number, or none, or a
// headless one without ports. Its result is Repack's: at most one subset, each
// address (by IP and target uid) once as its first Pod gave it, not ready if any of
// its Pods is not, in compareAddresses' order. ok is false in any other case.
func onePortSubsets(svc *Service, pods []*Pod) (out []Subset, ok bool) {
	switch {
	case len(svc.Ports) > 1:
		return nil, false
	case len(svc.Ports) == 0 && svc.ClusterIP() != "None":
		return make([]Subset, 0), true // no Pod contributes
	}
	type entry struct {
		a     Address
		ready bool
	}
	entries := make([]entry, 0, len(pods))
	var port Port
	for _, p := range pods {
		if !ShouldPodBeInEndpoints(p, svc.PublishNotReadyAddresses) {
			continue
		}
		a, found := PodAddress(svc, p)
		if !found {
			continue
		}
		if len(svc.Ports) == 1 {
			sp := &svc.Ports[0]
			n, found := FindPort(p, sp)
			switch {
			case !found:
				continue
			case len(entries) > 0 && n != port.Port:
				return nil, false // two port numbers: two subsets, Repack's case
			}
			port = Port{Name: sp.Name, Port: n, Protocol: sp.Protocol, AppProtocol: sp.AppProtocol}
		}
		entries = append(entries, entry{a, svc.PublishNotReadyAddresses || p.Ready})
	}
	if len(entries) == 0 {
		return make([]Subset, 0), true
	}
	// By IP and target uid, first Pod first: an address's copies are then next to
	// each other, and distinct addresses in compareAddresses' order.
	slices.SortStableFunc(entries, func(x, y entry) int {
		kx, ky := keyOf(&x.a), keyOf(&y.a)
		return cmp.Or(strings.Compare(kx.ip, ky.ip), strings.Compare(kx.uid, ky.uid))
	})
	var sub Subset
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
	if port.Port > 0 { // as Repack: neither "no port" nor a port 0 is listed
		sub.Ports = []Port{port}
	}
	return []Subset{sub}, true
}

func oneSubset(a Address, ports []Port, ready bool) Subset {
	if ready {
		return Subset{Addresses: []Address{a}, Ports: ports}
	}
	return Subset{NotReadyAddresses: []Address{a}, Ports: ports}
}

// addrKey identifies an address: its IP and the uid of its target (Kubernetes keeps
// two Pods with one IP apart, for attribution).
type addrKey struct{ ip, uid string }

func keyOf(a *Address) addrKey {
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

func keyOfPort(p Port) portKey {
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
func Repack(subsets []Subset) []Subset {
	addrs := map[addrKey]*Address{}
	byPort := map[portKey]map[addrKey]bool{} // port -> address -> ready
	var portOf = map[portKey]Port{}
	add := func(a *Address, pk portKey, ready bool) {
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
		ports []Port
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
	out := make([]Subset, 0, len(groups))
	for _, g := range groups {
		var s Subset
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
	slices.SortFunc(keys, func(a, b addrKey) int { return cmp.Or(strings.Compare(a.ip, b.ip), strings.Compare(a.uid, b.uid)) })
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

func sortSubset(s *Subset) {
	slices.SortFunc(s.Addresses, compareAddresses)
	slices.SortFunc(s.NotReadyAddresses, compareAddresses)
	slices.SortFunc(s.Ports, comparePorts)
}

// compareAddresses orders as Kubernetes' LessEndpointAddress: IP byte-wise, then the
// target's uid, an address without target first.
func compareAddresses(a, b Address) int {
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

func comparePorts(a, b Port) int {
	ka, kb := keyOfPort(a), keyOfPort(b)
	c := cmp.Or(strings.Compare(ka.name, kb.name), cmp.Compare(ka.port, kb.port), strings.Compare(ka.protocol, kb.protocol))
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

func compareSubsets(a, b Subset) int {
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
func CountAddresses(subsets []Subset) (ready, notReady int) {
	for _, s := range subsets {
		ready += len(s.Addresses)
		notReady += len(s.NotReadyAddresses)
	}
	return ready, notReady
}

// Truncate cuts subsets to at most max address entries as Kubernetes does (v1.22+):
// when the ready ones fit, every ready address is kept and the rest of the budget is
// shared over the not-ready lists in proportion to their sizes (each share rounded up,
// capped by what is left, in subset order); otherwise every not-ready address goes and
// max is shared over the ready lists the same way. Each list keeps its first entries.
// subsets is not modified; truncated is false (and out is subsets) when they fit.
func Truncate(subsets []Subset, max int) (out []Subset, truncated bool) {
	ready, notReady := CountAddresses(subsets)
	if ready+notReady <= max {
		return subsets, false
	}
	truncateReady := ready > max
	budget, total := max-ready, notReady
	if truncateReady {
		budget, total = max, ready
	}
	left := budget
	out = make([]Subset, len(subsets))
	for i, s := range subsets {
		n := len(s.NotReadyAddresses)
		if truncateReady {
			n = len(s.Addresses)
		}
		take := int(math.Ceil(float64(n) / float64(total) * float64(budget)))
		take = min(take, left)
		if truncateReady {
			s.Addresses = s.Addresses[:min(take, len(s.Addresses)):min(take, len(s.Addresses))]
			s.NotReadyAddresses = nil
			left -= len(s.Addresses)
		} else {
			s.NotReadyAddresses = s.NotReadyAddresses[:min(take, n):min(take, n)]
			left -= len(s.NotReadyAddresses)
		}
		out[i] = s
	}
	return out, true
}

// SubsetsEqual reports whether a and b are the same subsets, in the same order (both
// canonical): nil and empty are equal, appProtocols compare by value, and targets by
// kind, namespace, name and uid (Kubernetes ignores their resourceVersion, #50936).
func SubsetsEqual(a, b []Subset) bool {
	return slices.EqualFunc(a, b, func(x, y Subset) bool {
		return slices.EqualFunc(x.Addresses, y.Addresses, addressEqual) &&
			slices.EqualFunc(x.NotReadyAddresses, y.NotReadyAddresses, addressEqual) &&
			slices.EqualFunc(x.Ports, y.Ports, func(p, q Port) bool { return keyOfPort(p) == keyOfPort(q) })
	})
}

func addressEqual(a, b Address) bool {
	if a.IP != b.IP || a.Hostname != b.Hostname || a.NodeName != b.NodeName || (a.TargetRef == nil) != (b.TargetRef == nil) {
		return false
	}
	return a.TargetRef == nil || *a.TargetRef == *b.TargetRef
}

// Desired is the object to store for svc, built from its computed subsets (canonical,
// not truncated), the object stored now (nil when none; never modified) and the
// trigger time (zero when none), as kube-controller-manager builds it: the Service's
// labels with the managed-by label and, for a headless Service, the headless label;
// the stored annotations with the trigger time set or removed and the over-capacity
// annotation set or removed; the subsets truncated to MaxAddresses.
func Desired(svc *Service, subsets []Subset, current *Endpoints, trigger time.Time) *Endpoints {
	e := &Endpoints{
		Namespace:  svc.Namespace,
		Name:       svc.Name,
		ServiceUID: svc.UID,
		ManagedBy:  ManagedByController,
	}
	e.Labels = make(map[string]string, len(svc.Labels)+2)
	maps.Copy(e.Labels, svc.Labels)
	e.Labels[LabelManagedBy] = ControllerName
	if isHeadless(svc) {
		e.Labels[LabelHeadless] = ""
	} else {
		delete(e.Labels, LabelHeadless)
	}
	ann := map[string]string{}
	if current != nil {
		maps.Copy(ann, current.Annotations)
	}
	if trigger.IsZero() {
		delete(ann, AnnotationTriggerTime)
	} else {
		ann[AnnotationTriggerTime] = trigger.UTC().Format(time.RFC3339Nano)
	}
	ready, notReady := CountAddresses(subsets)
	e.AddressCount = ready + notReady
	var truncated bool
	e.Subsets, truncated = Truncate(subsets, MaxAddresses)
	if truncated {
		ann[AnnotationOverCapacity] = Truncated
	} else {
		delete(ann, AnnotationOverCapacity)
	}
	if len(ann) > 0 {
		e.Annotations = ann
	}
	return e
}

// NeedsWrite reports whether desired must be written over current (kube-controller-
// manager's skip check): always when nothing is stored; else when the subsets differ,
// the labels differ (the headless label aside: a wrong headless label alone causes no
// write, as upstream), the over-capacity annotation differs, or allocd's ownership
// bookkeeping differs. The trigger-time annotation alone never causes a write. allocd's
// deviation: the comparison is made after truncation, so a truncated object that did
// not change is not rewritten on every sync (upstream rewrites it, #127370).
func NeedsWrite(current, desired *Endpoints) bool {
	switch {
	case current == nil:
		return true
	case current.ServiceUID != desired.ServiceUID || current.ManagedBy != desired.ManagedBy:
		return true
	case !SubsetsEqual(current.Subsets, desired.Subsets):
		return true
	case current.Annotations[AnnotationOverCapacity] != desired.Annotations[AnnotationOverCapacity]:
		return true
	}
	_, curHas := current.Annotations[AnnotationOverCapacity]
	_, desHas := desired.Annotations[AnnotationOverCapacity]
	if curHas != desHas {
		return true
	}
	return !labelsEqualButHeadless(current.Labels, desired.Labels)
}

func labelsEqualButHeadless(a, b map[string]string) bool {
	n := 0
	for k, v := range a {
		if k == LabelHeadless {
			continue
		}
		if w, ok := b[k]; !ok || w != v {
			return false
		}
		n++
	}
	m := len(b)
	if _, ok := b[LabelHeadless]; ok {
		m--
	}
	return n == m
}

// TriggerTracker computes the endpoints.kubernetes.io/last-change-trigger-time of a
// sync as Kubernetes' TriggerTimeTracker: for a Service it has not seen (the first
// sync of the term, or after the Service was deleted), the Service's creation time;
// else the earliest of the Service's creation time and its Pods' Ready transition
// times that moved forward since the previous sync; zero when none did. It is safe for
// concurrent use.
type TriggerTracker struct {
	mu       sync.Mutex
	services map[string]*triggerState
}

type triggerState struct {
	service time.Time
	pods    map[string]time.Time
}

// NewTriggerTracker returns an empty tracker.
func NewTriggerTracker() *TriggerTracker {
	return &TriggerTracker{services: map[string]*triggerState{}}
}

// Compute returns the trigger time of a sync of svc over pods (every selected Pod,
// included in the Endpoints or not) and remembers the times seen.
func (t *TriggerTracker) Compute(svc *Service, pods []*Pod) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	key := svc.Key()
	st, known := t.services[key]
	if st == nil {
		st = &triggerState{}
	}
	var earliest time.Time
	earlier := func(x time.Time) {
		if earliest.IsZero() || x.Before(earliest) {
			earliest = x
		}
	}
	var pt map[string]time.Time // nil while no Pod has a time: most feeds send none
	for _, p := range pods {
		if p.ReadyTransitionTime.IsZero() {
			continue
		}
		if pt == nil {
			pt = make(map[string]time.Time, len(pods))
		}
		pt[p.Name] = p.ReadyTransitionTime
		if p.ReadyTransitionTime.After(st.pods[p.Name]) {
			earlier(p.ReadyTransitionTime)
		}
	}
	if svc.CreationTime.After(st.service) {
		earlier(svc.CreationTime)
	}
	t.services[key] = &triggerState{service: svc.CreationTime, pods: pt}
	if !known {
		return svc.CreationTime
	}
	return earliest
}

// Forget drops what the tracker knows of the Service "namespace/name".
func (t *TriggerTracker) Forget(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.services, key)
}

// PodChange tells how cur differs from old for the controller, as Kubernetes'
// podEndpointsChanged: podChanged when the Pod is or was terminating (upstream compares
// deletionTimestamp pointers, which differ between two copies), its readiness flipped,
// or its IPs changed; labelsChanged when its labels, hostname or subdomain changed.
// Other changes (phase alone, node name, ports) enqueue nothing, as upstream: the new
// state is still what the next sync of its Services reads.
func PodChange(old, cur *Pod) (podChanged, labelsChanged bool) {
	labelsChanged = !maps.Equal(old.Labels, cur.Labels) || old.Hostname != cur.Hostname || old.Subdomain != cur.Subdomain
	podChanged = old.Deleting || cur.Deleting || old.Ready != cur.Ready || !slices.Equal(old.PodIPs, cur.PodIPs)
	return podChanged, labelsChanged
}
