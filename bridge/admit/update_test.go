package admit

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// updateCase is an update of a stored Service (old) to svc: the webhook allocates only
// what the change newly needs.
type updateCase struct {
	name     string
	old, svc *corev1.Service
	families []corev1.IPFamily // the ipFamilies the patched object has
	// newIPs is how many addresses the update allocates; nodePorts and hc as in
	// createCase, of the patched object.
	newIPs    int
	nodePorts []int32
	hc        int32
}

func updateCases() []updateCase {
	var cases []updateCase
	add := func(c updateCase) { cases = append(cases, c) }

	extSpec := spec{name: "ext", typ: corev1.ServiceTypeExternalName, externalName: "example.com"}
	ext := stored(extSpec.object(), "u1")
	ext.Spec.IPFamilyPolicy = nil
	toIP := ext.DeepCopy()
	toIP.Spec.Type, toIP.Spec.ExternalName = corev1.ServiceTypeClusterIP, ""
	toIP.Spec.Ports = spec{}.object().Spec.Ports
	add(updateCase{name: "ExternalName to ClusterIP", old: ext, svc: toIP, families: fams{v4},
		newIPs: 1, nodePorts: []int32{0}})

	cip := stored(spec{name: "cip", ips: []string{"10.96.0.20"}, families: fams{v4},
		ports: svcPorts{tcp(80, 0), tcp(443, 0)}}.object(), "u2")
	toNP := cip.DeepCopy()
	toNP.Spec.Type = nodePortType
	toNP.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	add(updateCase{name: "ClusterIP to NodePort", old: cip, svc: toNP, families: fams{v4},
		nodePorts: []int32{-1, -2}})

	toDual := cip.DeepCopy()
	toDual.Spec.IPFamilyPolicy = &both
	add(updateCase{name: "SingleStack to RequireDualStack", old: cip, svc: toDual,
		families: fams{v4, v6}, newIPs: 1, nodePorts: []int32{0, 0}})

	np := stored(spec{name: "np", typ: nodePortType, ips: []string{"10.96.0.21"},
		families: fams{v4}, ports: svcPorts{tcp(80, 30200)}}.object(), "u3")
	morePorts := np.DeepCopy()
	morePorts.Spec.Ports = append(morePorts.Spec.Ports, tcp(443, 0))
	add(updateCase{name: "a port added", old: np, svc: morePorts, families: fams{v4},
		nodePorts: []int32{30200, -1}})
	put := morePorts.DeepCopy()
	put.Spec.Ports[0].NodePort = 0 // a PUT that leaves out what was allocated: kept by port name
	put.Spec.ClusterIP, put.Spec.ClusterIPs = "", nil
	add(updateCase{name: "a port added by a PUT that leaves out the allocated values", old: np, svc: put,
		nodePorts: []int32{0, -1}})

	lb := stored(spec{name: "lb", typ: lbType, ips: []string{"10.96.0.22"},
		families: fams{v4}, ports: svcPorts{tcp(80, 30201)}}.object(), "u4")
	local := lb.DeepCopy()
	local.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	add(updateCase{name: "externalTrafficPolicy to Local", old: lb, svc: local, families: fams{v4},
		nodePorts: []int32{30201}, hc: -1})
	return cases
}

