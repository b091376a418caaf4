package endpoints

import (
	"maps"
	"slices"

	"github.com/allocd/allocd/endpoints/endpointslice"
	"github.com/allocd/allocd/endpoints/kube"
)

// inputs are the controller's view of the feeds in one term: the Services and Pods of
// the last snapshot of each kind with the events applied since, indexed for the two
// questions the controller asks: which Pods does a Service select, and which Services
// select a Pod. Objects are immutable once stored (an update replaces the pointer), so
// that a worker may use them after releasing the lock.
//
// Not safe for concurrent use: the term guards it with its mutex.
type inputs struct {
	svcRev, podRev, nodeRev       int64
	haveSvcs, havePods, haveNodes bool

	services map[string]*kube.Service // by "ns/name"
	// bySelector indexes the Services that have a selector by namespace and by each
	// key=value pair of it, under allPods when it is empty (it selects every Pod):
	// ns -> pair -> name -> Service.
	bySelector map[string]map[label]map[string]*kube.Service
	pods       map[string]map[string]*kube.Pod // ns -> name -> Pod
	// labels indexes the Pods of a namespace by each of their labels.
	labels map[string]map[label]map[string]struct{}

	nodes map[string]*kube.Node // by name
	// podsOnNode indexes the Pods by spec.nodeName.
	podsOnNode map[string]map[podRef]struct{}
	// topology is the zones' shares of the Nodes' CPU for topology hints; nil when
	// the Nodes say too little (see endpointslice.CPURatiosByZone).
	topology map[string]float64
}

// label is one key=value pair of a Pod's labels.
type label struct{ k, v string }

// allPods is where bySelector holds the Services whose selector is empty (no label
// has an empty key).
var allPods = label{}

// podRef names a Pod (its strings shared with the stored Pod).
type podRef struct{ namespace, name string }

func newInputs() *inputs {
	return &inputs{
		services:   map[string]*kube.Service{},
		bySelector: map[string]map[label]map[string]*kube.Service{},
		pods:       map[string]map[string]*kube.Pod{},
		labels:     map[string]map[label]map[string]struct{}{},
		nodes:      map[string]*kube.Node{},
		podsOnNode: map[string]map[podRef]struct{}{},
	}
}

// have reports whether every kind has a snapshot.
func (in *inputs) have(kinds ...Kind) bool {
	for _, k := range kinds {
		if _, ok := in.revision(k); !ok {
			return false
		}
	}
	return true
}

// revision returns the revision applied for kind and whether a snapshot of it is in.
func (in *inputs) revision(k Kind) (int64, bool) {
	switch k {
	case KindService:
		return in.svcRev, in.haveSvcs
	case KindPod:
		return in.podRev, in.havePods
	}
	return in.nodeRev, in.haveNodes
}

// setServices replaces every Service.
func (in *inputs) setServices(rev int64, svcs []*kube.Service) {
	in.services = make(map[string]*kube.Service, len(svcs))
	in.bySelector = map[string]map[label]map[string]*kube.Service{}
	for _, s := range svcs {
		in.putService(s)
	}
	in.svcRev, in.haveSvcs = rev, true
}

// putService stores s, replacing the Service of the same name.
func (in *inputs) putService(s *kube.Service) {
	key := s.Key()
	if old := in.services[key]; old != nil {
		in.unindexService(old)
	}
	in.services[key] = s
	if s.Selector == nil {
		return
	}
	idx := in.bySelector[s.Namespace]
	if idx == nil {
		idx = map[label]map[string]*kube.Service{}
		in.bySelector[s.Namespace] = idx
	}
	add := func(l label) {
		set := idx[l]
		if set == nil {
			set = map[string]*kube.Service{}
			idx[l] = set
		}
		set[s.Name] = s
	}
	if len(s.Selector) == 0 {
		add(allPods)
	}
	for k, v := range s.Selector {
		add(label{k, v})
	}
}

// unindexService removes s from bySelector.
func (in *inputs) unindexService(s *kube.Service) {
	idx := in.bySelector[s.Namespace]
	drop := func(l label) {
		if set := idx[l]; set != nil {
			delete(set, s.Name)
			if len(set) == 0 {
				delete(idx, l)
			}
		}
	}
	drop(allPods)
	for k, v := range s.Selector {
		drop(label{k, v})
	}
	if len(idx) == 0 {
		delete(in.bySelector, s.Namespace)
	}
}

// deleteService removes a Service and returns it (nil when it was not there).
func (in *inputs) deleteService(namespace, name string) *kube.Service {
	key := namespace + "/" + name
	s := in.services[key]
	if s == nil {
		return nil
	}
	delete(in.services, key)
	in.unindexService(s)
	return s
}

