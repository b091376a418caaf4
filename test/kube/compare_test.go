package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// normEndpoints is an Endpoints object as the comparison sees it: what a reader of the
// object uses, without what differs between two clusters by nature (UIDs,
// resourceVersions, creation times) and without endpoints.kubernetes.io/last-change-trigger-time:
// its value derives from each cluster's own Service creation time, and whether
// kube-controller-manager sets it depends on the order of its syncs (its trigger-time
// tracker records a sync's inputs even when the sync writes nothing or fails, and the
// next write then carries no trigger time: seen in the first run of this test, on one
// Service of five). TestBridge checks that allocd's Endpoints carry one.
type normEndpoints struct {
	Labels      map[string]string
	Annotations map[string]string
	Subsets     []normSubset
}

type normSubset struct {
	Ports    []string
	Ready    []string
	NotReady []string
}

func normalizeEndpoints(ep *corev1.Endpoints) normEndpoints {
	n := normEndpoints{Labels: ep.Labels, Annotations: map[string]string{}}
	for k, v := range ep.Annotations {
		if k != corev1.EndpointsLastChangeTriggerTime {
			n.Annotations[k] = v
		}
	}
	for _, s := range ep.Subsets {
		var ns normSubset
		for _, p := range s.Ports {
			app := ""
			if p.AppProtocol != nil {
				app = *p.AppProtocol
			}
			ns.Ports = append(ns.Ports, fmt.Sprintf("%s/%d/%s/%s", p.Name, p.Port, p.Protocol, app))
		}
		for _, a := range s.Addresses {
			ns.Ready = append(ns.Ready, addrString(a))
		}
		for _, a := range s.NotReadyAddresses {
			ns.NotReady = append(ns.NotReady, addrString(a))
		}
		slices.Sort(ns.Ports)
		slices.Sort(ns.Ready)
		slices.Sort(ns.NotReady)
		n.Subsets = append(n.Subsets, ns)
	}
	sort.Slice(n.Subsets, func(i, j int) bool {
		return fmt.Sprint(n.Subsets[i]) < fmt.Sprint(n.Subsets[j])
	})
	return n
}

func addrString(a corev1.EndpointAddress) string {
	node := "<nil>"
	if a.NodeName != nil {
		node = *a.NodeName
	}
	ref := "<nil>"
	if r := a.TargetRef; r != nil {
		ref = fmt.Sprintf("%s/%s/%s", r.Kind, r.Namespace, r.Name)
	}
	return fmt.Sprintf("%s host=%q node=%s ref=%s", a.IP, a.Hostname, node, ref)
}

// listEndpoints returns the normalized Endpoints of namespace ns by name.
func listEndpoints(ctx context.Context, cs kubernetes.Interface, ns string) (map[string]normEndpoints, error) {
	list, err := cs.CoreV1().Endpoints(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]normEndpoints{}
	for i := range list.Items {
		out[list.Items[i].Name] = normalizeEndpoints(&list.Items[i])
	}
	return out, nil
}

// diffEndpoints describes how b differs from a ("" when equal).
func diffEndpoints(a, b map[string]normEndpoints) string {
	var out []string
	names := slices.Sorted(maps.Keys(a))
	for n := range b {
		if _, ok := a[n]; !ok {
			names = append(names, n)
		}
	}
	for _, n := range names {
		x, okx := a[n]
		y, oky := b[n]
		switch {
		case !okx:
			out = append(out, fmt.Sprintf("%s: only in allocd's cluster: %s", n, js(y)))
		case !oky:
			out = append(out, fmt.Sprintf("%s: only in the reference cluster: %s", n, js(x)))
		case js(x) != js(y):
			out = append(out, fmt.Sprintf("%s:\n  reference: %s\n  allocd:    %s", n, js(x), js(y)))
		}
	}
	return strings.Join(out, "\n")
}