// TestUpdate: an update allocates only what its change newly needs, under its
// provisional owner, and the patched object is one kube-apiserver accepts.
func TestUpdate(t *testing.T) {
	f := newFixture(t, setup{})
	fs, _ := f.cluster.Families()
	for _, tc := range updateCases() {
		t.Run(tc.name, func(t *testing.T) {
			f.t = t
			r := f.admit(tc.svc, tc.old, false)
			if r.err != nil || !r.resp.Allowed || r.result != ResultPatched {
				t.Fatalf("Admit(%s) = %+v, %q, %v; want a patch", tc.name, r.resp, r.result, r.err)
			}
			got := r.patched
			if tc.families != nil {
				acceptable(t, fs, got)
				if !slices.Equal(got.Spec.IPFamilies, tc.families) {
					t.Errorf("ipFamilies = %v; want %v", got.Spec.IPFamilies, tc.families)
				}
			}
			checkPorts(t, got, tc.nodePorts, tc.hc)
			var want []string
			for _, it := range items(got) {
				if !slices.Contains(items(tc.old), it) {
					want = append(want, it)
				}
			}
			held := f.held(r.owner())
			slices.Sort(held)
			if !slices.Equal(held, want) {
				t.Errorf("allocd holds %v for %s; want what the update added, %v", held, r.owner(), want)
			}
			more := len(got.Spec.ClusterIPs) - len(tc.old.Spec.ClusterIPs)
			if tc.newIPs > 0 && more != tc.newIPs {
				t.Errorf("clusterIPs %v after %v; want %d more", got.Spec.ClusterIPs, tc.old.Spec.ClusterIPs,
					tc.newIPs)
			}
		})
	}
}

// TestUpdateNothingNew: updates that need nothing new (or give something up) go
// through unchanged: nothing is allocated, and nothing released at admission.
func TestUpdateNothingNew(t *testing.T) {
	f := newFixture(t, setup{})
	np := stored(spec{name: "np", typ: nodePortType, ips: []string{"10.96.0.23"},
		families: fams{v4}, ports: svcPorts{tcp(80, 30202)}}.object(), "u5")
	f.take(string(np.UID), []string{"10.96.0.23"}, []int32{30202})
	label := np.DeepCopy()
	label.Labels = map[string]string{"tier": "web"}
	toCIP := np.DeepCopy()
	toCIP.Spec.Type, toCIP.Spec.Ports[0].NodePort = corev1.ServiceTypeClusterIP, 0
	toCIP.Spec.ExternalTrafficPolicy = ""
	toExt := np.DeepCopy()
	toExt.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"}
	put := np.DeepCopy()
	put.Spec.ClusterIP, put.Spec.ClusterIPs, put.Spec.Ports[0].NodePort = "", nil, 0
	pds := stored(spec{name: "pr", policy: prefer, ips: []string{"10.96.0.24"},
		families: fams{v4}}.object(), "u6")
	for name, svc := range map[string]*corev1.Service{"a label": label, "NodePort to ClusterIP": toCIP,
		"to ExternalName": toExt, "a PUT leaving out what was allocated": put} {
		r := f.admit(svc, np, false)
		if r.err != nil || !r.resp.Allowed || len(r.resp.Patch) != 0 {
			t.Errorf("Admit(update: %s) = %+v, %v; want allowed unchanged", name, r.resp, r.err)
		}
		if held := f.held(r.owner()); len(held) != 0 {
			t.Errorf("update %s: allocd holds %v for %s; want nothing", name, held, r.owner())
		}
	}
	// A PreferDualStack Service stays single on a dual-stack cluster while nothing changes.
	r := f.admit(pds.DeepCopy(), pds, false)
	if r.err != nil || len(r.resp.Patch) != 0 {
		t.Errorf("Admit(PreferDualStack unchanged) = %+v, %v; want allowed unchanged", r.resp, r.err)
	}
	if got := f.held(string(np.UID)); len(got) != 2 {
		t.Errorf("the Service's own allocations %v; want both kept (release is the bridge's)", got)
	}
}

