package admit

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// need is what one admission asks of allocd, and where the answers go in the object:
// kube-apiserver's allocation of a create (allocateCreate) or an update
// (allocateUpdate), done ahead of it, so that it finds every value given.
type need struct {
	// svc is the admitted object as kube-apiserver's rules fill it before allocating:
	// policy defaulted, ipFamilies filled, clusterIPs with a "" for each family that
	// lacks an address (the marker kube-apiserver puts there).
	svc *corev1.Service
	// name is the object's name for messages (its generateName when it has none yet).
	name string
	ips  []ipNeed
	// ports are the node ports to allocate, the health check node port last.
	ports []portNeed
	// fixed are the node ports the object's ports give.
	fixed map[int32]bool
	// refusal is kube-apiserver's answer when the object asks for one node port twice
	// (its allocator refuses the second), at ports[refusalAt]: kube-apiserver gets
	// that far (the ClusterIPs, the node ports before it) before it refuses.
	refusal   error
	refusalAt int
}

// ipNeed is one ClusterIP to allocate: at spec.clusterIPs[index], of family.
type ipNeed struct {
	index  int
	family corev1.IPFamily
	want   netip.Addr // asked for by the user; invalid: any
	got    netip.Addr
	// held is set when the address was held for this object before (an earlier
	// invocation of the same admission): nothing is allocated for it.
	held bool
}

// portNeed is one node port to allocate, for the ports at spec.ports[fill...] (or the
// health check node port, hc).
type portNeed struct {
	// index is the spec.ports entry that kube-apiserver names in its error about this
	// port (the first entry of its port number).
	index int
	fill  []int
	hc    bool
	want  int32 // asked for by the user; 0: any
	got   int32
	held  bool
}

func (n *need) empty() bool { return len(n.ips)+len(n.ports) == 0 }

// planCreate is what kube-apiserver's allocateCreate would allocate for s, or ok false
// when kube-apiserver refuses s before allocating (the webhook leaves it alone).
func (fs Families) planCreate(s *corev1.Service) (n *need, ok bool) {
	svc := s.DeepCopy()
	// normalizeClusterIPs of a create: a client that sets only the singular field.
	if svc.Spec.ClusterIP != "" && len(svc.Spec.ClusterIPs) == 0 {
		svc.Spec.ClusterIPs = []string{svc.Spec.ClusterIP}
	}
	n = &need{svc: svc, name: nameOf(svc), fixed: map[int32]bool{}}
	done, ok := fs.initFamilies(svc, nil)
	if !ok {
		return nil, false
	}
	if !done && svc.Spec.Type != corev1.ServiceTypeExternalName && !headless(svc) {
		n.clusterIPs(0)
	}
	if svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		n.initNodePorts()
	}
	n.fixNumbers()
	if needsHealthCheck(svc) {
		n.healthCheck()
	}
	return n, true
}

// planUpdate is what kube-apiserver's allocateUpdate would newly allocate for s, an
// update of old: a ClusterIP for a Service that stops being ExternalName, the
// secondary of one that turns dual-stack, node ports for ports that lack one, a health
// check node port once it is needed. What the update gives up is not released here.
func (fs Families) planUpdate(s, old *corev1.Service) (n *need, ok bool) {
	svc, was := s.DeepCopy(), old.DeepCopy()
	defaultOnRead(was, fs)
	patchAllocatedValues(svc, was)
	normalizeUpdate(svc, was)
	n = &need{svc: svc, name: nameOf(svc), fixed: map[int32]bool{}}
	done, ok := fs.initFamilies(svc, was)
	if !ok {
		return nil, false
	}
	if !done {
		n.updateClusterIPs(was)
	}
	if svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		n.updateNodePorts(was)
	}
	n.fixNumbers()
	if !needsHealthCheck(was) && needsHealthCheck(svc) {
		n.healthCheck()
	}
	return n, true
}

func nameOf(s *corev1.Service) string {
	if s.Name == "" {
		return s.GenerateName
	}
	return s.Name
}

// clusterIPs is allocClusterIPs: an address for every family of spec.ipFamilies from
// from on, the one given in spec.clusterIPs or any.
func (n *need) clusterIPs(from int) {
	s := n.svc
	for i, f := range s.Spec.IPFamilies {
		if i >= len(s.Spec.ClusterIPs) {
			s.Spec.ClusterIPs = append(s.Spec.ClusterIPs, "") // kube-apiserver's marker
		}
		if i < from {
			continue
		}
		want, _ := parseIP(s.Spec.ClusterIPs[i])
		n.ips = append(n.ips, ipNeed{index: i, family: f, want: want})
	}
}

