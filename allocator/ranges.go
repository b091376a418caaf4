package allocator

import (
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allocd/allocd/allocator/bitmap"
)

// MaxRangeBits is the most host bits a ClusterIP range may have: 2^24 addresses (an
// IPv4 /8 or an IPv6 /104), two bitsets of 2 MiB each in memory.
const MaxRangeBits = 24

// rng is one configured range: a bitmap of offsets (package bitmap: used and pending,
// picks, bands) and the mapper of its items to those offsets, span (ClusterIP) or
// ports (NodePort).
type rng struct {
	*bitmap.Bitmap
	name    string
	kind    Kind
	span    ipSpan    // KindClusterIP
	ports   PortRange // KindNodePort
	primary bool

	allocSpecific, allocDynamic prometheus.Counter
}

func newIPRange(p netip.Prefix, primary bool) *rng {
	s := newIPSpan(p)
	return &rng{Bitmap: bitmap.New(s.size, ipBand(s.total)), name: s.prefix.String(),
		kind: KindClusterIP, span: s, primary: primary}
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
