package admit

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

var (
	v4     = corev1.IPv4Protocol
	v6     = corev1.IPv6Protocol
	single = corev1.IPFamilyPolicySingleStack
	prefer = corev1.IPFamilyPolicyPreferDualStack
	both   = corev1.IPFamilyPolicyRequireDualStack
)

// createCase is one Service created through the webhook on a dual-stack cluster
// (IPv4 primary). nodePorts says, per port, what its node port must be: 0 none, a
// positive number exactly that, a negative one any allocated, the ports with the
// same negative number sharing one and those with different ones not. hc likewise.
type createCase struct {
	name      string
	spec      spec
	families  []corev1.IPFamily // nil: the webhook writes no address
	ips       []string          // "" for an address of any value
	nodePorts []int32
	hc        int32
}

var createCases = []createCase{
	{name: "ClusterIP, policy left empty: single stack of the primary family",
		spec: spec{}, families: fams{v4}, ips: []string{""}, nodePorts: []int32{0}},
	{name: "ClusterIP SingleStack IPv6",
		spec: spec{policy: single, families: fams{v6}}, families: fams{v6},
		ips: []string{""}, nodePorts: []int32{0}},
	{name: "ClusterIP PreferDualStack",
		spec: spec{policy: prefer}, families: fams{v4, v6}, ips: []string{"", ""}, nodePorts: []int32{0}},
	{name: "ClusterIP RequireDualStack IPv6 first",
		spec: spec{policy: both, families: fams{v6, v4}}, families: fams{v6, v4},
		ips: []string{"", ""}, nodePorts: []int32{0}},
	{name: "ClusterIP RequireDualStack, families inferred from the second",
		spec: spec{policy: both, families: fams{v4}}, families: fams{v4, v6},
		ips: []string{"", ""}, nodePorts: []int32{0}},
	{name: "requested clusterIP",
		spec: spec{ips: []string{"10.96.0.5"}}, families: fams{v4}, ips: []string{"10.96.0.5"},
		nodePorts: []int32{0}},
	{name: "requested IPv6 clusterIP, family inferred",
		spec: spec{ips: []string{"fd00:10:96::5"}}, families: fams{v6}, ips: []string{"fd00:10:96::5"},
		nodePorts: []int32{0}},
	{name: "requested primary of a PreferDualStack: the secondary allocated",
		spec: spec{policy: prefer, ips: []string{"10.96.0.6"}}, families: fams{v4, v6},
		ips: []string{"10.96.0.6", ""}, nodePorts: []int32{0}},
	{name: "requested pair",
		spec: spec{policy: both, ips: []string{"fd00:10:96::7", "10.96.0.7"}}, families: fams{v6, v4},
		ips: []string{"fd00:10:96::7", "10.96.0.7"}, nodePorts: []int32{0}},
	{name: "NodePort, two port numbers",
		spec:     spec{typ: nodePortType, ports: svcPorts{tcp(80, 0), tcp(443, 0)}},
		families: fams{v4}, ips: []string{""}, nodePorts: []int32{-1, -2}},
	{name: "NodePort, one port number over TCP and UDP: one node port",
		spec:     spec{typ: nodePortType, ports: svcPorts{tcp(53, 0), udp(53, 0), tcp(80, 0)}},
		families: fams{v4}, ips: []string{""}, nodePorts: []int32{-1, -1, -2}},
	{name: "NodePort, the UDP port asks: the TCP port of its number shares it",
		spec: spec{typ: nodePortType, ports: svcPorts{tcp(53, 0), udp(53, 30053),
			tcp(80, 30080)}},
		families: fams{v4}, ips: []string{""}, nodePorts: []int32{30053, 30053, 30080}},
	{name: "NodePort, one number asking for two node ports",
		spec:     spec{typ: nodePortType, ports: svcPorts{tcp(53, 30054), udp(53, 30055)}},
		families: fams{v4}, ips: []string{""}, nodePorts: []int32{30054, 30055}},
	{name: "NodePort PreferDualStack",
		spec: spec{typ: nodePortType, policy: prefer}, families: fams{v4, v6},
		ips: []string{"", ""}, nodePorts: []int32{-1}},
	{name: "LoadBalancer",
		spec:     spec{typ: lbType, ports: svcPorts{tcp(80, 0), tcp(443, 0)}},
		families: fams{v4}, ips: []string{""}, nodePorts: []int32{-1, -2}},
	{name: "LoadBalancer without node ports",
		spec: spec{typ: lbType, noLBNodePorts: true}, families: fams{v4},
		ips: []string{""}, nodePorts: []int32{0}},
	{name: "LoadBalancer without node ports, one asked for",
		spec: spec{typ: lbType, noLBNodePorts: true,
			ports: svcPorts{tcp(80, 30090), tcp(443, 0), udp(80, 0)}},
		families: fams{v4}, ips: []string{""}, nodePorts: []int32{30090, 0, 0}},
	{name: "LoadBalancer externalTrafficPolicy Local: a health check node port",
		spec: spec{typ: lbType, local: true}, families: fams{v4},
		ips: []string{""}, nodePorts: []int32{-1}, hc: -2},
	{name: "LoadBalancer Local, health check node port asked for",
		spec: spec{typ: lbType, local: true, hc: 30500}, families: fams{v4},
		ips: []string{""}, nodePorts: []int32{-1}, hc: 30500},
	{name: "LoadBalancer Local without node ports: the health check node port all the same",
		spec:     spec{typ: lbType, local: true, noLBNodePorts: true},
		families: fams{v4}, ips: []string{""}, nodePorts: []int32{0}, hc: -1},
	{name: "generateName",
		spec: spec{generateName: "web-", typ: nodePortType}, families: fams{v4},
		ips: []string{""}, nodePorts: []int32{-1}},
}

