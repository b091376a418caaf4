package endpointslice

import (
	"cmp"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/allocd/allocd/endpoints/kube"
)

// This file places a Service's endpoints into slices: k8s.io/endpointslice's
// Reconciler.Reconcile, reconcileByAddressType, reconcileByPortMapping and finalize
// (reconciler.go), with every choice made deterministic (upstream picks from maps).
// Existing endpoints stay in their slices, so an endpoint never moves; a slice is
// written only when its endpoints or its labels change; new endpoints fill the slices
// already being written, fullest first, then the unchanged slice that fits them best,
// then new slices; a slice to create takes the name of a slice to delete
// ("recycling"), so nothing is deleted and created again.

// Reconciler is what one sync of a Service's slices knows; Reconcile plans the writes
// that make the stored slices what it wants. It does no I/O and changes none of its
// inputs.
type Reconciler struct {
	Service *kube.Service
	// Desired is what the Service's Pods make of its slices (Desire).
	Desired *Desired
	// Existing are the stored slices of the Service that the controller manages,
	// sorted by name; Taken are the names of every slice stored under the Service
	// (managed or not: a new slice takes none of them).
	Existing []*kube.EndpointSlice
	Taken    map[string]bool
	// MaxEndpointsPerSlice is the most endpoints a slice holds.
	MaxEndpointsPerSlice int
	// TriggerTime is the last-change-trigger-time of the slices written (zero: none).
	TriggerTime time.Time
	// Topology is the zones' shares of the Nodes' CPU for topology hints
	// (CPURatiosByZone; nil: not enough Node information).
	Topology map[string]float64
}

// Plan is what a sync writes: the slices to create, to update (each conditioned on its
// stored revision) and to delete, in the order a write larger than one transaction
// commits them.
type Plan struct {
	Creates, Updates, Deletes []*kube.EndpointSlice
	// Added and Removed count the endpoints placed in a slice and taken out of one.
	Added, Removed int
	// Efficiency has, per address type and port key, the endpoints desired and the
	// slices there will be (the metrics).
	Efficiency map[string]Efficiency
}

// Efficiency of one group of slices: its endpoints, and the slices that hold them.
type Efficiency struct{ Endpoints, Slices int }

// Writes counts the slices the plan writes.
func (p *Plan) Writes() int { return len(p.Creates) + len(p.Updates) + len(p.Deletes) }

// Reconcile returns the plan that makes the stored slices what r wants.
func (r *Reconciler) Reconcile() *Plan {
	plan := &Plan{Efficiency: map[string]Efficiency{}}
	types := addressTypes(r.Service)
	byType := map[string][]*kube.EndpointSlice{}
	var dropped []*kube.EndpointSlice
	for _, s := range r.Existing {
		if !slices.Contains(types, s.AddressType) {
			dropped = append(dropped, s) // a family the Service no longer has
			continue
		}
		byType[s.AddressType] = append(byType[s.AddressType], s)
	}
	for _, t := range types {
		r.reconcileType(plan, t, byType[t])
	}
	plan.Deletes = append(plan.Deletes, dropped...)
	r.name(plan)
	for _, s := range plan.Creates {
		r.stamp(s)
	}
	for _, s := range plan.Updates {
		r.stamp(s)
	}
	return plan
}

