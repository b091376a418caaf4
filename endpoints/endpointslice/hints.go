package endpointslice

import (
	"maps"
	"slices"

	"github.com/allocd/allocd/endpoints/kube"
)

// This file holds what the hints share: the slices of one address type being written
// (sliceInfo), the removal of hints, an endpoint's readiness, and whether a Service
// asks for topology hints. Reconciler.hints (reconcile.go) chooses, as upstream's
// reconcileByAddressType does after placing endpoints: topology-aware hints for a
// Service annotated service.kubernetes.io/topology-mode: Auto (topology.go, upstream's
// topologycache/), else the hints of spec.trafficDistribution (trafficdist.go, upstream's
// trafficdist/), else none. Kubernetes iterates maps where a choice is made (which zone
// receives an endpoint); allocd walks zones in name order, so the same inputs give the
// same hints.

// HintsEnabled reports whether a Service's annotations ask for topology hints: the
// deprecated topology-aware-hints annotation when present, else topology-mode, "Auto"
// or "auto".
func HintsEnabled(annotations map[string]string) bool {
	v, ok := annotations[kube.AnnotationTopologyAwareHints]
	if !ok {
		v = annotations[kube.AnnotationTopologyMode]
	}
	return v == "Auto" || v == "auto"
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
		cp := clone(s)
		for i := range cp.Endpoints {
			cp.Endpoints[i].Hints = nil
		}
		si.toUpdate = append(si.toUpdate, cp)
	}
	si.unchanged = si.unchanged[:j]
}

// EndpointReady is the endpoint's Ready condition (unset is false, as consumers of hints
// read it).
func EndpointReady(e *kube.SliceEndpoint) bool { return e.Ready != nil && *e.Ready }

// clone copies s with its own endpoints, labels and annotations, to be changed.
func clone(s *kube.EndpointSlice) *kube.EndpointSlice {
	cp := *s
	cp.Endpoints = append([]kube.SliceEndpoint(nil), s.Endpoints...)
	cp.Labels = maps.Clone(s.Labels)
	cp.Annotations = maps.Clone(s.Annotations)
	return &cp
}
