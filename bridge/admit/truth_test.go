package admit

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// clusterService is a Service kube-apiserver stored with ip, its IPAddress object, and
// node port (none when 0), which allocd has not adopted.
func clusterService(name, ip string, nodePort int32) []runtime.Object {
	s := spec{name: name, ips: []string{ip}, families: fams{v4}}
	if nodePort != 0 {
		s.typ, s.ports = nodePortType, svcPorts{tcp(80, nodePort)}
	}
	svc := stored(s.object(), "uid-"+name)
	return []runtime.Object{svc, ipAddress(ip, svc.Namespace, name)}
}

func ipAddress(ip, ns, name string) *networkingv1.IPAddress {
	return &networkingv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: ip},
		Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services",
			Namespace: ns, Name: name}}}
}

// TestClusterHeld: kube-apiserver allocated addresses and node ports by itself (the
// webhook bypassed under failurePolicy Ignore) that allocd has not adopted yet. allocd
// hands them out; the webhook moves each to the Service that uses it (or parks an
// address whose Service it has not seen, under that Service's name) and asks again,
// until allocd gives what the cluster does not use: no create is refused as "already
// allocated" for an address allocd gave, and allocd holds each moved item for its user.
func TestClusterHeld(t *testing.T) {
	var objs []runtime.Object
	for i, name := range []string{"a", "b", "c"} {
		objs = append(objs, clusterService(name, "10.96.0."+strconv.Itoa(2+i), int32(30000+i))...)
	}
	// 10.96.0.5's IPAddress names a Service the informer has not seen; 30003 and
	// 30004 are node ports of a Service without address.
	objs = append(objs, ipAddress("10.96.0.5", "ns", "ghost"))
	np := stored(spec{name: "d", typ: nodePortType, ips: []string{"10.96.0.200"}, families: fams{v4},
		ports: svcPorts{tcp(80, 30003), tcp(81, 30004)}}.object(), "uid-d")
	objs = append(objs, np)
	tiny := setup{ranges: "10.96.0.0/29", nodePorts: "30000-30007", cidrs: []string{"10.96.0.0/29"}}
	f := newFixture(t, tiny, objs...)
	r := f.admit(spec{name: "web", typ: nodePortType}.object(), nil, false)
	if r.err != nil || r.result != ResultPatched {
		t.Fatalf("Admit = %+v, %q, %v; want a patch", r.resp, r.result, r.err)
	}
	if ip, p := r.patched.Spec.ClusterIP, r.patched.Spec.Ports[0].NodePort; ip != "10.96.0.6" || p < 30005 {
		t.Fatalf("patched with %s and node port %d; want 10.96.0.6 and 30005-30007, the only ones the "+
			"cluster does not use", ip, p)
	}
	moved := 0
	for i, name := range []string{"a", "b", "c"} {
		for _, it := range []string{"10.96.0." + strconv.Itoa(2+i), strconv.Itoa(30000 + i)} {
			switch h := f.holderOwner(it); {
			case h == nil:
			case h.GetUid() == "uid-"+name:
				moved++
			default:
				t.Errorf("%s (Service %s's) held by %v; want free or uid-%s", it, name, h, name)
			}
		}
	}
	for _, it := range []string{"30003", "30004"} {
		switch h := f.holderOwner(it); {
		case h == nil:
		case h.GetUid() == "uid-d":
			moved++
		default:
			t.Errorf("%s (Service d's) held by %v; want free or uid-d", it, h)
		}
	}
	if h := f.holderOwner("10.96.0.5"); h != nil {
		moved++
		parked := strings.HasPrefix(h.GetUid(), r.owner()+"/parked/")
		if h.GetNamespace() != "ns" || h.GetName() != "ghost" || !parked {
			t.Errorf("10.96.0.5 held by %v; want parked for ns/ghost under %s/parked/", h, r.owner())
		}
	}
	if n := testutil.ToFloat64(f.w.m.disagreed); int(n) != moved {
		t.Errorf("allocd_webhook_cluster_held_total = %v; want %d (the items moved)", n, moved)
	}
	if held := f.held(r.owner()); !slices.Equal(held, items(r.patched)) {
		t.Errorf("the admission holds %v; want %v", held, items(r.patched))
	}
	t.Logf("%d items allocd handed out were the cluster's, moved to their holders", moved)
}

