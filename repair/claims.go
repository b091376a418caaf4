package repair

import (
	"net/netip"
	"slices"

	"github.com/allocd/allocd/allocator"
)

// A pass reads from etcd only what it judges: it hands the allocator one claim per item
// its Services use (gather), the allocator marks those it shows held by the Service
// that uses them and reads the rest (allocator.ListExcept), and the pass builds its
// state (collect) for the items it has to judge only (judged).

// eachItem calls item with every item the snapshot's Services use, in order, and bad
// with every ClusterIP that does not parse.
func (p *passRun) eachItem(item func(svc int32, it allocator.Item, raw string),
	bad func(svc *Service, raw string)) {
	svcs := p.snap.Services
	for i := range svcs {
		svc := &svcs[i]
		for _, raw := range svc.ClusterIPs {
			if raw == "" || raw == "None" {
				continue // headless
			}
			a, err := netip.ParseAddr(raw)
			if err != nil || a.Zone() != "" {
				bad(svc, raw)
				continue
			}
			item(int32(i), allocator.IP(a), raw)
		}
		for _, np := range svc.NodePorts {
			if np.Port != 0 {
				item(int32(i), allocator.Port(np.Port), "")
			}
		}
		if svc.HealthCheckNodePort != 0 {
			item(int32(i), allocator.Port(svc.HealthCheckNodePort), "")
		}
	}
}

// gather returns a claim of every item the snapshot's Services use, in eachItem's
// order, naming the Service as its holder; the kubernetes address and node port name
// none: the pass judges them whoever holds them.
func (p *passRun) gather() []allocator.Claim {
	kube := [2]allocator.ItemKey{allocator.IP(p.ranges.KubernetesIP).Key(),
		allocator.Port(p.ranges.KubernetesNodePort).Key()}
	n := 0
	for i := range p.snap.Services {
		s := &p.snap.Services[i]
		n += len(s.ClusterIPs) + len(s.NodePorts) + 1
	}
	cl := make([]allocator.Claim, 0, n)
	last, h := int32(-1), uint64(0)
	p.eachItem(func(svc int32, it allocator.Item, _ string) {
		if svc != last {
			last, h = svc, allocator.HolderHash(p.snap.Services[svc].UID)
		}
		c := allocator.Claim{Key: it.Key(), Holder: h}
		if c.Key == kube[0] || c.Key == kube[1] {
			c.Holder = 0
		}
		cl = append(cl, c)
	}, func(*Service, string) {})
	return cl
}

// judged returns which claims (by place) the pass judges: those ListExcept did not mark
// held, and those of an item it read (another Service uses it, or it was listed). It
// makes the pass's slots, sized for them.
func (p *passRun) judged(cl []allocator.Claim, held []bool) func(i int) bool {
	if !slices.Contains(held, true) {
		p.slots = make(map[allocator.ItemKey]slot, len(cl))
		return func(int) bool { return true }
	}
	read := make(map[allocator.ItemKey]struct{}, len(p.allocs))
	for i := range p.allocs {
		read[p.allocs[i].Item.Key()] = struct{}{}
	}
	for i := range cl {
		if !held[i] {
			read[cl[i].Key] = struct{}{}
		}
	}
	p.slots = make(map[allocator.ItemKey]slot, len(read))
	return func(i int) bool {
		if !held[i] {
			return true
		}
		_, ok := read[cl[i].Key]
		return ok
	}
}
