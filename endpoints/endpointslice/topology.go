package endpointslice

import (
	"maps"
	"math"
	"slices"

	"github.com/allocd/allocd/endpoints/kube"
)

// This file gives topology-aware hints, as k8s.io/endpointslice's topologycache/
// (TopologyCache.SetNodes and AddHints in topologycache.go, utils.go and sliceinfo.go):
// each zone gets a share of a Service's ready endpoints in proportion to its Nodes'
// CPU.

// CPURatiosByZone returns each zone's share of the allocatable CPU of the Nodes that
// are ready and not of the control plane (TopologyCache.SetNodes), nil when such a Node
// lacks a zone or CPU, or fewer than two zones have any.
func CPURatiosByZone(nodes map[string]*kube.Node) map[string]float64 {
	byZone := map[string]int64{}
	var total int64
	for _, n := range nodes {
		if _, cp := n.Labels[kube.LabelControlPlane]; cp {
			continue
		}
		if _, m := n.Labels[kube.LabelMaster]; m || !n.Ready {
			continue
		}
		zone := n.Zone()
		if zone == "" || n.AllocatableCPUMillis <= 0 {
			return nil
		}
		byZone[zone] += n.AllocatableCPUMillis
		total += n.AllocatableCPUMillis
	}
	if total == 0 || len(byZone) < 2 {
		return nil
	}
	out := make(map[string]float64, len(byZone))
	for z, cpu := range byZone {
		out[z] = float64(cpu) / float64(total)
	}
	return out
}

// overloadThreshold is how far a zone may be under its share of endpoints.
const overloadThreshold = 0.2

// allocation of endpoints to a zone.
type allocation struct {
	minimum, maximum int
	desired          float64
}

// allocations are the zones' shares of n ready endpoints (getAllocations), false when
// hints cannot be given: not enough Node information, fewer than two zones, more zones
// than endpoints, or minimums that add up to more than n.
func allocations(ratios map[string]float64, n int) (map[string]allocation, bool) {
	if len(ratios) < 2 || len(ratios) > n {
		return nil, false
	}
	out := make(map[string]allocation, len(ratios))
	minTotal := 0
	for zone, ratio := range ratios {
		desired := ratio * float64(n)
		minimum := int(math.Ceil(desired * (1 / (1 + overloadThreshold))))
		out[zone] = allocation{minimum: minimum, desired: math.Max(desired, float64(minimum))}
		minTotal += minimum
	}
	if minTotal > n {
		return nil, false
	}
	for zone, a := range out {
		a.maximum = a.minimum + n - minTotal
		out[zone] = a
	}
	return out, true
}

// addTopologyHints gives every ready endpoint of the slices written a hint for its own
// zone, keeps the hints of unchanged slices that are still within their zones'
// maximums (the others are written too), then moves endpoints from zones over their
// share to zones under it (AddHints). Hints are removed instead when they cannot be
// given, or a ready endpoint has no zone.
func (si *sliceInfo) addTopologyHints(ratios map[string]float64) {
	total := 0
	for _, group := range [][]*kube.EndpointSlice{si.toCreate, si.toUpdate, si.unchanged} {
		for _, s := range group {
			total += readyEndpoints(s)
		}
	}
	allocs, ok := allocations(ratios, total)
	if !ok {
		si.removeHints()
		return
	}
	allocated := si.allocatedHintsByZone(allocs)
	writable := append(slices.Clip(si.toCreate), si.toUpdate...)
	for _, s := range writable {
		for i := range s.Endpoints {
			e := &s.Endpoints[i]
			if !EndpointReady(e) {
				continue // as upstream: a not-ready endpoint keeps what it has
			}
			if e.Zone == "" {
				si.removeHints()
				return
			}
			allocated[e.Zone]++
			e.Hints = &kube.Hints{ForZones: []string{e.Zone}}
		}
	}
	giving, receiving := givingAndReceivingZones(allocs, allocated)
	for zone, diff := range redistributeHints(writable, giving, receiving) {
		allocated[zone] += diff
	}
	if len(allocated) == 0 {
		si.removeHints()
	}
}

