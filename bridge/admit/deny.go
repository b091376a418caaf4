package admit

import (
	"errors"
	"fmt"
	"net/netip"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The refusals below are kube-apiserver's own, word for word, for the same causes
// (pkg/registry/core/service/storage/alloc.go, ipallocator, portallocator): a user
// who asks for a taken or foreign address gets the answer kube-apiserver alone gives,
// prefixed by kube-apiserver with the webhook's name.

var serviceKind = schema.GroupKind{Kind: "Service"}

// The allocators' messages (ipallocator.ErrAllocated, ErrMismatchedNetwork, ErrFull;
// portallocator.ErrAllocated, ErrNotInRange).
const (
	msgIPAllocated     = "provided IP is already allocated"
	msgIPOtherNetwork  = "the provided network does not match the current range"
	msgPortAllocated   = "provided port is already allocated"
	msgFull            = "range is full"
	msgPortNotInRangeF = "provided port is not in the valid range. The range of valid ports is %s"
	msgIPNotInRangeF   = "the provided IP (%v) is not in the valid range. The range of valid IPs is %s"
)

// errFull is ipallocator's and portallocator's ErrFull, for kube-apiserver's wrapping.
var errFull = errors.New(msgFull)

// ipRefused is allocIPs' refusal of a requested address: 422 on spec.clusterIPs.
func (n *need) ipRefused(ip ipNeed, why string) *apierrors.StatusError {
	given := n.svc.Spec.ClusterIPs[ip.index]
	return apierrors.NewInvalid(serviceKind, n.name, field.ErrorList{field.Invalid(
		field.NewPath("spec", "clusterIPs"), n.svc.Spec.ClusterIPs,
		fmt.Sprintf("failed to allocate IP %v: %v", given, why))})
}

// ipOutside is why kube-apiserver refuses a requested address that allocd has no range
// for: an address no ServiceCIDR of the cluster holds has no allocator
// (MetaAllocator.getAllocator), and the allocator of one that holds it refuses its
// network address (and an IPv4 broadcast address). ok is false for any other address
// of a ServiceCIDR of the cluster: kube-apiserver would allocate it, and allocd lacks
// the range (the bridge has not synced that ServiceCIDR into allocd yet).
func ipOutside(a netip.Addr, cidrs []netip.Prefix) (why string, ok bool) {
	for _, p := range cidrs {
		if !p.Contains(a) {
			continue
		}
		if a == p.Addr() || a.Is4() && a == lastAddr(p) {
			return fmt.Sprintf(msgIPNotInRangeF, a, p), true
		}
		return "", false
	}
	return msgIPOtherNetwork, true
}

// lastAddr is the last address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := range b {
		if host := p.Bits() - i*8; host < 8 {
			b[i] |= byte(0xff >> max(host, 0))
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// ipFull is allocIPs' error when no address is left: 500.
func (n *need) ipFull() *apierrors.StatusError {
	return apierrors.NewInternalError(fmt.Errorf("failed to allocate a serviceIP for Service %q: %w",
		n.name, errFull))
}

// portRefused is initNodePorts' and updateNodePorts' refusal of a requested node port
// (422 on spec.ports[i].nodePort), and allocHealthCheckNodePort's (500).
func (n *need) portRefused(p portNeed, why string) *apierrors.StatusError {
	if p.hc {
		return apierrors.NewInternalError(fmt.Errorf(
			"failed to allocate requested HealthCheck NodePort %v: %v", p.want, why))
	}
	return apierrors.NewInvalid(serviceKind, n.name, field.ErrorList{field.Invalid(
		field.NewPath("spec", "ports").Index(p.index).Child("nodePort"), p.want, why)})
}

// portOutside is portallocator's ErrNotInRange, with the range as kube-apiserver
// prints it ("30000-32767").
func portOutside(rng string) string { return fmt.Sprintf(msgPortNotInRangeF, rng) }

// portFull is the error of a node port asked for when none is left: 500.
func (n *need) portFull(p portNeed) *apierrors.StatusError {
	if p.hc {
		// allocHealthCheckNodePort prints the port it did not get: 0.
		return apierrors.NewInternalError(fmt.Errorf("failed to allocate a HealthCheck NodePort %v: %v", 0,
			errFull))
	}
	return apierrors.NewInternalError(fmt.Errorf("failed to allocate a nodePort: %w", errFull))
}