// TestReinvocation: kube-apiserver calls the webhook again (a new request uid) when
// another webhook changed the object after it: what the earlier call wrote is found held
// for the same Service and moved over to the later call's provisional owner (its grace
// starts again), nothing allocated anew; only what the change added (a port) is.
func TestReinvocation(t *testing.T) {
	f := newFixture(t, setup{})
	first := f.admit(spec{name: "web", typ: nodePortType}.object(), nil, false)
	if first.err != nil || first.result != ResultPatched {
		t.Fatalf("Admit = %+v, %v; want a patch", first.resp, first.err)
	}
	again := f.admit(first.patched, nil, false)
	if again.err != nil || !again.resp.Allowed || len(again.resp.Patch) != 0 {
		t.Errorf("reinvocation with nothing changed = %+v, %v; want allowed unchanged", again.resp, again.err)
	}
	if held, want := f.held(again.owner()), items(first.patched); !slices.Equal(sorted(held), want) {
		t.Errorf("reinvocation holds %v; want %v, moved over from the first invocation", held, want)
	}
	if held := f.held(first.owner()); len(held) != 0 {
		t.Errorf("first invocation holds %v; want nothing (moved over)", held)
	}
	changed := first.patched.DeepCopy()
	changed.Spec.Ports = append(changed.Spec.Ports, tcp(8080, 0))
	third := f.admit(changed, nil, false)
	if third.err != nil || third.result != ResultPatched || third.patched.Spec.Ports[1].NodePort == 0 {
		t.Fatalf("reinvocation after a port was added = %+v, %v; want the new port's node port",
			third.resp, third.err)
	}
	if held, want := f.held(third.owner()), items(third.patched); !slices.Equal(sorted(held), want) {
		t.Errorf("reinvocation holds %v; want %v: the earlier items and the new port's", held, want)
	}
	if held := f.held(again.owner()); len(held) != 0 {
		t.Errorf("second invocation holds %v; want nothing (moved over)", held)
	}
}

// TestReinvocationManyItems: a reinvocation of a Service of many items (a ClusterIP and
// 11 node ports, more than maxRounds) takes them all over from the earlier invocation
// at once, rather than one refusal of allocd per item.
func TestReinvocationManyItems(t *testing.T) {
	f := newFixture(t, setup{})
	var ports svcPorts
	for i := range int32(11) {
		ports = append(ports, tcp(80+i, 0))
	}
	first := f.admit(spec{name: "web", typ: nodePortType, ports: ports}.object(), nil, false)
	if first.err != nil || first.result != ResultPatched {
		t.Fatalf("Admit = %+v, %v; want a patch", first.resp, first.err)
	}
	again := f.admit(first.patched, nil, false)
	if again.err != nil || !again.resp.Allowed || len(again.resp.Patch) != 0 {
		t.Fatalf("reinvocation = %+v, %q, %v; want allowed unchanged", again.resp, again.result, again.err)
	}
	if held, want := f.held(again.owner()), items(first.patched); !slices.Equal(sorted(held), want) {
		t.Errorf("reinvocation holds %v; want %v", held, want)
	}
}

// TestRetryRestamps: a create retried after a refusal that came after admission (a
// quota) names the address the earlier admission of the same name still holds: the
// address moves to the retry's provisional owner, with a new allocate_time, so that the
// bridge's sweeper does not free it (the earlier owner's grace) while the retried
// create can still be stored with it.
func TestRetryRestamps(t *testing.T) {
	f := newFixture(t, setup{})
	first := f.admit(spec{name: "web", ips: []string{"10.96.0.30"}}.object(), nil, false)
	if first.err != nil || !first.resp.Allowed {
		t.Fatalf("Admit = %+v, %v; want allowed", first.resp, first.err)
	}
	before := f.allocation("10.96.0.30")
	retry := f.admit(spec{name: "web", ips: []string{"10.96.0.30"}}.object(), nil, false)
	if retry.err != nil || !retry.resp.Allowed {
		t.Fatalf("Admit(retry) = %+v, %v; want allowed", retry.resp, retry.err)
	}
	after := f.allocation("10.96.0.30")
	if after.GetOwner().GetUid() != retry.owner() ||
		!after.GetAllocateTime().AsTime().After(before.GetAllocateTime().AsTime()) {
		t.Errorf("10.96.0.30 after the retry: %v; want held by %s, allocated after %v", after, retry.owner(),
			before.GetAllocateTime().AsTime())
	}
}

func sorted(s []string) []string {
	slices.Sort(s)
	return s
}
