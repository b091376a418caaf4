package admit

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// Families is the IP families a cluster's ClusterIPs come from, as kube-apiserver's
// --service-cluster-ip-range gives them: the primary first, a second one when the
// cluster is dual-stack. kube-apiserver creates its default ServiceCIDR ("kubernetes")
// from that flag, in that order.
type Families []corev1.IPFamily

// FamiliesOf returns the families of cidrs (a ServiceCIDR's spec.cidrs), in order; false
// when one does not parse, or a family comes twice.
func FamiliesOf(cidrs []string) (Families, bool) {
	var fs Families
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, false
		}
		f := familyOfAddr(p.Addr())
		if slices.Contains(fs, f) {
			return nil, false
		}
		fs = append(fs, f)
	}
	return fs, len(fs) > 0
}

func (fs Families) has(f corev1.IPFamily) bool { return slices.Contains(fs, f) }

func (fs Families) dual() bool { return len(fs) == 2 }

func (fs Families) primary() corev1.IPFamily { return fs[0] }

func familyOfAddr(a netip.Addr) corev1.IPFamily {
	if a.Is4() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}

func other(f corev1.IPFamily) corev1.IPFamily {
	if f == corev1.IPv4Protocol {
		return corev1.IPv6Protocol
	}
	return corev1.IPv4Protocol
}

// parseIP parses a ClusterIP the way the webhook accepts it: an address without zone,
// and not an IPv4 address written in IPv6 (Kubernetes calls that IPv4, netip IPv6).
func parseIP(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" || a.Is4In6() {
		return netip.Addr{}, false
	}
	return a, true
}

func policyOf(s *corev1.Service) corev1.IPFamilyPolicy {
	if s.Spec.IPFamilyPolicy == nil {
		return ""
	}
	return *s.Spec.IPFamilyPolicy
}

func headless(s *corev1.Service) bool {
	return s.Spec.ClusterIP == corev1.ClusterIPNone ||
		len(s.Spec.ClusterIPs) > 0 && s.Spec.ClusterIPs[0] == corev1.ClusterIPNone
}

// wellFormed is the part of kube-apiserver's ValidateServiceClusterIPsRelatedFields
// that the rules below rely on: clusterIP and clusterIPs agree, at most two addresses
// that parse, of two families, matching ipFamilies where given; families and policy of
// known values. An object that fails it is refused by kube-apiserver before it
// allocates anything (initIPFamilyFields validates first), in its own words: the
// webhook leaves it alone.
func wellFormed(s *corev1.Service) bool {
	ips := s.Spec.ClusterIPs
	if s.Spec.ClusterIP != "" {
		if len(ips) == 0 || ips[0] != s.Spec.ClusterIP {
			return false
		}
	} else if len(ips) != 0 {
		return false
	}
	if len(ips) > 2 || len(s.Spec.IPFamilies) > 2 {
		return false
	}
	for i, f := range s.Spec.IPFamilies {
		if f != corev1.IPv4Protocol && f != corev1.IPv6Protocol || slices.Contains(s.Spec.IPFamilies[:i], f) {
			return false
		}
	}
	switch policyOf(s) {
	case "", corev1.IPFamilyPolicySingleStack, corev1.IPFamilyPolicyPreferDualStack,
		corev1.IPFamilyPolicyRequireDualStack:
	default:
		return false
	}
	var fams []corev1.IPFamily
	for _, ip := range ips {
		a, ok := parseIP(ip)
		if !ok {
			return false
		}
		fams = append(fams, familyOfAddr(a))
	}
	if len(fams) == 2 && fams[0] == fams[1] {
		return false
	}
	for i, f := range fams {
		if i < len(s.Spec.IPFamilies) && s.Spec.IPFamilies[i] != f {
			return false
		}
	}
	return true
}