func js(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// readyCounts is, per Endpoints name, the number of ready and not-ready addresses
// (summed over subsets, counting each address once per subset).
func readyCounts(m map[string]normEndpoints) map[string][2]int {
	out := map[string][2]int{}
	for n, e := range m {
		var c [2]int
		for _, s := range e.Subsets {
			c[0] += len(s.Ready)
			c[1] += len(s.NotReady)
		}
		out[n] = c
	}
	return out
}

// waitSameEndpoints waits until both clusters hold, in the test namespace, Endpoints
// whose address counts are want (per Service name; a name absent from want must have
// no Endpoints), and then requires them to be equal. It fails with the difference.
func waitSameEndpoints(t testing.TB, ref, alc kubernetes.Interface, want map[string][2]int, limit time.Duration) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(limit)
	var a, b map[string]normEndpoints
	var err error
	for {
		a, err = listEndpoints(ctx, ref, testNS)
		if err == nil {
			b, err = listEndpoints(ctx, alc, testNS)
		}
		if err == nil && countsAre(a, want) && countsAre(b, want) && diffEndpoints(a, b) == "" {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("listing Endpoints: %v", err)
	}
	t.Fatalf("Endpoints not the same within %v.\nwant counts %v\nreference counts %v\nallocd counts    %v\ndiff:\n%s",
		limit, want, readyCounts(a), readyCounts(b), diffEndpoints(a, b))
}

func countsAre(m map[string]normEndpoints, want map[string][2]int) bool {
	got := readyCounts(m)
	return maps.Equal(got, want)
}

// normSliceGroup is the EndpointSlices of one Service and address type as the
// comparison sees them: what kube-proxy and CoreDNS read, up to slice names and the
// order inside slices (endpoints are sorted); the trigger time is left out as for
// Endpoints. Slices counts how many slices hold them.
type normSliceGroup struct {
	Labels    map[string]string
	Owner     string
	Ports     []string
	Endpoints []string
	Slices    int `json:"-"`
}

// movedZones maps a Node that changed zone to its new zone. allocd re-syncs the
// Services of a Node's Pods when its zone changes; kube-controller-manager leaves their
// zones stale until something else syncs them (a documented deviation,
// docs/shims/endpointslices.md). listSlices of the reference (strict false) reads such
// an endpoint's zone as "(moved)" whatever it is; of allocd's cluster (strict true), only
// when it is the new zone.
type movedZones map[string]string

func listSlices(ctx context.Context, cs kubernetes.Interface, ns string) (map[string]*normSliceGroup, error) {
	return listSlicesMoved(ctx, cs, ns, nil, false)
}

func listSlicesMoved(ctx context.Context, cs kubernetes.Interface, ns string, moved movedZones, strict bool) (map[string]*normSliceGroup, error) {
	list, err := cs.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]*normSliceGroup{}
	for _, s := range list.Items {
		var ports []string
		for _, p := range s.Ports {
			ports = append(ports, fmt.Sprintf("%s/%d/%s/%s", deref(p.Name), deref(p.Port), deref(p.Protocol), deref(p.AppProtocol)))
		}
		slices.Sort(ports)
		key := s.Labels[discoveryv1.LabelServiceName] + " " + string(s.AddressType) + " " + strings.Join(ports, ",")
		g := out[key]
		if g == nil {
			g = &normSliceGroup{Labels: s.Labels, Ports: ports}
			for _, o := range s.OwnerReferences {
				g.Owner = fmt.Sprintf("%s/%s controller=%v block=%v", o.Kind, o.Name, deref(o.Controller), deref(o.BlockOwnerDeletion))
			}
			out[key] = g
		}
		g.Slices++
		for _, e := range s.Endpoints {
			ref := "<nil>"
			if r := e.TargetRef; r != nil {
				ref = r.Kind + "/" + r.Namespace + "/" + r.Name
			}
			zone := ptr(e.Zone)
			if z, ok := moved[deref(e.NodeName)]; ok && (!strict || zone == z) {
				zone = "(moved)"
			}
			g.Endpoints = append(g.Endpoints, fmt.Sprintf("%v ready=%v serving=%v terminating=%v host=%v node=%v zone=%v ref=%s hints=%s",
				e.Addresses, ptr(e.Conditions.Ready), ptr(e.Conditions.Serving), ptr(e.Conditions.Terminating),
				ptr(e.Hostname), ptr(e.NodeName), zone, ref, js(e.Hints)))
		}
	}
	for _, g := range out {
		slices.Sort(g.Endpoints)
	}
	return out, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func ptr[T any](p *T) string {
	if p == nil {
		return "<nil>"
	}
	return fmt.Sprint(*p)
}

// diffSlices describes how allocd's slices (b) differ from the reference's (a): a group
// (Service, address type, ports) missing on one side, different contents, or more
// slices than upstream uses.
func diffSlices(a, b map[string]*normSliceGroup) string {
	var out []string
	keys := slices.Sorted(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		x, y := a[k], b[k]
		switch {
		case x == nil:
			out = append(out, fmt.Sprintf("%s: only in allocd's cluster: %s", k, js(y)))
		case y == nil:
			out = append(out, fmt.Sprintf("%s: only in the reference cluster: %s", k, js(x)))
		case js(x) != js(y):
			out = append(out, fmt.Sprintf("%s:\n  reference: %s\n  allocd:    %s", k, js(x), js(y)))
		case y.Slices > x.Slices:
			out = append(out, fmt.Sprintf("%s: allocd uses %d slices, the reference %d", k, y.Slices, x.Slices))
		}
	}
	return strings.Join(out, "\n")
}

// waitSameSlices waits until the EndpointSlices of both clusters' test namespace agree
// (diffSlices) and hold, per Service, as many endpoints as want's Endpoints counts say
// for its IPv4 group, or fails with the difference.
func waitSameSlices(t testing.TB, ref, alc kubernetes.Interface, want map[string][2]int, moved movedZones, limit time.Duration) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(limit)
	var a, b map[string]*normSliceGroup
	var err error
	for {
		a, err = listSlicesMoved(ctx, ref, testNS, moved, false)
		if err == nil {
			b, err = listSlicesMoved(ctx, alc, testNS, moved, true)
		}
		if err == nil && sliceCountsAre(a, want) && diffSlices(a, b) == "" {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("listing EndpointSlices: %v", err)
	}
	t.Fatalf("EndpointSlices not the same within %v:\n%s", limit, diffSlices(a, b))
}

// sliceCountsAre: every Service of want has IPv4 slices holding its Endpoints' count
// of addresses (ready and not ready; the Endpoints' truncation at 1000 aside).
func sliceCountsAre(m map[string]*normSliceGroup, want map[string][2]int) bool {
	got := map[string]int{}
	for _, g := range m {
		if len(g.Endpoints) > 0 && strings.HasPrefix(g.Endpoints[0], "[10.") {
			got[g.Labels[discoveryv1.LabelServiceName]] += len(g.Endpoints)
		}
	}
	for name, c := range want {
		if n := c[0] + c[1]; n < 1000 && got[name] != n {
			return false
		}
	}
	return true
}
