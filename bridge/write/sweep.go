package write

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ResetError is a sweep held off: allocd's listing lacks every object of a Service
// that exists in the cluster with a selector and whose objects allocd's controller
// wrote. allocd then looks reset (restored from a backup, restarted on an empty data
// directory, not yet fed the cluster): deleting what its listing lacks would delete
// the Endpoints of live Services.
type ResetError struct {
	// Service is namespace/name of the first such Service.
	Service string
	// Lacking is how many of the cluster's objects allocd lacks for such Services.
	Lacking int
}

func (e *ResetError) Error() string {
	return fmt.Sprintf("allocd's listing has no object of Service %s (and %d more objects of live Services "+
		"with a selector): allocd looks reset or behind; not sweeping", e.Service, e.Lacking-1)
}

// leftovers returns the keys of the cluster's objects of k that allocd's controller
// manages and that allocd's listing (listed, its objects by key; serviceOf names an
// object's Service) lacks, when their Service is gone or has a selector (as
// kube-controller-manager's checkLeftoverEndpoints and its EndpointSlice reconciler: a
// Service without a selector keeps what someone else wrote). The kubernetes Service's
// objects are never swept. A *ResetError when allocd lacks every object of a live
// Service with a selector: nothing is swept then.
func leftovers[A Object, C ClusterObject](k *clusterKind[A, C], listed map[string]A,
	serviceOf func(A) string) ([]string, error) {
	have := map[string]bool{}
	for _, o := range listed {
		have[serviceOf(o)] = true
	}
	var stale []string
	var reset *ResetError
	for _, o := range k.cachedAll() {
		key, svcKey := o.GetNamespace()+"/"+o.GetName(), k.rules.service(o)
		if _, ok := listed[key]; ok || !k.rules.managed(o) || svcKey == kubernetesKey ||
			strings.HasSuffix(svcKey, "/") { // a slice without its service-name label
			continue
		}
		s, exists := k.service(svcKey)
		if !exists {
			stale = append(stale, key) // the Service is gone
			continue
		}
		if s.Spec.Selector == nil || s.Spec.Type == corev1.ServiceTypeExternalName {
			continue // upstream leaves these alone
		}
		if !have[svcKey] {
			if reset == nil {
				reset = &ResetError{Service: svcKey}
			}
			reset.Lacking++
			continue
		}
		stale = append(stale, key)
	}
	if reset != nil {
		return nil, reset
	}
	return stale, nil
}
