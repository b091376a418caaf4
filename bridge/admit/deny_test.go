package admit

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// leaveCase is a request the webhook lets through untouched, allocating nothing.
type leaveCase struct {
	name   string
	svc    *corev1.Service
	dryRun bool
}

func leaveCases() []leaveCase {
	kubernetes := spec{ns: metav1.NamespaceDefault, name: "kubernetes", ips: []string{"10.96.0.1"}}.object()
	headlessSvc := spec{ips: []string{corev1.ClusterIPNone}}.object()
	external := spec{typ: corev1.ServiceTypeExternalName, externalName: "example.com"}.object()
	mismatch := spec{ips: []string{"10.96.0.8"}}.object()
	mismatch.Spec.ClusterIP = "10.96.0.9"
	pluralOnly := spec{ips: []string{"10.96.0.8"}}.object()
	pluralOnly.Spec.ClusterIP = ""
	named := spec{typ: nodePortType}.object()
	named.Spec.Ports[0].TargetPort = intstr.FromString("http")
	return []leaveCase{
		{name: "default/kubernetes", svc: kubernetes},
		{name: "headless", svc: headlessSvc},
		{name: "ExternalName", svc: external},
		{name: "dry run", svc: spec{typ: nodePortType}.object(), dryRun: true},
		{name: "an address that does not parse", svc: spec{ips: []string{"10.96.0.300"}}.object()},
		{name: "clusterIP is not clusterIPs[0]", svc: mismatch},
		{name: "clusterIPs without clusterIP", svc: pluralOnly},
		{name: "two addresses of one family",
			svc: spec{policy: both, ips: []string{"10.96.0.8", "10.96.0.9"}}.object()},
		{name: "address of another family than ipFamilies[0]",
			svc: spec{families: fams{v6}, ips: []string{"10.96.0.8"}}.object()},
		{name: "SingleStack with two families", svc: spec{policy: single, families: fams{v4, v6}}.object()},
		{name: "an unknown policy", svc: spec{policy: "Sometimes"}.object()},
		{name: "a family twice", svc: spec{policy: both, families: fams{v4, v4}}.object()},
	}
}

// TestLeftAlone: what the webhook must not touch, and what kube-apiserver refuses
// before it allocates (for kube-apiserver to refuse in its own words), goes through
// with no patch and nothing allocated in allocd.
func TestLeftAlone(t *testing.T) {
	f := newFixture(t, setup{})
	for _, tc := range leaveCases() {
		t.Run(tc.name, func(t *testing.T) {
			f.t = t
			r := f.admit(tc.svc, nil, tc.dryRun)
			if r.err != nil || !r.resp.Allowed || len(r.resp.Patch) != 0 || r.result != ResultAllowed {
				t.Fatalf("Admit(%s) = %+v, %q, %v; want allowed unchanged", tc.name, r.resp, r.result, r.err)
			}
			if held := f.held(r.owner()); len(held) != 0 {
				t.Errorf("allocd holds %v for %s; want nothing", held, r.owner())
			}
		})
	}
}

// TestLeftAloneSingleStack: on a single-stack cluster, RequireDualStack and a family
// the cluster lacks are kube-apiserver's refusals (initIPFamilyFields, before any
// allocation): let through, nothing allocated; PreferDualStack gets one address.
func TestLeftAloneSingleStack(t *testing.T) {
	f := newFixture(t, setup{ranges: testCIDR4, cidrs: []string{testCIDR4}})
	for _, s := range []spec{{policy: both}, {families: fams{v6}},
		{ips: []string{"fd00:10:96::8"}}} {
		r := f.admit(s.object(), nil, false)
		if r.err != nil || !r.resp.Allowed || len(r.resp.Patch) != 0 {
			t.Errorf("Admit(%+v) on a single-stack cluster = %+v, %v; want allowed unchanged",
				s, r.resp, r.err)
		}
		if held := f.held(r.owner()); len(held) != 0 {
			t.Errorf("allocd holds %v for %s; want nothing", held, r.owner())
		}
	}
	r := f.admit(spec{policy: prefer}.object(), nil, false)
	if r.err != nil || len(r.patched.Spec.ClusterIPs) != 1 || len(r.patched.Spec.IPFamilies) != 1 {
		t.Errorf("PreferDualStack on a single-stack cluster: %v, clusterIPs %v, ipFamilies %v; "+
			"want one of each", r.err, r.patched.Spec.ClusterIPs, r.patched.Spec.IPFamilies)
	}
}

