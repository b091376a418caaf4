package endpoints

import (
	"maps"
	"reflect"
	"slices"
	"testing"

	"github.com/allocd/allocd/endpoints/kube"
)

// TestServicesSelecting: the Services that select a Pod, found through the selector
// index, follow Service updates (a changed selector, a selector removed or emptied)
// and deletes.
func TestServicesSelecting(t *testing.T) {
	svc := func(name string, sel map[string]string) *kube.Service {
		return &kube.Service{Namespace: "ns", Name: name, Selector: sel}
	}
	pod := &kube.Pod{Namespace: "ns", Name: "p", Labels: map[string]string{"app": "a", "tier": "web"}}
	for _, tc := range []struct {
		name string
		put  []*kube.Service
		del  []string
		want []string
	}{
		{"one pair", []*kube.Service{svc("s", map[string]string{"app": "a"})}, nil, []string{"ns/s"}},
		{"two pairs", []*kube.Service{svc("s", map[string]string{"app": "a", "tier": "web"})}, nil,
			[]string{"ns/s"}},
		{"one pair of two wrong", []*kube.Service{svc("s", map[string]string{"app": "a", "tier": "db"})}, nil,
			nil},
		{"empty selector selects all", []*kube.Service{svc("s", map[string]string{})}, nil, []string{"ns/s"}},
		{"nil selector selects none", []*kube.Service{svc("s", nil)}, nil, nil},
		{"other namespace", []*kube.Service{{Namespace: "other", Name: "s",
			Selector: map[string]string{"app": "a"}}}, nil, nil},
		{"selector changed away", []*kube.Service{svc("s", map[string]string{"app": "a"}), svc("s",
			map[string]string{"app": "b"})}, nil, nil},
		{"selector changed to", []*kube.Service{svc("s", map[string]string{"app": "b"}), svc("s",
			map[string]string{"app": "a"})}, nil, []string{"ns/s"}},
		// Not a selector the feed takes (an empty key), but the Go API: it selects the
		// Pods labelled ""="", as the walk over every Service found.
		{"empty pair", []*kube.Service{svc("s", map[string]string{"": ""})}, nil, nil},
		{"empty then none", []*kube.Service{svc("s", map[string]string{}), svc("s", nil)}, nil, nil},
		{"deleted", []*kube.Service{svc("s", map[string]string{"app": "a"}), svc("t",
			map[string]string{"tier": "web"})},
			[]string{"s"}, []string{"ns/t"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := newInputs()
			for _, s := range tc.put {
				in.putService(s)
			}
			for _, name := range tc.del {
				in.deleteService("ns", name)
			}
			got := map[string]struct{}{}
			in.servicesSelecting(got, pod)
			if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, tc.want) {
				t.Errorf("servicesSelecting = %v; want %v", keys, tc.want)
			}
		})
	}
}

// TestPutPodShares: the inputs store a copy of each Pod, which shares its labels and
// containers with a stored Pod of equal ones, and only then; the caller's Pod is left
// as it was.
func TestPutPodShares(t *testing.T) {
	mk := func(name string, labels map[string]string, port int32) *kube.Pod {
		return &kube.Pod{Namespace: "ns", Name: name, Labels: labels, Phase: "Running",
			Containers: []kube.Container{{Name: "c",
				Ports: []kube.ContainerPort{{Name: "http", ContainerPort: port, Protocol: "TCP"}}}}}
	}
	in := newInputs()
	a := mk("a", map[string]string{"app": "x"}, 80)
	b := mk("b", map[string]string{"app": "x"}, 80)
	c := mk("c", map[string]string{"app": "x"}, 81)
	d := mk("d", map[string]string{"app": "x", "v": "2"}, 80)
	before := *b
	for _, p := range []*kube.Pod{a, b, c, d} {
		in.putPod(p)
	}
	sa, sb, sc, sd := in.pod("ns", "a"), in.pod("ns", "b"), in.pod("ns", "c"), in.pod("ns", "d")
	if sb == b || !reflect.DeepEqual(*sb, *b) || !reflect.DeepEqual(*b, before) {
		t.Fatalf("stored b = %p %+v, given %p %+v (before %+v); want an equal copy, the given one unchanged",
			sb, sb, b, b, before)
	}
	same := func(x,
		y any) bool {
		return reflect.ValueOf(x).UnsafePointer() == reflect.ValueOf(y).UnsafePointer()
	}
	for _, tc := range []struct {
		name string
		got  bool
		want bool
	}{
		{"a and b share labels", same(sa.Labels, sb.Labels), true},
		{"a and b share containers", same(sa.Containers, sb.Containers), true},
		{"a and c share labels", same(sa.Labels, sc.Labels), true},
		{"a and c do not share containers (other port)", same(sa.Containers, sc.Containers), false},
		{"a and d do not share labels", same(sa.Labels, sd.Labels), false},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %v; want %v", tc.name, tc.got, tc.want)
		}
	}
	if !reflect.DeepEqual(sc.Containers, c.Containers) || !maps.Equal(sd.Labels, d.Labels) {
		t.Errorf("stored c, d = %+v, %+v; want their own containers and labels", sc, sd)
	}
}