// setPods replaces every Pod.
func (in *inputs) setPods(rev int64, pods []*kube.Pod) {
	in.pods = map[string]map[string]*kube.Pod{}
	in.labels = map[string]map[label]map[string]struct{}{}
	in.podsOnNode = map[string]map[podRef]struct{}{}
	for _, p := range pods {
		in.putPod(p)
	}
	in.podRev, in.havePods = rev, true
}

// putPod stores a copy of p (see share), replacing (and unindexing) the Pod of the same
// name.
func (in *inputs) putPod(p *kube.Pod) {
	ns := in.pods[p.Namespace]
	if ns == nil {
		ns = map[string]*kube.Pod{}
		in.pods[p.Namespace] = ns
	}
	if old := ns[p.Name]; old != nil {
		in.unindex(old)
	}
	p = in.share(p)
	ns[p.Name] = p
	if p.NodeName != "" {
		on := in.podsOnNode[p.NodeName]
		if on == nil {
			on = map[podRef]struct{}{}
			in.podsOnNode[p.NodeName] = on
		}
		on[podRef{p.Namespace, p.Name}] = struct{}{}
	}
	idx := in.labels[p.Namespace]
	if idx == nil {
		idx = map[label]map[string]struct{}{}
		in.labels[p.Namespace] = idx
	}
	for k, v := range p.Labels {
		set := idx[label{k, v}]
		if set == nil {
			set = map[string]struct{}{}
			idx[label{k, v}] = set
		}
		set[p.Name] = struct{}{}
	}
}

// deletePod removes a Pod and returns it (nil when it was not there).
func (in *inputs) deletePod(namespace, name string) *kube.Pod {
	ns := in.pods[namespace]
	p := ns[name]
	if p == nil {
		return nil
	}
	in.unindex(p)
	delete(ns, name)
	if len(ns) == 0 {
		delete(in.pods, namespace)
		delete(in.labels, namespace)
	}
	return p
}

func (in *inputs) unindex(p *kube.Pod) {
	if on := in.podsOnNode[p.NodeName]; on != nil {
		delete(on, podRef{p.Namespace, p.Name})
		if len(on) == 0 {
			delete(in.podsOnNode, p.NodeName)
		}
	}
	idx := in.labels[p.Namespace]
	for k, v := range p.Labels {
		if set := idx[label{k, v}]; set != nil {
			delete(set, p.Name)
			if len(set) == 0 {
				delete(idx, label{k, v})
			}
		}
	}
}

// share returns the copy of p that the inputs store: its labels and containers are
// those of a stored Pod of its namespace that has equal ones (a Pod of the same
// template), when the label index finds one among a few candidates; its namespace
// that Pod's, its node name the Node's, its phase the constant's. The Pods of one
// template then hold one label map and one container list, not one each: most of
// what 100,000 Pods would otherwise cost. Shared parts are never written to: a Pod is
// replaced whole.
func (in *inputs) share(p *kube.Pod) *kube.Pod {
	cp := *p
	cp.Phase = canonicalPhase(p.Phase)
	if n := in.nodes[p.NodeName]; n != nil {
		cp.NodeName = n.Name
	}
	q := in.sameLabels(p)
	if q == nil {
		return &cp
	}
	cp.Namespace, cp.Labels = q.Namespace, q.Labels
	if containersEqual(q.Containers, p.Containers) {
		cp.Containers = q.Containers
	}
	if containersEqual(q.InitContainers, p.InitContainers) {
		cp.InitContainers = q.InitContainers
	}
	return &cp
}

// sameLabels returns a stored Pod of p's namespace with p's labels: one of the first
// few of the label index's shortest list among p's labels; nil when none (or p has no
// labels).
func (in *inputs) sameLabels(p *kube.Pod) *kube.Pod {
	idx := in.labels[p.Namespace]
	var shortest map[string]struct{}
	for k, v := range p.Labels {
		set := idx[label{k, v}]
		if len(set) == 0 {
			return nil
		}
		if shortest == nil || len(set) < len(shortest) {
			shortest = set
		}
	}
	const tries = 4
	n := 0
	for name := range shortest {
		if q := in.pods[p.Namespace][name]; q != nil && maps.Equal(q.Labels, p.Labels) {
			return q
		}
		if n++; n == tries {
			break
		}
	}
	return nil
}

// canonicalPhase is the constant of a phase, so that stored Pods share it.
func canonicalPhase(s string) string {
	for _, c := range []string{kube.PhaseRunning, kube.PhasePending, kube.PhaseSucceeded, kube.PhaseFailed,
		kube.PhaseUnknown} {
		if s == c {
			return c
		}
	}
	return s
}

// containersEqual reports whether two container lists are the same.
func containersEqual(a, b []kube.Container) bool {
	return slices.EqualFunc(a, b, func(x, y kube.Container) bool {
		return x.Name == y.Name && x.RestartPolicy == y.RestartPolicy && slices.Equal(x.Ports, y.Ports)
	})
}

// pod returns the Pod of that name, nil when none.
func (in *inputs) pod(namespace, name string) *kube.Pod { return in.pods[namespace][name] }