// denyCase is a create kube-apiserver refuses at allocation, with its code and message.
type denyCase struct {
	name string
	// taken are items another owner holds in allocd before the request.
	takenIPs   []string
	takenPorts []int32
	svc        *corev1.Service
	code       int32
	message    string
}

func denyCases() []denyCase {
	return []denyCase{
		{name: "requested address taken", takenIPs: []string{"10.96.0.10"},
			svc: spec{name: "web", ips: []string{"10.96.0.10"}}.object(), code: 422,
			message: `Service "web" is invalid: spec.clusterIPs: Invalid value: ["10.96.0.10"]: ` +
				`failed to allocate IP 10.96.0.10: provided IP is already allocated`},
		{name: "requested secondary taken", takenIPs: []string{"fd00:10:96::a"},
			svc:  spec{name: "web", policy: both, ips: []string{"10.96.0.11", "fd00:10:96::a"}}.object(),
			code: 422,
			message: `Service "web" is invalid: spec.clusterIPs: ` +
				`Invalid value: ["10.96.0.11","fd00:10:96::a"]: ` +
				`failed to allocate IP fd00:10:96::a: provided IP is already allocated`},
		{name: "requested address of no ServiceCIDR",
			svc: spec{name: "web", ips: []string{"10.200.0.5"}}.object(), code: 422,
			message: `Service "web" is invalid: spec.clusterIPs: Invalid value: ["10.200.0.5"]: ` +
				`failed to allocate IP 10.200.0.5: the provided network does not match the current range`},
		{name: "requested network address",
			svc: spec{name: "web", ips: []string{"10.96.0.0"}}.object(), code: 422,
			message: `Service "web" is invalid: spec.clusterIPs: Invalid value: ["10.96.0.0"]: ` +
				`failed to allocate IP 10.96.0.0: the provided IP (10.96.0.0) is not in the valid range. ` +
				`The range of valid IPs is 10.96.0.0/24`},
		{name: "requested node port taken", takenPorts: []int32{30100},
			svc: spec{name: "web", typ: nodePortType,
				ports: svcPorts{tcp(80, 0), tcp(81, 30100)}}.object(), code: 422,
			message: `Service "web" is invalid: spec.ports[1].nodePort: Invalid value: 30100: ` +
				`provided port is already allocated`},
		{name: "requested node port out of range",
			svc:  spec{name: "web", typ: nodePortType, ports: svcPorts{tcp(80, 40000)}}.object(),
			code: 422, message: `Service "web" is invalid: spec.ports[0].nodePort: Invalid value: 40000: ` +
				`provided port is not in the valid range. The range of valid ports is 30000-32767`},
		{name: "one node port asked for by two port numbers",
			svc: spec{name: "web", typ: nodePortType,
				ports: svcPorts{tcp(80, 30101), tcp(81, 30101)}}.object(), code: 422,
			message: `Service "web" is invalid: spec.ports[1].nodePort: Invalid value: 30101: ` +
				`provided port is already allocated`},
		{name: "requested address taken and one node port asked for twice: the address first",
			takenIPs: []string{"10.96.0.12"},
			svc: spec{name: "web", typ: nodePortType, ips: []string{"10.96.0.12"},
				ports: svcPorts{tcp(80, 30103), tcp(81, 30103)}}.object(), code: 422,
			message: `Service "web" is invalid: spec.clusterIPs: Invalid value: ["10.96.0.12"]: ` +
				`failed to allocate IP 10.96.0.12: provided IP is already allocated`},
		{name: "a taken node port before one asked for twice: the taken one first",
			takenPorts: []int32{30104},
			svc: spec{name: "web", typ: nodePortType,
				ports: svcPorts{tcp(80, 30104), tcp(81, 30105), tcp(82, 30105)}}.object(), code: 422,
			message: `Service "web" is invalid: spec.ports[0].nodePort: Invalid value: 30104: ` +
				`provided port is already allocated`},
		{name: "requested health check node port taken", takenPorts: []int32{30102},
			svc: spec{name: "web", typ: lbType, local: true, hc: 30102}.object(), code: 500,
			message: `Internal error occurred: failed to allocate requested HealthCheck NodePort 30102: ` +
				`provided port is already allocated`},
	}
}