// initFamilies is kube-apiserver's initIPFamilyFields (pkg/registry/core/service/
// storage/alloc.go) on s, a copy of the admitted object (old nil for a create): it
// defaults ipFamilyPolicy and fills ipFamilies from the cluster's families. It
// returns done when kube-apiserver leaves the families as they are
// (isMatchingPreferDualStackClusterIPFields: nothing to allocate), and ok false when
// kube-apiserver refuses the object there, before it allocates anything: the
// webhook then leaves the object alone and kube-apiserver says why in its own words.
func (fs Families) initFamilies(s, old *corev1.Service) (done, ok bool) {
	if s.Spec.Type == corev1.ServiceTypeExternalName {
		return true, true
	}
	if matchingPreferDualStack(s, old) {
		return true, true
	}
	if s.Spec.IPFamilyPolicy == nil {
		p := corev1.IPFamilyPolicySingleStack
		switch {
		case old != nil && old.Spec.IPFamilyPolicy != nil:
			p = *old.Spec.IPFamilyPolicy
		case s.Spec.ClusterIP == corev1.ClusterIPNone && len(s.Spec.Selector) == 0:
			p = corev1.IPFamilyPolicyRequireDualStack
		}
		s.Spec.IPFamilyPolicy = &p
	}
	if !wellFormed(s) || !fs.updatePrep(s, old) {
		return false, false
	}
	single := policyOf(s) == corev1.IPFamilyPolicySingleStack
	if single && (len(s.Spec.ClusterIPs) == 2 || len(s.Spec.IPFamilies) == 2) {
		return false, false
	}
	for i, ip := range s.Spec.ClusterIPs {
		if ip == corev1.ClusterIPNone {
			break
		}
		a, _ := parseIP(ip)
		if i >= len(s.Spec.IPFamilies) {
			if !fs.has(familyOfAddr(a)) {
				return false, false
			}
			s.Spec.IPFamilies = append(s.Spec.IPFamilies, familyOfAddr(a))
		}
	}
	if headless(s) {
		return true, true // the webhook leaves headless Services alone
	}
	if policyOf(s) == corev1.IPFamilyPolicyRequireDualStack && !fs.dual() {
		return false, false
	}
	for _, f := range s.Spec.IPFamilies {
		if !fs.has(f) {
			return false, false
		}
	}
	if len(s.Spec.IPFamilies) == 0 {
		s.Spec.IPFamilies = []corev1.IPFamily{fs.primary()}
	}
	if !single && len(s.Spec.IPFamilies) == 1 && fs.dual() {
		s.Spec.IPFamilies = append(s.Spec.IPFamilies, other(s.Spec.IPFamilies[0]))
	}
	return false, true
}

// updatePrep is initIPFamilyFields' "update-only prep work": a single-stack update
// that kept the addresses or families drops the secondary; another policy may not
// drop one (kube-apiserver refuses that: ok false).
func (fs Families) updatePrep(s, old *corev1.Service) (ok bool) {
	if old == nil {
		return true
	}
	if policyOf(s) == corev1.IPFamilyPolicySingleStack {
		if slices.Equal(old.Spec.ClusterIPs, s.Spec.ClusterIPs) && len(s.Spec.ClusterIPs) > 1 {
			s.Spec.ClusterIPs = s.Spec.ClusterIPs[:1]
		}
		if slices.Equal(old.Spec.IPFamilies, s.Spec.IPFamilies) && len(s.Spec.IPFamilies) > 1 {
			s.Spec.IPFamilies = s.Spec.IPFamilies[:1]
		}
		return true
	}
	reduced := len(s.Spec.ClusterIPs) > 0 && len(s.Spec.ClusterIPs) < len(old.Spec.ClusterIPs) ||
		len(s.Spec.IPFamilies) > 0 && len(s.Spec.IPFamilies) < len(old.Spec.IPFamilies)
	return !reduced
}

// matchingPreferDualStack is kube-apiserver's isMatchingPreferDualStackClusterIPFields:
// an update of a PreferDualStack Service that keeps its type, addresses and families
// is not upgraded nor downgraded when the cluster's families changed.
func matchingPreferDualStack(s, old *corev1.Service) bool {
	if old == nil || s.Spec.IPFamilyPolicy == nil || old.Spec.Type != s.Spec.Type {
		return false
	}
	switch s.Spec.Type {
	case corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
	default:
		return false
	}
	if *s.Spec.IPFamilyPolicy != corev1.IPFamilyPolicyPreferDualStack ||
		old.Spec.IPFamilyPolicy != nil && *old.Spec.IPFamilyPolicy != corev1.IPFamilyPolicyPreferDualStack {
		return false
	}
	return slices.Equal(old.Spec.ClusterIPs, s.Spec.ClusterIPs) &&
		slices.Equal(old.Spec.IPFamilies, s.Spec.IPFamilies)
}