// allocatedHintsByZone counts the hints of the unchanged slices that keep theirs, and
// moves those that cannot keep them (a ready endpoint without a zone hint, a hint for
// an unknown zone, or more hints than a zone's maximum) to the updates.
func (si *sliceInfo) allocatedHintsByZone(allocs map[string]allocation) map[string]int {
	allocated := map[string]int{}
	j := 0
	for _, s := range si.unchanged {
		byZone := hintsByZone(s, allocated, allocs)
		if byZone == nil {
			si.toUpdate = append(si.toUpdate, clone(s))
			continue
		}
		si.unchanged[j] = s
		j++
		for z, n := range byZone {
			allocated[z] += n
		}
	}
	si.unchanged = si.unchanged[:j]
	return allocated
}

// hintsByZone counts the zone hints of the ready endpoints of s, nil when they cannot
// stay (getHintsByZone).
func hintsByZone(s *kube.EndpointSlice, allocated map[string]int,
	allocs map[string]allocation) map[string]int {
	out := map[string]int{}
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if !EndpointReady(e) {
			continue
		}
		if e.Hints == nil || len(e.Hints.ForZones) == 0 {
			return nil
		}
		for _, z := range e.Hints.ForZones {
			if _, ok := allocs[z]; !ok {
				return nil
			}
			out[z]++
		}
	}
	for z, n := range out {
		if a, ok := allocs[z]; !ok || n+allocated[z] > a.maximum {
			return nil
		}
	}
	return out
}

// givingAndReceivingZones says how many endpoints each zone over its desired share
// gives and each zone under it receives: one at a time between the zones furthest
// off, while both are off by at least half an endpoint and one by a whole one.
func givingAndReceivingZones(allocs map[string]allocation,
	allocated map[string]int) (giving, receiving map[string]int) {
	over, under := map[string]float64{}, map[string]float64{}
	for zone, a := range allocs {
		switch n := float64(allocated[zone]); {
		case n > a.desired:
			over[zone] = n - a.desired
		case n < a.desired:
			under[zone] = a.desired - n
		}
	}
	giving, receiving = map[string]int{}, map[string]int{}
	for {
		gz, give := most(over)
		rz, take := most(under)
		if gz == "" || rz == "" || (give < 1 && take < 1) || give < 0.5 || take < 0.5 {
			return giving, receiving
		}
		giving[gz]++
		over[gz]--
		receiving[rz]++
		under[rz]--
	}
}

// most returns the zone with the largest positive value, the first in name order among
// equals ("" when none is positive).
func most(zones map[string]float64) (string, float64) {
	zone, n := "", 0.0
	for _, z := range slices.Sorted(maps.Keys(zones)) {
		if zones[z] > n {
			zone, n = z, zones[z]
		}
	}
	return zone, n
}

// redistributeHints moves the hints of ready endpoints of giving zones to receiving
// zones (in zone name order) and returns the change of each zone's count.
func redistributeHints(writable []*kube.EndpointSlice, giving, receiving map[string]int) map[string]int {
	diff := map[string]int{}
	for _, s := range writable {
		for i := range s.Endpoints {
			e := &s.Endpoints[i]
			if !EndpointReady(e) {
				continue
			}
			if len(giving) == 0 || len(receiving) == 0 {
				return diff
			}
			if e.Zone == "" || giving[e.Zone] == 0 {
				continue
			}
			for _, rz := range slices.Sorted(maps.Keys(receiving)) {
				e.Hints = &kube.Hints{ForZones: []string{rz}}
				take(giving, e.Zone)
				take(receiving, rz)
				diff[rz]++
				diff[e.Zone]--
				break
			}
		}
	}
	return diff
}

// take counts one down in m[k], removing k at zero.
func take(m map[string]int, k string) {
	if m[k] <= 1 {
		delete(m, k)
		return
	}
	m[k]--
}

func readyEndpoints(s *kube.EndpointSlice) int {
	n := 0
	for i := range s.Endpoints {
		if EndpointReady(&s.Endpoints[i]) {
			n++
		}
	}
	return n
}