// TestDenied: a requested address or port that is taken or outside the ranges is
// refused with kube-apiserver's own code and words, and the admission holds nothing
// afterwards (what it had allocated is released at once).
func TestDenied(t *testing.T) {
	f := newFixture(t, setup{})
	for i, tc := range denyCases() {
		t.Run(tc.name, func(t *testing.T) {
			f.t = t
			if len(tc.takenIPs)+len(tc.takenPorts) > 0 {
				f.take("holder-"+itoa(i), tc.takenIPs, tc.takenPorts)
			}
			r := f.admit(tc.svc, nil, false)
			if r.err != nil || r.resp.Allowed || r.result != ResultDenied {
				t.Fatalf("Admit(%s) = %+v, %q, %v; want denied", tc.name, r.resp, r.result, r.err)
			}
			if st := r.resp.Result; st.Code != tc.code || st.Message != tc.message {
				t.Errorf("refusal %d %q;\nwant %d %q", st.Code, st.Message, tc.code, tc.message)
			}
			if held := f.held(r.owner()); len(held) != 0 {
				t.Errorf("allocd holds %v for %s after the refusal; want nothing", held, r.owner())
			}
		})
	}
}

// TestFull: a range with nothing left is kube-apiserver's internal error.
func TestFull(t *testing.T) {
	f := newFixture(t, setup{ranges: "10.96.0.0/29", cidrs: []string{"10.96.0.0/29"}})
	for _, ip := range []string{"10.96.0.2", "10.96.0.3", "10.96.0.4", "10.96.0.5", "10.96.0.6"} {
		f.take("filler-"+ip, []string{ip}, nil)
	}
	r := f.admit(spec{name: "web"}.object(), nil, false)
	want := `Internal error occurred: failed to allocate a serviceIP for Service "web": range is full`
	if r.err != nil || r.resp.Allowed || r.resp.Result.Code != 500 || r.resp.Result.Message != want {
		t.Fatalf("Admit(range full) = %+v, %v; want denied %q", r.resp, r.err, want)
	}
}

// TestLastAddr pins lastAddr, the IPv4 broadcast address of a prefix.
func TestLastAddr(t *testing.T) {
	for in, want := range map[string]string{"10.96.0.0/24": "10.96.0.255", "10.96.0.0/29": "10.96.0.7",
		"10.0.0.0/12": "10.15.255.255", "fd00::/120": "fd00::ff"} {
		if got := lastAddr(netip.MustParsePrefix(in)); got.String() != want {
			t.Errorf("lastAddr(%s) = %s; want %s", in, got, want)
		}
	}
}

// TestFamiliesFromFlag: kube-apiserver defaults a Service's families from its
// --service-cluster-ip-range, not from the default ServiceCIDR object. During an
// upgrade from single to dual stack the object is dual-stack while kube-apiservers not
// yet restarted are single-stack (and refuse an IPv6 address): told kube-apiserver's
// flag, the webhook follows it, not the object.
func TestFamiliesFromFlag(t *testing.T) {
	f := newFixture(t, setup{}) // the object: dual-stack, IPv4 first
	fs, ok := FamiliesOf([]string{"10.96.0.0/24"})
	if !ok {
		t.Fatal("FamiliesOf(10.96.0.0/24) not ok")
	}
	f.cluster.SetFamilies(fs)
	r := f.admit(spec{name: "web", policy: prefer}.object(), nil, false)
	if r.err != nil || len(r.patched.Spec.ClusterIPs) != 1 || len(r.patched.Spec.IPFamilies) != 1 ||
		r.patched.Spec.IPFamilies[0] != v4 {
		t.Errorf("PreferDualStack with --service-cluster-ip-range single-stack: %v, clusterIPs %v, "+
			"ipFamilies %v; want one IPv4 address", r.err, r.patched.Spec.ClusterIPs, r.patched.Spec.IPFamilies)
	}
	r = f.admit(spec{name: "dual", policy: both}.object(), nil, false)
	if r.err != nil || len(r.resp.Patch) != 0 {
		t.Errorf("RequireDualStack with --service-cluster-ip-range single-stack = %+v, %v; want allowed "+
			"unchanged (kube-apiserver refuses it)", r.resp, r.err)
	}
}
