package allocator

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/allocd/allocd/allocator/bitmap"
)

// The range table: the ClusterIP ranges of the ServiceCIDRs etcd holds, each a bitmap,
// and the node port range. A table is never changed once published (Allocator.tab):
// a change of the ServiceCIDRs builds a new one, whose ranges share the bitmaps of the
// old one's ranges of the same prefix.

// table is one state of the ranges. See the comment above.
type table struct {
	// ip is every ClusterIP range (ready ones in allocation order, then terminating
	// ones); byPrefix finds a range by its CIDR; bits lists the prefix lengths in use
	// per family (index 0 IPv4, 1 IPv6), so that the ranges holding an address are a
	// few map lookups away whatever their number.
	ip       []*rng
	byPrefix map[netip.Prefix]*rng
	bits     [2][]int
	// ready are the ready ranges of each family, in allocation order; cursor is the
	// first of them that may have room (the ones before it were full when a pick
	// passed them, and no release in them was seen since), so that a pick does not
	// look at a thousand full ranges each time.
	ready  [2][]*rng
	cursor [2]atomic.Int32
	port   *rng
	all    []*rng // ip, then port
	cidrs  map[string]ServiceCIDR
}

func famIndex(is4 bool) int {
	if is4 {
		return 0
	}
	return 1
}

// buildTable makes the table of cidrs, reusing old's bitmaps for the prefixes it
// had; fresh lists the ranges whose bitmaps are new (to fill from etcd).
func buildTable(old *table, port *rng, cidrs []ServiceCIDR,
	newRange func(netip.Prefix) *rng) (t *table, fresh []*rng) {
	t = &table{byPrefix: map[netip.Prefix]*rng{}, port: port, cidrs: make(map[string]ServiceCIDR, len(cidrs))}
	refs := map[netip.Prefix][]cidrRef{}
	var order []netip.Prefix
	for _, c := range cidrs {
		t.cidrs[c.Name] = c
		for _, p := range c.CIDRs {
			if _, ok := refs[p]; !ok {
				order = append(order, p)
			}
			refs[p] = append(refs[p], cidrRef{name: c.Name, rev: c.Revision, createRev: c.CreateRevision,
				ready: c.State == CIDRReady})
		}
	}
	for _, p := range order {
		var r *rng
		if old != nil && old.byPrefix[p] != nil {
			cp := *old.byPrefix[p] // a new rng sharing the bitmap and counters
			r = &cp
		} else {
			r = newRange(p)
			fresh = append(fresh, r)
		}
		r.refs = refs[p]
		slices.SortFunc(r.refs, compareRefs)
		r.guard = nil
		for i := range r.refs {
			if r.refs[i].ready {
				r.guard = &r.refs[i]
				break
			}
		}
		t.byPrefix[p] = r
		t.ip = append(t.ip, r)
	}
	// Allocation order: ready ranges by their first ready ServiceCIDR (kubernetes
	// first, then by creation), then the terminating ones.
	slices.SortStableFunc(t.ip, func(a, b *rng) int {
		switch {
		case a.guard != nil && b.guard != nil:
			return compareRefs(*a.guard, *b.guard)
		case a.guard != nil:
			return -1
		case b.guard != nil:
			return 1
		}
		return compareRefs(a.refs[0], b.refs[0])
	})
	for _, r := range t.ip {
		f := famIndex(r.span.is4)
		if !slices.Contains(t.bits[f], r.span.prefix.Bits()) {
			t.bits[f] = append(t.bits[f], r.span.prefix.Bits())
		}
		r.readyIdx = -1
		if r.guard != nil {
			r.readyIdx = int32(len(t.ready[f]))
			t.ready[f] = append(t.ready[f], r)
		}
	}
	t.all = append(slices.Clip(t.ip), port)
	return t, fresh
}

func compareRefs(a, b cidrRef) int {
	if (a.name == KubernetesCIDR) != (b.name == KubernetesCIDR) {
		if a.name == KubernetesCIDR {
			return -1
		}
		return 1
	}
	return cmp.Or(cmp.Compare(a.createRev, b.createRev), strings.Compare(a.name, b.name))
}

// each calls fn with every ClusterIP range that holds addr as a usable address, and
// its offset there.
func (t *table) each(addr netip.Addr, fn func(r *rng, off uint64)) {
	if !addr.IsValid() || addr.Zone() != "" {
		return
	}
	for _, b := range t.bits[famIndex(addr.Is4())] {
		p, err := addr.Prefix(b)
		if err != nil {
			continue
		}
		if r := t.byPrefix[p]; r != nil {
			if off, ok := r.span.offset(addr); ok {
				fn(r, off)
			}
		}
	}
}

// home returns the range an allocation of addr draws from: the first ready range
// (in allocation order) that holds it, else the first terminating one, else nil.
func (t *table) home(addr netip.Addr) (home *rng, off uint64) {
	t.each(addr, func(r *rng, o uint64) {
		if home == nil || (home.guard == nil && r.guard != nil) ||
			(r.guard != nil && home.guard != nil && compareRefs(*r.guard, *home.guard) < 0) {
			home, off = r, o
		}
	})
	return home, off
}

// readyHome returns a ready range that holds addr, or nil.
func (t *table) readyHome(addr netip.Addr) *rng {
	if r, _ := t.home(addr); r != nil && r.guard != nil {
		return r
	}
	return nil
}

// eachBlocker calls fn with every address the index sees allocated in cidrs and in no
// ready range, until fn returns false.
func (t *table) eachBlocker(cidrs []netip.Prefix, fn func(addr netip.Addr) bool) {
	more := true
	for _, p := range cidrs {
		r := t.byPrefix[p]
		if r == nil || !more {
			continue
		}
		r.EachUsed(func(off uint64) {
			if addr := r.span.addr(off); more && t.readyHome(addr) == nil {
				more = fn(addr)
			}
		})
	}
}

// freed records that r, a range of t, has room again: picks look at it first.
func (t *table) freed(r *rng) {
	if r.kind != KindClusterIP || r.readyIdx < 0 {
		return
	}
	c := &t.cursor[famIndex(r.span.is4)]
	for {
		cur := c.Load()
		if r.readyIdx >= cur || c.CompareAndSwap(cur, r.readyIdx) {
			return
		}
	}
}

// rangeNamesOf describes rs for a message: "10.0.0.0/28 (kubernetes), 10.1.0.0/24 (extra)".
func rangeNamesOf(rs []*rng) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		var objs []string
		for _, ref := range r.refs {
			objs = append(objs, ref.name)
		}
		s[i] = r.name + " (" + strings.Join(objs, ", ") + ")"
	}
	return strings.Join(s, ", ")
}

// newIPRangeFor returns a new range of p with its own bitmap.
func newIPRangeFor(p netip.Prefix) *rng {
	s := newIPSpan(p)
	return &rng{Bitmap: bitmap.New(s.size, ipBand(s.total)), name: s.prefix.String(), kind: KindClusterIP,
		span: s}
}

func familyOf(addr netip.Addr) Family {
	if addr.Is4() {
		return IPv4
	}
	return IPv6
}
