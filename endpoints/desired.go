package endpoints

import (
	"maps"
	"math"
	"time"

	"github.com/allocd/allocd/endpoints/kube"
)

// MaxAddresses is the cap on address entries (ready and not-ready, over every subset)
// of one Endpoints object.
const MaxAddresses = 1000

// truncate cuts subsets to at most max address entries as Kubernetes does (v1.22+):
// when the ready ones fit, every ready address is kept and the rest of the budget is
// shared over the not-ready lists in proportion to their sizes (each share rounded up,
// capped by what is left, in subset order); otherwise every not-ready address goes and
// max is shared over the ready lists the same way. Each list keeps its first entries.
// subsets is not modified; truncated is false (and out is subsets) when they fit.
func truncate(subsets []kube.Subset, max int) (out []kube.Subset, truncated bool) {
	ready, notReady := CountAddresses(subsets)
	if ready+notReady <= max {
		return subsets, false
	}
	truncateReady := ready > max
	budget, total := max-ready, notReady
	if truncateReady {
		budget, total = max, ready
	}
	left := budget
	out = make([]kube.Subset, len(subsets))
	for i, s := range subsets {
		n := len(s.NotReadyAddresses)
		if truncateReady {
			n = len(s.Addresses)
		}
		take := int(math.Ceil(float64(n) / float64(total) * float64(budget)))
		take = min(take, left)
		if truncateReady {
			s.Addresses = s.Addresses[:min(take, len(s.Addresses)):min(take, len(s.Addresses))]
			s.NotReadyAddresses = nil
			left -= len(s.Addresses)
		} else {
			s.NotReadyAddresses = s.NotReadyAddresses[:min(take, n):min(take, n)]
			left -= len(s.NotReadyAddresses)
		}
		out[i] = s
	}
	return out, true
}

// Desired is the object to store for svc, built from its computed subsets (canonical,
// not truncated), the object stored now (nil when none; never modified) and the
// trigger time (zero when none), as kube-controller-manager builds it: the Service's
// labels with the managed-by label and, for a headless Service, the headless label;
// the stored annotations with the trigger time set or removed and the over-capacity
// annotation set or removed; the subsets truncated to MaxAddresses.
func Desired(svc *kube.Service, subsets []kube.Subset, current *kube.Endpoints,
	trigger time.Time) *kube.Endpoints {
	e := &kube.Endpoints{
		Namespace:  svc.Namespace,
		Name:       svc.Name,
		ServiceUID: svc.UID,
		ManagedBy:  kube.ManagedByController,
	}
	e.Labels = make(map[string]string, len(svc.Labels)+2)
	maps.Copy(e.Labels, svc.Labels)
	e.Labels[kube.LabelManagedBy] = kube.ControllerName
	if svc.Headless() {
		e.Labels[kube.LabelHeadless] = ""
	} else {
		delete(e.Labels, kube.LabelHeadless)
	}
	ann := map[string]string{}
	if current != nil {
		maps.Copy(ann, current.Annotations)
	}
	if trigger.IsZero() {
		delete(ann, kube.AnnotationTriggerTime)
	} else {
		ann[kube.AnnotationTriggerTime] = trigger.UTC().Format(time.RFC3339Nano)
	}
	ready, notReady := CountAddresses(subsets)
	e.AddressCount = ready + notReady
	var truncated bool
	e.Subsets, truncated = truncate(subsets, MaxAddresses)
	if truncated {
		ann[kube.AnnotationOverCapacity] = kube.Truncated
	} else {
		delete(ann, kube.AnnotationOverCapacity)
	}
	if len(ann) > 0 {
		e.Annotations = ann
	}
	return e
}

// NeedsWrite reports whether desired must be written over current (kube-controller-
// manager's skip check): always when nothing is stored; else when the subsets differ,
// the labels differ (the headless label aside: a wrong headless label alone causes no
// write, as upstream), the over-capacity annotation differs, or allocd's ownership
// bookkeeping differs. The trigger-time annotation alone never causes a write. allocd's
// deviation: the comparison is made after truncation, so a truncated object that did
// not change is not rewritten on every sync (upstream rewrites it, #127370).
func NeedsWrite(current, desired *kube.Endpoints) bool {
	switch {
	case current == nil:
		return true
	case current.ServiceUID != desired.ServiceUID || current.ManagedBy != desired.ManagedBy:
		return true
	case !subsetsEqual(current.Subsets, desired.Subsets):
		return true
	case current.Annotations[kube.AnnotationOverCapacity] != desired.Annotations[kube.AnnotationOverCapacity]:
		return true
	}
	_, curHas := current.Annotations[kube.AnnotationOverCapacity]
	_, desHas := desired.Annotations[kube.AnnotationOverCapacity]
	if curHas != desHas {
		return true
	}
	return !labelsEqualButHeadless(current.Labels, desired.Labels)
}

func labelsEqualButHeadless(a, b map[string]string) bool {
	n := 0
	for k, v := range a {
		if k == kube.LabelHeadless {
			continue
		}
		if w, ok := b[k]; !ok || w != v {
			return false
		}
		n++
	}
	m := len(b)
	if _, ok := b[kube.LabelHeadless]; ok {
		m--
	}
	return n == m
}