// TestClusterHeldRequested: an address the user asks for that the cluster uses is
// kube-apiserver's refusal, as without the webhook, and allocd's allocation of it moves
// to the Service that uses it.
func TestClusterHeldRequested(t *testing.T) {
	f := newFixture(t, setup{}, clusterService("a", "10.96.0.12", 0)...)
	r := f.admit(spec{name: "web", ips: []string{"10.96.0.12"}}.object(), nil, false)
	const why = "failed to allocate IP 10.96.0.12: provided IP is already allocated"
	if r.err != nil || r.result != ResultDenied || r.resp.Result.Code != 422 ||
		!strings.HasSuffix(r.resp.Result.Message, why) {
		t.Fatalf("Admit(an address the cluster uses) = %+v, %v; want kube-apiserver's refusal", r.resp, r.err)
	}
	if h := f.holder("10.96.0.12", 0); h != "uid-a" {
		t.Errorf("10.96.0.12 held by %q; want uid-a, the Service that uses it", h)
	}
}

// TestTakeBack: an update asks for a node port and an address that allocd still holds
// for the Service itself (an earlier update gave them up; the bridge has not released
// them yet): they move to the update's provisional owner, so that the bridge's release
// of the earlier state cannot free them, and the update goes through.
func TestTakeBack(t *testing.T) {
	f := newFixture(t, setup{})
	old := stored(spec{name: "np", typ: nodePortType, ips: []string{"10.96.0.30"}, families: fams{v4},
		ports: svcPorts{tcp(80, 30300)}}.object(), "uid-np")
	f.take("uid-np", []string{"10.96.0.30"}, []int32{30300, 30301})
	svc := old.DeepCopy()
	svc.Spec.Ports = append(svc.Spec.Ports, tcp(81, 30301))
	r := f.admit(svc, old, false)
	if r.err != nil || !r.resp.Allowed {
		t.Fatalf("Admit(update asking for a node port the Service holds) = %+v, %v; want allowed",
			r.resp, r.err)
	}
	if h := f.holder("", 30301); h != r.owner() {
		t.Errorf("30301 held by %q; want the update's provisional owner %s", h, r.owner())
	}
	if h := f.holder("", 30300); h != "uid-np" {
		t.Errorf("30300 held by %q; want uid-np (the update keeps it)", h)
	}
	extSpec := spec{name: "ext", typ: corev1.ServiceTypeExternalName, externalName: "example.com"}
	ext := stored(extSpec.object(), "uid-ext")
	f.take("uid-ext", []string{"10.96.0.31"}, nil)
	back := ext.DeepCopy()
	back.Spec.Type, back.Spec.ExternalName = corev1.ServiceTypeClusterIP, ""
	back.Spec.ClusterIP, back.Spec.ClusterIPs = "10.96.0.31", []string{"10.96.0.31"}
	back.Spec.Ports = svcPorts{tcp(80, 0)}
	r = f.admit(back, ext, false)
	if r.err != nil || !r.resp.Allowed {
		t.Fatalf("Admit(back from ExternalName to its old address) = %+v, %v; want allowed", r.resp, r.err)
	}
	if h := f.holder("10.96.0.31", 0); h != r.owner() {
		t.Errorf("10.96.0.31 held by %q; want %s", h, r.owner())
	}
}

// TestTakeBackMany: an update asks back more node ports than maxRounds that the
// Service itself still holds in allocd (an earlier update removed the ports; the bridge
// has not released them yet): all move to the update's provisional owner at once.
func TestTakeBackMany(t *testing.T) {
	f := newFixture(t, setup{})
	old := stored(spec{name: "many", typ: nodePortType, ips: []string{"10.96.0.32"}, families: fams{v4},
		ports: svcPorts{tcp(80, 30600)}}.object(), "uid-many")
	svc := old.DeepCopy()
	var back []int32
	for i := range int32(10) {
		back = append(back, 30601+i)
		svc.Spec.Ports = append(svc.Spec.Ports, tcp(81+i, 30601+i))
	}
	f.hold(old, []string{"10.96.0.32"}, append([]int32{30600}, back...))
	r := f.admit(svc, old, false)
	if r.err != nil || !r.resp.Allowed {
		t.Fatalf("Admit(update asking back 10 node ports the Service holds) = %+v, %v; want allowed",
			r.resp, r.err)
	}
	for _, p := range back {
		if h := f.holder("", p); h != r.owner() {
			t.Errorf("%d held by %q; want the update's provisional owner %s", p, h, r.owner())
		}
	}
}