// selectPods returns the Pods of namespace that selector selects: none for a nil
// selector, every Pod of the namespace for an empty one. It walks the shortest list of
// the label index among the selector's pairs.
func (in *inputs) selectPods(namespace string, selector map[string]string) []*kube.Pod {
	if selector == nil {
		return nil
	}
	ns := in.pods[namespace]
	if len(selector) == 0 {
		out := make([]*kube.Pod, 0, len(ns))
		for _, p := range ns {
			out = append(out, p)
		}
		return out
	}
	idx := in.labels[namespace]
	var shortest map[string]struct{}
	for k, v := range selector {
		set := idx[label{k, v}]
		if len(set) == 0 {
			return nil
		}
		if shortest == nil || len(set) < len(shortest) {
			shortest = set
		}
	}
	out := make([]*kube.Pod, 0, len(shortest))
	for name := range shortest {
		if p := ns[name]; p != nil && selects(selector, p.Labels) {
			out = append(out, p)
		}
	}
	return out
}

// servicesSelecting appends to dst the keys of the Services of p's namespace whose
// selector selects p (a nil selector selects nothing), as kube-controller-manager's
// GetPodServiceMemberships; it looks only at the Services whose selector has one of p's
// labels (or is empty).
func (in *inputs) servicesSelecting(dst map[string]struct{}, p *kube.Pod) {
	idx := in.bySelector[p.Namespace]
	if len(idx) == 0 {
		return
	}
	for _, s := range idx[allPods] {
		if selects(s.Selector, p.Labels) { // all of them, but for a selector ""="" (the Go API's)
			dst[s.Key()] = struct{}{}
		}
	}
	for k, v := range p.Labels {
		for _, s := range idx[label{k, v}] {
			if selects(s.Selector, p.Labels) {
				dst[s.Key()] = struct{}{}
			}
		}
	}
}

// podUpdateKeys returns the keys of the Services to sync after old became cur, as
// kube-controller-manager's GetServicesToUpdateOnPodChange: nothing when the
// resourceVersion is unchanged (a resync) or nothing the Endpoints depend on changed;
// the Services of cur's labels; and when the labels changed, those of old's too, all of
// them when the Pod also changed, else only the Services in one set but not the other.
func (in *inputs) podUpdateKeys(old, cur *kube.Pod) map[string]struct{} {
	if old.ResourceVersion != "" && old.ResourceVersion == cur.ResourceVersion {
		return nil
	}
	podChanged, labelsChanged := podChange(old, cur)
	if !podChanged && !labelsChanged {
		return nil
	}
	keys := map[string]struct{}{}
	in.servicesSelecting(keys, cur)
	if !labelsChanged {
		return keys
	}
	oldKeys := map[string]struct{}{}
	in.servicesSelecting(oldKeys, old)
	if podChanged {
		for k := range oldKeys {
			keys[k] = struct{}{}
		}
		return keys
	}
	for k := range oldKeys {
		if _, both := keys[k]; both {
			delete(keys, k)
		} else {
			keys[k] = struct{}{}
		}
	}
	return keys
}

// setNodes replaces every Node.
func (in *inputs) setNodes(rev int64, nodes []*kube.Node) {
	in.nodes = make(map[string]*kube.Node, len(nodes))
	for _, n := range nodes {
		in.nodes[n.Name] = n
	}
	in.topology = endpointslice.CPURatiosByZone(in.nodes)
	in.nodeRev, in.haveNodes = rev, true
}

// putNode stores n, replacing the Node of the same name.
func (in *inputs) putNode(n *kube.Node) {
	in.nodes[n.Name] = n
	in.topology = endpointslice.CPURatiosByZone(in.nodes)
}

// deleteNode removes a Node.
func (in *inputs) deleteNode(name string) {
	delete(in.nodes, name)
	in.topology = endpointslice.CPURatiosByZone(in.nodes)
}

// node returns the Node of that name; ok is false when there is none (a Pod without a
// node name has none).
func (in *inputs) node(name string) (*kube.Node, bool) {
	n, ok := in.nodes[name]
	return n, ok
}

// servicesOfNode adds to dst the keys of the Services that select a Pod on the Node.
func (in *inputs) servicesOfNode(dst map[string]struct{}, node string) {
	for ref := range in.podsOnNode[node] {
		if p := in.pods[ref.namespace][ref.name]; p != nil {
			in.servicesSelecting(dst, p)
		}
	}
}

// servicesWithHints adds to dst the keys of the Services that ask for topology hints.
func (in *inputs) servicesWithHints(dst map[string]struct{}) {
	for key, s := range in.services {
		if s.Selector != nil && endpointslice.HintsEnabled(s.Annotations) {
			dst[key] = struct{}{}
		}
	}
}

// topologyEqual reports whether two topologies are the same.
func topologyEqual(a, b map[string]float64) bool { return maps.Equal(a, b) }
