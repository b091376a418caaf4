package endpoints

import (
	"maps"
	"math"
	"slices"

	"github.com/allocd/allocd/endpoints/kube"
)

// This file sets the hints of endpoints: topology-aware hints for a Service annotated
// service.kubernetes.io/topology-mode: Auto (the library's topologycache, reference
// a.10) and the hints of spec.trafficDistribution (trafficdist, a.11). Kubernetes
// iterates maps where a choice is made (which zone receives an endpoint); allocd walks
// zones in name order, so the same inputs give the same hints.

// overloadThreshold is how far a zone may be under its share of endpoints.
const overloadThreshold = 0.2

// hintsEnabled reports whether a Service's annotations ask for topology hints: the
// deprecated topology-aware-hints annotation when present, else topology-mode, "Auto"
// or "auto".
func hintsEnabled(annotations map[string]string) bool {
	v, ok := annotations[kube.AnnotationTopologyAwareHints]
	if !ok {
		v = annotations[kube.AnnotationTopologyMode]
	}
	return v == "Auto" || v == "auto"
}

// validTrafficDistribution reports whether td is a trafficDistribution the controller
// acts on (every value of v1.37: PreferSameZone and PreferSameNode are GA since v1.35).
func validTrafficDistribution(td string) bool {
	return td == kube.TrafficPreferClose || td == kube.TrafficPreferSameZone || td == kube.TrafficPreferSameNode
}

// hints sets or clears the hints of the slices of one address type, as the reconciler
// does after placing endpoints: Auto hints when the annotation asks for them, else
// trafficDistribution's, else none (unchanged slices that carry hints are then
// updated to lose them).
func (r *sliceReconcile) hints(addrType string, creates, updates, unchanged []*kube.EndpointSlice) ([]*kube.EndpointSlice, []*kube.EndpointSlice) {
	auto := hintsEnabled(r.svc.Annotations)
	td := validTrafficDistribution(r.svc.TrafficDistribution) && !auto
	si := &sliceInfo{toCreate: creates, toUpdate: updates, unchanged: unchanged}
	switch {
	case auto:
		si.addTopologyHints(r.topology)
		return si.toCreate, si.toUpdate
	case !td:
		si.removeHints()
		return si.toCreate, si.toUpdate
	}
	sameNode := r.svc.TrafficDistribution == kube.TrafficPreferSameNode
	for _, s := range si.unchanged {
		if closeHintsNeedUpdate(s, sameNode) {
			si.toUpdate = append(si.toUpdate, cloneSlice(s))
		}
	}
	for _, s := range append(slices.Clip(si.toCreate), si.toUpdate...) {
		setCloseHints(s, sameNode)
	}
	return si.toCreate, si.toUpdate
}

// sliceInfo is the library's topologycache.SliceInfo: the slices of one address type
// of one sync.
type sliceInfo struct {
	toCreate, toUpdate, unchanged []*kube.EndpointSlice
}

// removeHints clears the hints of the slices written, and moves the unchanged slices
// that have hints to the updates, without them (RemoveHintsFromSlices).
func (si *sliceInfo) removeHints() {
	for _, s := range append(slices.Clip(si.toCreate), si.toUpdate...) {
		for i := range s.Endpoints {
			s.Endpoints[i].Hints = nil
		}
	}
	j := 0
	for _, s := range si.unchanged {
		if !slices.ContainsFunc(s.Endpoints, func(e kube.SliceEndpoint) bool { return e.Hints != nil }) {
			si.unchanged[j] = s
			j++
			continue
		}
		cp := cloneSlice(s)
		for i := range cp.Endpoints {
			cp.Endpoints[i].Hints = nil
		}
		si.toUpdate = append(si.toUpdate, cp)
	}
	si.unchanged = si.unchanged[:j]
}

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
			if !endpointReady(e) {
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
			si.toUpdate = append(si.toUpdate, cloneSlice(s))
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
func hintsByZone(s *kube.EndpointSlice, allocated map[string]int, allocs map[string]allocation) map[string]int {
	out := map[string]int{}
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if !endpointReady(e) {
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
func givingAndReceivingZones(allocs map[string]allocation, allocated map[string]int) (giving, receiving map[string]int) {
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
			if !endpointReady(e) {
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
		if endpointReady(&s.Endpoints[i]) {
			n++
		}
	}
	return n
}

// closeHintsNeedUpdate reports whether a ready endpoint of s lacks the hints of
// PreferClose / PreferSameZone (its zone) or PreferSameNode (also its node), or has
// hints it should not.
func closeHintsNeedUpdate(s *kube.EndpointSlice, sameNode bool) bool {
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if !endpointReady(e) {
			continue
		}
		var zones, nodes []string
		if e.Hints != nil {
			zones, nodes = e.Hints.ForZones, e.Hints.ForNodes
		}
		if e.Zone != "" {
			if len(zones) != 1 || zones[0] != e.Zone {
				return true
			}
		} else if len(zones) > 0 {
			return true
		}
		if e.NodeName != "" && sameNode {
			if len(nodes) != 1 || nodes[0] != e.NodeName {
				return true
			}
		} else if len(nodes) > 0 {
			return true
		}
	}
	return false
}

// setCloseHints gives every ready endpoint of s its zone (and, for PreferSameNode, its
// node) as hint; none when it has neither. Not-ready endpoints keep theirs.
func setCloseHints(s *kube.EndpointSlice, sameNode bool) {
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if !endpointReady(e) {
			continue
		}
		var h kube.Hints
		if e.Zone != "" {
			h.ForZones = []string{e.Zone}
		}
		if e.NodeName != "" && sameNode {
			h.ForNodes = []string{e.NodeName}
		}
		e.Hints = nil
		if h.ForZones != nil || h.ForNodes != nil {
			e.Hints = &h
		}
	}
}
