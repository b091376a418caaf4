package write

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
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

// clusterObject is what a sweep reads of one of the cluster's objects.
type clusterObject struct {
	key     string // namespace/name of the object
	service string // namespace/name of its Service
	managed bool   // it carries the managed-by label the bridge writes
}

// leftovers returns the keys of the cluster's objects (objs, described by describe)
// that allocd's controller manages and that allocd's listing (listed, its objects by
// key; serviceOf names an object's Service) lacks, when their Service is gone or has a
// selector (as kube-controller-manager's checkLeftoverEndpoints and its EndpointSlice
// reconciler: a Service without a selector keeps what someone else wrote). The
// kubernetes Service's objects are never swept. A *ResetError when allocd lacks every
// object of a live Service with a selector: nothing is swept then.
func leftovers(objs []any, describe func(any) clusterObject, services cache.Store,
	listed map[string]any, serviceOf func(any) string) ([]string, error) {
	have := map[string]bool{}
	for _, o := range listed {
		have[serviceOf(o)] = true
	}
	var stale []string
	var reset *ResetError
	for _, o := range objs {
		c := describe(o)
		if _, ok := listed[c.key]; ok || !c.managed || c.service == kubernetesKey {
			continue
		}
		svc, exists, _ := services.GetByKey(c.service)
		if !exists {
			stale = append(stale, c.key) // the Service is gone
			continue
		}
		s := svc.(*corev1.Service)
		if s.Spec.Selector == nil || s.Spec.Type == corev1.ServiceTypeExternalName {
			continue // upstream leaves these alone
		}
		if !have[c.service] {
			if reset == nil {
				reset = &ResetError{Service: c.service}
			}
			reset.Lacking++
			continue
		}
		stale = append(stale, c.key)
	}
	if reset != nil {
		return nil, reset
	}
	return stale, nil
}

// leftAlone reports whether the objects of the Service namespace/name are not the
// bridge's to write: the Service exists without a selector (its Endpoints are kept by
// someone else, as upstream's controllers leave them; allocd keeps its last computed
// object, which must not be written over theirs). The kubernetes Service, whose
// Endpoints the bridge writes from master leases when asked to, is not left alone.
func leftAlone(services cache.Store, key string) bool {
	if key == kubernetesKey {
		return false
	}
	obj, exists, _ := services.GetByKey(key)
	return exists && obj.(*corev1.Service).Spec.Selector == nil
}