// reconcileType plans the slices of one address type.
func (r *Reconciler) reconcileType(plan *Plan, addrType string, existing []*kube.EndpointSlice) {
	var creates, updates, deletes []*kube.EndpointSlice
	byPorts := map[string][]*kube.EndpointSlice{}
	for _, s := range existing {
		if s.ServiceUID != r.Service.UID {
			deletes = append(deletes, s) // left by an earlier Service of the same name
			continue
		}
		k := portsKey(s.Ports)
		byPorts[k] = append(byPorts[k], s)
	}
	groups := r.Desired.groups[addrType]
	for _, key := range slices.Sorted(maps.Keys(groups)) {
		g := groups[key]
		c, u, d, added, removed := r.reconcileGroup(byPorts[key], g, addrType)
		creates, updates, deletes = append(creates, c...), append(updates, u...), append(deletes, d...)
		plan.Added += added
		plan.Removed += removed
		plan.Efficiency[addrType+"\x00"+key] = Efficiency{Endpoints: len(g.endpoints),
			Slices: len(byPorts[key]) + len(c) - len(d)}
	}
	for _, key := range slices.Sorted(maps.Keys(byPorts)) {
		if _, ok := groups[key]; !ok {
			deletes = append(deletes, byPorts[key]...) // a port group no Pod resolves any more
		}
	}
	if len(existing) == len(deletes) && len(creates) == 0 {
		// Every selector Service has a slice of each address type: an empty
		// placeholder, kept when the one slice to delete already is one.
		ph := r.newSlice(addrType, nil)
		if len(deletes) == 1 && isPlaceholderOf(deletes[0], ph) {
			deletes = deletes[:0]
		} else {
			creates = append(creates, ph)
		}
		plan.Efficiency[addrType+"\x00"] = Efficiency{Slices: 1}
	}
	unchanged := unchangedSlices(existing, updates, deletes)
	creates, updates = r.hints(addrType, creates, updates, unchanged)
	creates, updates, deletes = recycle(r.Service, creates, updates, deletes)
	plan.Creates = append(plan.Creates, creates...)
	plan.Updates = append(plan.Updates, updates...)
	plan.Deletes = append(plan.Deletes, deletes...)
}

// hints sets or clears the hints of the slices of one address type, as the reconciler
// does after placing endpoints: Auto hints when the annotation asks for them, else
// trafficDistribution's, else none (unchanged slices that carry hints are then
// updated to lose them).
func (r *Reconciler) hints(addrType string,
	creates, updates, unchanged []*kube.EndpointSlice) ([]*kube.EndpointSlice, []*kube.EndpointSlice) {
	auto := HintsEnabled(r.Service.Annotations)
	td := ValidTrafficDistribution(r.Service.TrafficDistribution) && !auto
	si := &sliceInfo{toCreate: creates, toUpdate: updates, unchanged: unchanged}
	switch {
	case auto:
		si.addTopologyHints(r.Topology)
		return si.toCreate, si.toUpdate
	case !td:
		si.removeHints()
		return si.toCreate, si.toUpdate
	}
	sameNode := r.Service.TrafficDistribution == kube.TrafficPreferSameNode
	for _, s := range si.unchanged {
		if closeHintsNeedUpdate(s, sameNode) {
			si.toUpdate = append(si.toUpdate, clone(s))
		}
	}
	for _, s := range append(slices.Clip(si.toCreate), si.toUpdate...) {
		setCloseHints(s, sameNode)
	}
	return si.toCreate, si.toUpdate
}

// reconcileGroup plans the slices of one port group (reconcileByPortMapping).
func (r *Reconciler) reconcileGroup(existing []*kube.EndpointSlice, g *group,
	addrType string) (creates, updates, deletes []*kube.EndpointSlice, added, removed int) {
	want := make(map[string]int, len(g.keys)) // key -> index in g, while not placed
	for i, k := range g.keys {
		want[k] = i
	}
	var unchanged []*kube.EndpointSlice
	for _, s := range existing {
		kept := make([]kube.SliceEndpoint, 0, len(s.Endpoints))
		changed := false
		for i := range s.Endpoints {
			k := endpointKey(&s.Endpoints[i])
			j, ok := want[k]
			if !ok {
				continue
			}
			kept = append(kept, g.endpoints[j])
			changed = changed || !equalBeyondKey(&g.endpoints[j], &s.Endpoints[i])
			delete(want, k)
		}
		labels, labelsChanged := r.sliceLabels(s)
		switch {
		case changed || len(kept) != len(s.Endpoints):
			removed += len(s.Endpoints) - len(kept)
			if len(kept) == 0 {
				deletes = append(deletes, s)
				continue
			}
			cp := clone(s)
			cp.Endpoints, cp.Labels = kept, labels
			updates = append(updates, cp)
		case labelsChanged:
			cp := clone(s)
			cp.Labels = labels
			updates = append(updates, cp)
		default:
			unchanged = append(unchanged, s)
		}
	}
	// What is left to place, in key order.
	rest := make([]kube.SliceEndpoint, 0, len(want))
	for i, k := range g.keys {
		if _, ok := want[k]; ok {
			rest = append(rest, g.endpoints[i])
		}
	}
	added = len(rest)
	// Fill the slices being written already, fullest first.
	slices.SortStableFunc(updates, func(a, b *kube.EndpointSlice) int {
		return cmp.Compare(len(b.Endpoints), len(a.Endpoints))
	})
	for _, s := range updates {
		n := min(r.MaxEndpointsPerSlice-len(s.Endpoints), len(rest))
		if n > 0 {
			s.Endpoints = append(s.Endpoints, rest[:n]...)
			rest = rest[n:]
		}
	}
	for len(rest) > 0 {
		var fill *kube.EndpointSlice
		if len(rest) < r.MaxEndpointsPerSlice && len(unchanged) > 0 {
			if i := sliceToFill(unchanged, len(rest), r.MaxEndpointsPerSlice); i >= 0 {
				fill = clone(unchanged[i])
				unchanged = slices.Delete(unchanged, i, i+1)
				updates = append(updates, fill)
			}
		}
		if fill == nil {
			fill = r.newSlice(addrType, g.ports)
			creates = append(creates, fill)
		}
		n := min(r.MaxEndpointsPerSlice-len(fill.Endpoints), len(rest))
		fill.Endpoints = append(fill.Endpoints, rest[:n]...)
		rest = rest[n:]
	}
	return creates, updates, deletes, added, removed
}

