package endpointslice

import "github.com/allocd/allocd/endpoints/kube"

// This file gives the hints of spec.trafficDistribution, as k8s.io/endpointslice's
// trafficdist/ (ReconcileHints and preferCloseHeuristic in trafficdist.go).

// ValidTrafficDistribution reports whether td is a trafficDistribution the controller
// acts on (every value of v1.37: PreferSameZone and PreferSameNode are GA since v1.35).
func ValidTrafficDistribution(td string) bool {
	return td == kube.TrafficPreferClose || td == kube.TrafficPreferSameZone ||
		td == kube.TrafficPreferSameNode
}

// closeHintsNeedUpdate reports whether a ready endpoint of s lacks the hints of
// PreferClose / PreferSameZone (its zone) or PreferSameNode (also its node), or has
// hints it should not.
func closeHintsNeedUpdate(s *kube.EndpointSlice, sameNode bool) bool {
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if !EndpointReady(e) {
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
		if !EndpointReady(e) {
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
