package endpoints

import (
	"sort"

	"github.com/allocd/allocd/endpoints/kube"
)

// managed reports whether the EndpointSlice controller manages s.
func managed(s *kube.EndpointSlice) bool {
	return s.Labels[kube.LabelSliceManagedBy] == kube.SliceControllerName
}

// cloneSlice copies s with its own Endpoints and Labels, to be changed.
func cloneSlice(s *kube.EndpointSlice) *kube.EndpointSlice {
	cp := *s
	cp.Endpoints = append([]kube.SliceEndpoint(nil), s.Endpoints...)
	cp.Labels = copyMap(s.Labels)
	cp.Annotations = copyMap(s.Annotations)
	return &cp
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// endpointReady is the endpoint's Ready condition (unset is false, as consumers of hints
// read it).
func endpointReady(e *kube.SliceEndpoint) bool { return e.Ready != nil && *e.Ready }

// sortSlicePorts sorts ports by name, protocol and number: the order allocd writes.
// (Kubernetes sorts them by a hash of each; consumers take them as a set.)
func sortSlicePorts(ps []kube.Port) {
	sort.Slice(ps, func(i, j int) bool {
		a, b := ps[i], ps[j]
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		if a.Protocol != b.Protocol {
			return a.Protocol < b.Protocol
		}
		return a.Port < b.Port
	})
}