// sliceToFill returns the index of the unchanged slice that n more endpoints leave
// closest to full without going over max (the first of those in name order), -1 when
// none fits (getSliceToFill).
func sliceToFill(unchanged []*kube.EndpointSlice, n, max int) int {
	best, bestDiff := -1, max
	for i, s := range unchanged {
		if d := max - (n + len(s.Endpoints)); d >= 0 && d < bestDiff {
			best, bestDiff = i, d
			if d == 0 {
				break
			}
		}
	}
	return best
}

// sliceLabels returns the labels a slice of r's Service carries (setEndpointSliceLabels)
// and whether its labels other than the reserved ones differ from the Service's: only
// that makes a write (a wrong headless label alone does not, as upstream).
func (r *Reconciler) sliceLabels(s *kube.EndpointSlice) (map[string]string, bool) {
	labels := make(map[string]string, len(r.Service.Labels)+3)
	for k, v := range r.Service.Labels {
		if !reservedSliceLabel(k) {
			labels[k] = v
		}
	}
	changed := false
	if s != nil {
		n := 0
		for k, v := range s.Labels {
			if reservedSliceLabel(k) {
				continue
			}
			n++
			if w, ok := labels[k]; !ok || w != v {
				changed = true
			}
		}
		changed = changed || n != len(labels)
	}
	if r.Service.Headless() {
		labels[kube.LabelHeadless] = ""
	}
	labels[kube.LabelServiceName] = r.Service.Name
	labels[kube.LabelSliceManagedBy] = kube.SliceControllerName
	return labels, changed
}

func reservedSliceLabel(k string) bool {
	return k == kube.LabelServiceName || k == kube.LabelSliceManagedBy || k == kube.LabelHeadless
}

// newSlice is a slice to create for r's Service (newEndpointSlice): no name yet.
func (r *Reconciler) newSlice(addrType string, ports []kube.Port) *kube.EndpointSlice {
	labels, _ := r.sliceLabels(nil)
	return &kube.EndpointSlice{Namespace: r.Service.Namespace, Service: r.Service.Name, Labels: labels,
		AddressType: addrType, ServiceUID: r.Service.UID, Ports: ports}
}

// isPlaceholderOf reports whether s is the placeholder ph would be: the same
// namespace, labels, owner and address type, no ports and no endpoints (the library's
// placeholderSliceCompare).
func isPlaceholderOf(s, ph *kube.EndpointSlice) bool {
	return s.Namespace == ph.Namespace && maps.Equal(s.Labels, ph.Labels) && s.ServiceUID == ph.ServiceUID &&
		s.AddressType == ph.AddressType && len(s.Ports) == 0 && len(s.Endpoints) == 0
}