// updateClusterIPs is kube-apiserver's updateClusterIPs, the allocating cases: from
// ExternalName (everything), and an upgrade to dual-stack (the secondary).
func (n *need) updateClusterIPs(old *corev1.Service) {
	s := n.svc
	switch {
	case old.Spec.Type == corev1.ServiceTypeExternalName && s.Spec.Type != corev1.ServiceTypeExternalName:
		if !headless(s) {
			n.clusterIPs(0)
		}
	case headless(old), s.Spec.Type == corev1.ServiceTypeExternalName:
	case len(old.Spec.IPFamilies) == 1 && len(s.Spec.IPFamilies) == 2:
		n.clusterIPs(1)
	}
}

// shouldAllocateNodePorts is kube-apiserver's: NodePort Services, and LoadBalancers
// unless allocateLoadBalancerNodePorts is false.
func shouldAllocateNodePorts(s *corev1.Service) bool {
	switch s.Spec.Type {
	case corev1.ServiceTypeNodePort:
		return true
	case corev1.ServiceTypeLoadBalancer:
		return s.Spec.AllocateLoadBalancerNodePorts == nil || *s.Spec.AllocateLoadBalancerNodePorts
	}
	return false
}

// needsHealthCheck is kube-apiserver's NeedsHealthCheck: a LoadBalancer with
// externalTrafficPolicy Local.
func needsHealthCheck(s *corev1.Service) bool {
	return s.Spec.Type == corev1.ServiceTypeLoadBalancer &&
		s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
}

// initNodePorts is kube-apiserver's initNodePorts: the ports of one port number share
// one node port (the one a port of that number asks for, else any), a port that asks
// for another gets it; with allocateLoadBalancerNodePorts false only the ports that
// ask for one get it.
func (n *need) initNodePorts() {
	ports := n.svc.Spec.Ports
	byNumber := map[int32]int{} // port number → index in n.ports
	asked := map[int32]bool{}
	ask := func(pn portNeed) {
		if pn.want != 0 && asked[pn.want] && n.refusal == nil {
			n.refusal, n.refusalAt = n.portRefused(pn, msgPortAllocated), len(n.ports)
		}
		asked[pn.want] = true
		n.ports = append(n.ports, pn)
	}
	for i, p := range ports {
		if p.NodePort == 0 && !shouldAllocateNodePorts(n.svc) {
			continue
		}
		k, seen := byNumber[p.Port]
		switch {
		case !seen:
			ask(portNeed{index: i, want: requestedNodePort(p.Port, ports)})
			k = len(n.ports) - 1
			byNumber[p.Port] = k
			if p.NodePort == 0 {
				n.ports[k].fill = append(n.ports[k].fill, i)
			}
		case p.NodePort == 0:
			n.ports[k].fill = append(n.ports[k].fill, i)
		case p.NodePort != n.ports[k].want:
			ask(portNeed{index: i, want: p.NodePort})
		}
	}
}

// requestedNodePort is kube-apiserver's findRequestedNodePort: the node port the first
// entry of port number port that gives one asks for, or 0.
func requestedNodePort(port int32, ports []corev1.ServicePort) int32 {
	for _, p := range ports {
		if p.Port == port && p.NodePort != 0 {
			return p.NodePort
		}
	}
	return 0
}

// updateNodePorts is kube-apiserver's updateNodePorts: a port without node port gets
// any (no sharing by port number on update); one that asks for a node port the old
// object did not use gets it.
func (n *need) updateNodePorts(old *corev1.Service) {
	oldPorts := nodePorts(old)
	asked := map[int32]bool{}
	for i, p := range n.svc.Spec.Ports {
		switch {
		case p.NodePort == 0 && !shouldAllocateNodePorts(n.svc):
		case p.NodePort == 0:
			n.ports = append(n.ports, portNeed{index: i, fill: []int{i}})
		case !slices.Contains(oldPorts, p.NodePort) && !asked[p.NodePort]:
			asked[p.NodePort] = true
			n.ports = append(n.ports, portNeed{index: i, want: p.NodePort})
		}
	}
}

// healthCheck is allocHealthCheckNodePort: the one asked for, or any. One that a port
// of the object uses is taken, for kube-apiserver's allocator.
func (n *need) healthCheck() {
	p := portNeed{index: -1, hc: true, want: n.svc.Spec.HealthCheckNodePort}
	if p.want != 0 && n.fixed[p.want] && n.refusal == nil {
		n.refusal, n.refusalAt = n.portRefused(p, msgPortAllocated), len(n.ports)
	}
	n.ports = append(n.ports, p)
}