// TestCreate sends each case's Service through the webhook against a real allocd: the
// patched object is one kube-apiserver accepts as given, carries the addresses and
// ports the case wants, and allocd holds exactly those under the admission's
// provisional owner, each once.
func TestCreate(t *testing.T) {
	f := newFixture(t, setup{})
	fs, _ := f.cluster.Families()
	var seen []string
	for _, tc := range createCases {
		t.Run(tc.name, func(t *testing.T) {
			f.t = t
			svc := tc.spec.object()
			if svc.Name != "" {
				svc.Name += "-" + itoa(f.uids)
			}
			r := f.admit(svc, nil, false)
			if r.err != nil || !r.resp.Allowed || r.result != ResultPatched {
				t.Fatalf("Admit(%s) = %+v, %q, %v; want a patch", tc.name, r.resp, r.result, r.err)
			}
			got := r.patched
			acceptable(t, fs, got)
			if !slices.Equal(got.Spec.IPFamilies, tc.families) {
				t.Errorf("ipFamilies = %v; want %v", got.Spec.IPFamilies, tc.families)
			}
			for i, want := range tc.ips {
				if want != "" && (i >= len(got.Spec.ClusterIPs) || got.Spec.ClusterIPs[i] != want) {
					t.Errorf("clusterIPs = %v; want %q at %d", got.Spec.ClusterIPs, want, i)
				}
			}
			checkPorts(t, got, tc.nodePorts, tc.hc)
			want := items(got)
			held := f.held(r.owner())
			slices.Sort(held)
			if !slices.Equal(held, want) {
				t.Errorf("allocd holds %v for %s; want %v", held, r.owner(), want)
			}
			for _, it := range want {
				if slices.Contains(seen, it) {
					t.Errorf("%s handed out twice", it)
				}
				seen = append(seen, it)
			}
			if svc.Name == "" && r.owner() != "" {
				if al := f.holderOwner(want[0]); al.GetName() != svc.GenerateName {
					t.Errorf("provisional owner of a generateName Service named %q; want %q",
						al.GetName(), svc.GenerateName)
				}
			}
		})
	}
}

// checkPorts checks the node ports of svc against want (see createCase) and its
// health check node port against hc.
func checkPorts(t *testing.T, svc *corev1.Service, want []int32, hc int32) {
	t.Helper()
	groups := map[int32]int32{}
	values := map[int32]int32{}
	check := func(what string, got, want int32) {
		switch {
		case want >= 0 && got != want:
			t.Errorf("%s = %d; want %d", what, got, want)
		case want < 0 && got == 0:
			t.Errorf("%s = 0; want one allocated", what)
		case want < 0:
			if g, ok := groups[want]; ok && g != got {
				t.Errorf("%s = %d; want %d, shared with the ports of its number", what, got, g)
			}
			if w, ok := values[got]; ok && w != want {
				t.Errorf("%s = %d, which another port has", what, got)
			}
			groups[want], values[got] = got, want
		}
	}
	for i, p := range svc.Spec.Ports {
		if i < len(want) {
			check("ports["+itoa(i)+"].nodePort", p.NodePort, want[i])
		}
	}
	check("healthCheckNodePort", svc.Spec.HealthCheckNodePort, hc)
}