// unchangedSlices are the existing slices neither updated nor deleted.
func unchangedSlices(existing, updates, deletes []*kube.EndpointSlice) []*kube.EndpointSlice {
	changed := map[string]bool{}
	for _, s := range updates {
		changed[s.Name] = true
	}
	for _, s := range deletes {
		changed[s.Name] = true
	}
	var out []*kube.EndpointSlice
	for _, s := range existing {
		if !changed[s.Name] {
			out = append(out, s)
		}
	}
	return out
}

// recycle turns creates into updates of slices to delete of the same address type
// that the Service owns: the slice keeps its name instead of being deleted and created
// again (finalize). Kubernetes pairs them in list order; allocd pairs each create with
// the slice to delete that holds most of its endpoints, so that an endpoint stays in
// the slice of its name when its ports change (a write too large for one transaction
// then never shows it twice or nowhere between its parts).
func recycle(svc *kube.Service,
	creates, updates, deletes []*kube.EndpointSlice) (toCreate, toUpdate, toDelete []*kube.EndpointSlice) {
	var kept []*kube.EndpointSlice
	for _, c := range creates {
		i := bestRecycled(svc, c, deletes)
		if i < 0 {
			kept = append(kept, c)
			continue
		}
		del := deletes[i]
		// The write replaces the slice to delete: it is conditioned on its revision.
		c.Name, c.Revision, c.CreateRevision = del.Name, del.Revision, del.CreateRevision
		updates = append(updates, c)
		deletes = slices.Delete(deletes, i, i+1)
	}
	return kept, updates, deletes
}

// bestRecycled returns the index of the slice of deletes that c may take the name of
// (the same address type, owned by svc) and that holds most of c's endpoints (the first
// among equals); -1 when none may.
func bestRecycled(svc *kube.Service, c *kube.EndpointSlice, deletes []*kube.EndpointSlice) int {
	want := make(map[string]bool, len(c.Endpoints))
	for i := range c.Endpoints {
		want[endpointKey(&c.Endpoints[i])] = true
	}
	best, bestN := -1, -1
	for i, d := range deletes {
		if d.AddressType != c.AddressType || d.ServiceUID != svc.UID {
			continue
		}
		n := 0
		for j := range d.Endpoints {
			if want[endpointKey(&d.Endpoints[j])] {
				n++
			}
		}
		if n > bestN {
			best, bestN = i, n
		}
	}
	return best
}

// name gives every slice to create a name, the first candidate (SliceName) not taken among
// the Service's slices.
func (r *Reconciler) name(plan *Plan) {
	taken := maps.Clone(r.Taken)
	if taken == nil {
		taken = map[string]bool{}
	}
	for _, s := range r.Existing {
		taken[s.Name] = true
	}
	n := 0
	for _, s := range plan.Creates {
		for {
			name := SliceName(r.Service, n)
			n++
			if !taken[name] {
				s.Name, taken[name] = name, true
				break
			}
		}
	}
}

// nameAlphabet is the alphabet of generateName's suffixes (no vowels, no 0, 1, 3).
const nameAlphabet = "bcdfghjklmnpqrstvwxz2456789"

// SliceName is the n-th candidate name of a slice of svc: the Service's name, a dash and
// five characters of the alphabet Kubernetes' generateName uses, derived from the
// Service's uid and n, so that a sync names its slices the same every time.
func SliceName(svc *kube.Service, n int) string {
	h := fnv.New64a()
	h.Write([]byte(svc.UID))
	h.Write([]byte{0})
	h.Write([]byte(strconv.Itoa(n)))
	x := h.Sum64()
	var suffix [5]byte
	for i := range suffix {
		suffix[i] = nameAlphabet[x%uint64(len(nameAlphabet))]
		x /= uint64(len(nameAlphabet))
	}
	return svc.Name + "-" + string(suffix[:])
}

// stamp sets the trigger-time annotation of a slice to write (removes it when the
// trigger time is unknown), keeping its other annotations (addTriggerTimeAnnotation).
func (r *Reconciler) stamp(s *kube.EndpointSlice) {
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	if r.TriggerTime.IsZero() {
		delete(s.Annotations, kube.AnnotationTriggerTime)
		return
	}
	s.Annotations[kube.AnnotationTriggerTime] = r.TriggerTime.UTC().Format(time.RFC3339Nano)
}
