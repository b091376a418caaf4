package allocator

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allocd/allocd/allocator/bitmap"
	"github.com/allocd/allocd/internal/badrequest"
)

// rng is one configured range: a bitmap of offsets (package bitmap: used and pending,
// picks, bands) and the mapper of its items to those offsets, span (ClusterIP) or
// ports (NodePort).
type rng struct {
	*bitmap.Bitmap
	name  string
	kind  Kind
	span  ipSpan    // KindClusterIP
	ports PortRange // KindNodePort
	// refs are the ServiceCIDRs that list a ClusterIP range (kubernetes, then by
	// creation); guard is the first ready one, nil when all are terminating: an
	// allocation drawing from the range compares its key's revision.
	refs  []cidrRef
	guard *cidrRef
	// readyIdx is the range's place in its table's ready list; -1 when not ready.
	readyIdx int32

	allocSpecific, allocDynamic prometheus.Counter
}

func newPortRange(pr PortRange) *rng {
	size := uint64(pr.Size)
	return &rng{Bitmap: bitmap.New(size, portBand(size)), name: pr.String(), kind: KindNodePort, ports: pr}
}

// offset returns it's offset in r, and false when it is not a usable item of r.
func (r *rng) offset(it Item) (uint64, bool) {
	if it.Kind != r.kind {
		return 0, false
	}
	if r.kind == KindClusterIP {
		return r.span.offset(it.Addr)
	}
	if !r.ports.Contains(it.Port) {
		return 0, false
	}
	return uint64(it.Port - r.ports.Base), true
}

// item returns the item at offset off < Size.
func (r *rng) item(off uint64) Item {
	if r.kind == KindClusterIP {
		return IP(r.span.addr(off))
	}
	return Port(r.ports.Base + int(off))
}

// ipBand is the size of the static (lower) band of a ClusterIP range of total
// addresses (network and broadcast included), as KEP-3070 computes it.
func ipBand(total uint64) uint64 {
	if total <= 16 {
		return 0
	}
	return min(max(16, total/16), 256)
}

// portBand is the size of the static band of a NodePort range (KEP-3668).
func portBand(size uint64) uint64 {
	if size <= 16 {
		return 0
	}
	return min(max(16, size/32), 128)
}

// RangeSet is the ranges of an Allocator as a value, for those that judge items
// without allocating (repair): which range an item is in, which items are reserved.
type RangeSet struct {
	// ClusterIP are the ClusterIP ranges of every ServiceCIDR, ready and terminating,
	// in allocation order.
	ClusterIP []netip.Prefix
	// NodePort is the node port range.
	NodePort PortRange
	// KubernetesIP and KubernetesNodePort (0: none) are held for the kubernetes
	// Service.
	KubernetesIP       netip.Addr
	KubernetesNodePort int

	// names are the ClusterIP ranges' names and nodePortName the node port range's,
	// when made by the Allocator: Of, once per item of a repair pass, need not make
	// them.
	names        []string
	nodePortName string
}

// Names returns the range names: the ClusterIP ranges, primary first, then the node
// port range.
func (s RangeSet) Names() []string {
	names := make([]string, 0, len(s.ClusterIP)+1)
	for _, p := range s.ClusterIP {
		names = append(names, p.String())
	}
	return append(names, s.NodePort.String())
}

// Of returns the name of it's range: ErrNoRange when no range has its IP family, a
// *NotInRangeError when it lies outside (or is the network or broadcast address of)
// its range, an *InvalidError for an invalid item.
func (s RangeSet) Of(it Item) (string, error) {
	switch it.Kind {
	case KindClusterIP:
		if !it.Addr.IsValid() {
			return "", badrequest.New("cluster_ip", "not an IP address")
		}
		var family []string
		for i, p := range s.ClusterIP {
			if p.Addr().Is4() != it.Addr.Is4() {
				continue
			}
			if _, ok := newIPSpan(p).offset(it.Addr); ok {
				if len(s.names) == len(s.ClusterIP) {
					return s.names[i], nil
				}
				return p.String(), nil
			}
			family = append(family, p.String())
		}
		if len(family) > 0 {
			return "", &NotInRangeError{Item: it, Range: strings.Join(family, ", ")}
		}
		return "", fmt.Errorf("%s: %w", it, ErrNoRange)
	case KindNodePort:
		if !s.NodePort.Contains(it.Port) {
			return "", &NotInRangeError{Item: it, Range: s.NodePort.String()}
		}
		if s.nodePortName != "" {
			return s.nodePortName, nil
		}
		return s.NodePort.String(), nil
	}
	return "", badrequest.New("kind", "unknown item kind")
}

// IsReserved reports whether it is the kubernetes address or node port.
func (s RangeSet) IsReserved(it Item) bool {
	switch it.Kind {
	case KindClusterIP:
		return it.Addr == s.KubernetesIP
	case KindNodePort:
		return s.KubernetesNodePort != 0 && it.Port == s.KubernetesNodePort
	}
	return false
}

// Band is the static (lower) or dynamic (upper) part of a range.
type Band struct {
	// First and Last are the band's first and last items (zero Items when Size is 0).
	First, Last Item
	Size, Used  uint64
}

// RangeInfo describes a configured range and its use, as the index sees it.
type RangeInfo struct {
	Name string
	Kind Kind
	// Prefix is the CIDR of a ClusterIP range.
	Prefix netip.Prefix
	// Ports is the NodePort range.
	Ports PortRange
	// Primary is the range of the kubernetes Service's address.
	Primary bool
	// State is a ClusterIP range's: ready when a ready ServiceCIDR lists it.
	State CIDRState
	// ServiceCIDRs are the names of the ServiceCIDRs that list a ClusterIP range.
	ServiceCIDRs []string
	// Size is the number of allocatable items.
	Size, Used      uint64
	Static, Dynamic Band
}

// cidrRef is a ServiceCIDR that lists a range, as the index last saw its key.
type cidrRef struct {
	name      string
	key       string
	rev       int64 // ModRevision: what an allocation drawing from it compares
	createRev int64
	ready     bool
	// id is key@rev: what a transaction compares once however many picks share it
	// (the refs of one ServiceCIDR are copies, one per range and per table).
	id string
}