// fixNumbers records the node ports the object's ports give.
func (n *need) fixNumbers() {
	for _, p := range n.svc.Spec.Ports {
		if p.NodePort != 0 {
			n.fixed[p.NodePort] = true
		}
	}
}

// nodePorts is kube-apiserver's collectServiceNodePorts.
func nodePorts(s *corev1.Service) []int32 {
	var out []int32
	for _, p := range s.Spec.Ports {
		if p.NodePort != 0 {
			out = append(out, p.NodePort)
		}
	}
	return out
}

// defaultOnRead is the part of kube-apiserver's defaultOnReadService the old object of
// an update goes through: clusterIPs from clusterIP, ipFamilies from the addresses.
func defaultOnRead(s *corev1.Service, fs Families) {
	if s.Spec.ClusterIP != "" && len(s.Spec.ClusterIPs) == 0 {
		s.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
	}
	if s.Spec.Type == corev1.ServiceTypeExternalName || len(s.Spec.IPFamilies) > 0 {
		return
	}
	single := corev1.IPFamilyPolicySingleStack
	if headless(s) {
		if len(s.Spec.Selector) == 0 {
			require := corev1.IPFamilyPolicyRequireDualStack
			s.Spec.IPFamilyPolicy = &require
			s.Spec.IPFamilies = []corev1.IPFamily{fs.primary(), other(fs.primary())}
		} else {
			s.Spec.IPFamilyPolicy = &single
			s.Spec.IPFamilies = []corev1.IPFamily{fs.primary()}
		}
		return
	}
	for _, ip := range s.Spec.ClusterIPs {
		a, _ := parseIP(ip)
		s.Spec.IPFamilies = append(s.Spec.IPFamilies, familyOfAddr(a))
	}
	if len(s.Spec.IPFamilies) == 1 {
		s.Spec.IPFamilyPolicy = &single
	}
}

// patchAllocatedValues is kube-apiserver's: an update that leaves out what was
// allocated keeps it (the ClusterIPs, the node ports by port name, the health check
// node port).
func patchAllocatedValues(s, old *corev1.Service) {
	if s.Spec.Type != corev1.ServiceTypeExternalName && old.Spec.Type != corev1.ServiceTypeExternalName {
		if s.Spec.ClusterIP == "" {
			s.Spec.ClusterIP = old.Spec.ClusterIP
		}
		if len(s.Spec.ClusterIPs) == 0 && len(old.Spec.ClusterIPs) > 0 {
			s.Spec.ClusterIPs = old.Spec.ClusterIPs
		}
	}
	if needsNodePort(old) && needsNodePort(s) {
		used := map[int32]bool{}
		for _, p := range nodePorts(s) {
			if slices.Contains(nodePorts(old), p) {
				used[p] = true
			}
		}
		byName := map[string]int32{}
		for _, p := range old.Spec.Ports {
			byName[p.Name] = p.NodePort
		}
		for i := range s.Spec.Ports {
			p := &s.Spec.Ports[i]
			if p.NodePort == 0 && !used[byName[p.Name]] {
				p.NodePort = byName[p.Name]
			}
		}
	}
	if needsHealthCheck(old) && needsHealthCheck(s) && s.Spec.HealthCheckNodePort == 0 {
		s.Spec.HealthCheckNodePort = old.Spec.HealthCheckNodePort
	}
}

// needsNodePort is kube-apiserver's needsNodePort (of patchAllocatedValues).
func needsNodePort(s *corev1.Service) bool {
	return s.Spec.Type == corev1.ServiceTypeNodePort ||
		s.Spec.Type == corev1.ServiceTypeLoadBalancer &&
			(s.Spec.AllocateLoadBalancerNodePorts == nil || *s.Spec.AllocateLoadBalancerNodePorts)
}

// normalizeUpdate is kube-apiserver's normalizeClusterIPs of an update: clusterIPs
// follow a changed or cleared clusterIP.
func normalizeUpdate(s, old *corev1.Service) {
	if len(old.Spec.ClusterIPs) > 0 && len(s.Spec.ClusterIPs) == 0 && old.Spec.ClusterIP == s.Spec.ClusterIP {
		s.Spec.ClusterIPs = old.Spec.ClusterIPs
	}
	if old.Spec.ClusterIP == s.Spec.ClusterIP {
		return
	}
	same := slices.Equal(old.Spec.ClusterIPs, s.Spec.ClusterIPs)
	switch {
	case old.Spec.ClusterIP != "" && s.Spec.ClusterIP == "":
		if same {
			s.Spec.ClusterIPs = nil
		}
	case same:
		s.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
	}
}
