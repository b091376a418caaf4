package endpoints

import (
	"sync"
	"time"

	"github.com/allocd/allocd/endpoints/kube"
)

// TriggerTracker computes the endpoints.kubernetes.io/last-change-trigger-time of a
// sync as Kubernetes' TriggerTimeTracker: for a Service it has not seen (the first
// sync of the term, or after the Service was deleted), the Service's creation time;
// else the earliest of the Service's creation time and its Pods' Ready transition
// times that moved forward since the previous sync; zero when none did. It is safe for
// concurrent use.
type TriggerTracker struct {
	mu       sync.Mutex
	services map[string]*triggerState
}

type triggerState struct {
	service time.Time
	pods    map[string]time.Time
}

// NewTriggerTracker returns an empty tracker.
func NewTriggerTracker() *TriggerTracker {
	return &TriggerTracker{services: map[string]*triggerState{}}
}

// Compute returns the trigger time of a sync of svc over pods (every selected Pod,
// included in the Endpoints or not) and remembers the times seen.
func (t *TriggerTracker) Compute(svc *kube.Service, pods []*kube.Pod) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	key := svc.Key()
	st, known := t.services[key]
	if st == nil {
		st = &triggerState{}
	}
	var earliest time.Time
	earlier := func(x time.Time) {
		if earliest.IsZero() || x.Before(earliest) {
			earliest = x
		}
	}
	var pt map[string]time.Time // nil while no Pod has a time: most feeds send none
	for _, p := range pods {
		if p.ReadyTransitionTime.IsZero() {
			continue
		}
		if pt == nil {
			pt = make(map[string]time.Time, len(pods))
		}
		pt[p.Name] = p.ReadyTransitionTime
		if p.ReadyTransitionTime.After(st.pods[p.Name]) {
			earlier(p.ReadyTransitionTime)
		}
	}
	if svc.CreationTime.After(st.service) {
		earlier(svc.CreationTime)
	}
	t.services[key] = &triggerState{service: svc.CreationTime, pods: pt}
	if !known {
		return svc.CreationTime
	}
	return earliest
}

// Forget drops what the tracker knows of the Service "namespace/name".
func (t *TriggerTracker) Forget(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.services, key)
}
