package allocator

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"strconv"
	"strings"
)

// The mappers: from an item (an address of a ClusterIP prefix, a port of the node port
// range) to its offset in the range's bitmap and back. They know nothing of etcd or of
// what is allocated.

// PortRange is a range of ports: Base, Base+1, ..., Base+Size-1.
type PortRange struct{ Base, Size int }

// DefaultNodePortRange is kube-apiserver's default --service-node-port-range.
var DefaultNodePortRange = PortRange{Base: 30000, Size: 2768}

// String returns "first-last", the range's name.
func (pr PortRange) String() string {
	return strconv.Itoa(pr.Base) + "-" + strconv.Itoa(pr.Base+pr.Size-1)
}

// Contains reports whether port p is in the range.
func (pr PortRange) Contains(p int) bool { return p >= pr.Base && p < pr.Base+pr.Size }

// ParsePortRange parses "30000-32767" (first-last, inclusive), "30000+2767"
// (base+offset, as Kubernetes accepts) or a single port "30000".
func ParsePortRange(s string) (PortRange, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return PortRange{}, errors.New("empty port range")
	}
	var first, last int
	var err error
	switch {
	case strings.Contains(s, "-"):
		a, b, _ := strings.Cut(s, "-")
		if first, err = parsePort(a); err == nil {
			last, err = parsePort(b)
		}
	case strings.Contains(s, "+"):
		a, b, _ := strings.Cut(s, "+")
		var off int
		if first, err = parsePort(a); err == nil {
			if off, err = strconv.Atoi(b); err == nil && off < 0 {
				err = fmt.Errorf("negative offset %d", off)
			}
			last = first + off
		}
	default:
		first, err = parsePort(s)
		last = first
	}
	if err != nil {
		return PortRange{}, fmt.Errorf("port range %q: %w", s, err)
	}
	if last > 65535 {
		return PortRange{}, fmt.Errorf("port range %q: ends past 65535", s)
	}
	if last < first {
		return PortRange{}, fmt.Errorf("port range %q: last port before first", s)
	}
	return PortRange{Base: first, Size: last - first + 1}, nil
}

func parsePort(s string) (int, error) {
	p, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("port %q is not a number", s)
	}
	if p < 1 || p > 65535 {
		return 0, fmt.Errorf("port %d is outside 1-65535", p)
	}
	return p, nil
}

// ipSpan maps the usable addresses of a ClusterIP prefix to offsets 0..size-1:
//
//	network  base(+0)  base+1 ...  base+size-1  [broadcast, IPv4 only]
//	 excluded  offset 0  offset 1     offset size-1    excluded
//
// Offsets are uint64 over the 128-bit As16 form; no big.Int.
type ipSpan struct {
	prefix         netip.Prefix
	baseHi, baseLo uint64 // the first usable address, As16
	size, total    uint64
	is4            bool
}

func newIPSpan(p netip.Prefix) ipSpan {
	p = p.Masked()
	host := uint(p.Addr().BitLen() - p.Bits())
	total := uint64(1) << host
	size := total - 1 // the network address
	if p.Addr().Is4() {
		size-- // the broadcast address
	}
	b := p.Addr().As16()
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	lo, carry := bits.Add64(lo, 1, 0)
	hi += carry
	return ipSpan{prefix: p, baseHi: hi, baseLo: lo, size: size, total: total, is4: p.Addr().Is4()}
}

// offset returns a's offset, and false when a is not a usable address of the span.
func (s ipSpan) offset(a netip.Addr) (uint64, bool) {
	if !a.IsValid() || a.Is4() != s.is4 || a.Zone() != "" {
		return 0, false
	}
	b := a.As16()
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	dlo, borrow := bits.Sub64(lo, s.baseLo, 0)
	dhi, borrow := bits.Sub64(hi, s.baseHi, borrow)
	if borrow != 0 || dhi != 0 || dlo >= s.size {
		return 0, false
	}
	return dlo, true
}

// addr returns the address at offset off (which must be < size).
func (s ipSpan) addr(off uint64) netip.Addr {
	lo, carry := bits.Add64(s.baseLo, off, 0)
	hi := s.baseHi + carry
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], hi)
	binary.BigEndian.PutUint64(b[8:], lo)
	a := netip.AddrFrom16(b)
	if s.is4 {
		a = a.Unmap()
	}
	return a
}