// TestTransferNotHeld pins what the webhook relies on: allocd's Transfer of an item
// the from owner does not hold is ErrNotOwner and moves nothing.
func TestTransferNotHeld(t *testing.T) {
	f := newFixture(t, setup{})
	f.take("uid-x", []string{"10.96.0.40"}, nil)
	a := &admission{w: f.w, owner: &allocdv1.Owner{Namespace: "ns", Name: "web", Uid: "admission/z"}}
	holder := &allocdv1.Owner{Namespace: "other", Name: "y", Uid: "uid-y"}
	if err := a.giveAway(t.Context(), holder, "10.96.0.40", 0); err != nil {
		t.Errorf("giveAway(an item of another owner) = %v; want nil (nothing to move)", err)
	}
	if h := f.holder("10.96.0.40", 0); h != "uid-x" {
		t.Errorf("10.96.0.40 held by %q; want uid-x still", h)
	}
}

// TestReclaim: allocd still holds, under a Service's UID, what that Service no longer
// uses (the bridge has not seen the change yet): the Service was deleted and is
// created again with its pinned address and node ports (kubectl replace --force), or a
// pinned node port moved to another Service. kube-apiserver accepts those creates; the
// webhook reads the holder from the API server, finds it gone or no longer using the
// items, and moves them to the new admission (all of them at once, even more than
// maxRounds). A holder that still uses its item keeps it, and an owner that is no
// Service of the cluster (another consumer of allocd's ranges) keeps everything.
func TestReclaim(t *testing.T) {
	var pinned svcPorts
	for i := range int32(10) {
		pinned = append(pinned, tcp(80+i, 30400+i))
	}
	dns := stored(spec{name: "dns", typ: nodePortType, ips: []string{"10.96.0.10"}, families: fams{v4},
		ports: pinned}.object(), "uid-old")
	moved := stored(spec{name: "a", typ: nodePortType, ips: []string{"10.96.0.11"}, families: fams{v4},
		ports: svcPorts{tcp(80, 30501)}}.object(), "uid-a") // gave 30500 up
	keeps := stored(spec{name: "c", ips: []string{"10.96.0.12"}, families: fams{v4}}.object(), "uid-c")
	f := newFixture(t, setup{}, dns, moved, keeps)
	f.hold(dns, items(dns), nil)
	f.hold(moved, []string{"10.96.0.11"}, []int32{30500, 30501})
	f.hold(keeps, []string{"10.96.0.12"}, nil)
	f.take("uid-elsewhere", []string{"10.96.0.13"}, nil)
	ctx := t.Context()
	if err := f.kube.CoreV1().Services("ns").Delete(ctx, "dns", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deletion seen", func() bool { return f.cluster.service("ns", "dns") == nil })

	again := dns.DeepCopy()
	again.UID = ""
	r := f.admit(again, nil, false)
	if r.err != nil || !r.resp.Allowed {
		t.Fatalf("Admit(ns/dns created again with its pinned items) = %+v, %v; want allowed", r.resp, r.err)
	}
	if held, want := sorted(f.held(r.owner())), items(dns); !slices.Equal(held, want) {
		t.Errorf("the new admission holds %v; want %v, taken from the deleted Service", held, want)
	}
	r = f.admit(spec{name: "b", typ: nodePortType, ports: svcPorts{tcp(80, 30500)}}.object(), nil, false)
	if r.err != nil || !r.resp.Allowed || f.holder("", 30500) != r.owner() {
		t.Errorf("Admit(node port 30500, which ns/a gave up) = %+v, %v, held by %q; want allowed, held by %s",
			r.resp, r.err, f.holder("", 30500), r.owner())
	}
	if h := f.holder("", 30501); h != "uid-a" {
		t.Errorf("30501 held by %q; want uid-a, which uses it", h)
	}
	const taken = "failed to allocate IP %s: provided IP is already allocated"
	for _, ip := range []string{"10.96.0.12", "10.96.0.13"} {
		r = f.admit(spec{name: "d" + ip, ips: []string{ip}}.object(), nil, false)
		if r.err != nil || r.result != ResultDenied ||
			!strings.HasSuffix(r.resp.Result.Message, fmt.Sprintf(taken, ip)) {
			t.Errorf("Admit(%s, held by its user) = %+v, %v; want kube-apiserver's refusal", ip, r.resp, r.err)
		}
	}
}
