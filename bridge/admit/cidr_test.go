package admit

import (
	"errors"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// serviceCIDR is a ServiceCIDR of the cluster; deleting sets its deletionTimestamp (and
// its finalizer, which keeps it while addresses lie in it).
func serviceCIDR(name, cidr string, deleting bool) *networkingv1.ServiceCIDR {
	sc := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{cidr}}}
	if deleting {
		now := metav1.Now()
		sc.DeletionTimestamp = &now
		sc.Finalizers = []string{"networking.k8s.io/service-cidr-finalizer"}
	}
	return sc
}

func condition(status metav1.ConditionStatus) []metav1.Condition {
	return []metav1.Condition{{Type: networkingv1.ServiceCIDRConditionReady, Status: status}}
}

// TestServiceCIDRReady pins kube-apiserver's rule of which ServiceCIDRs it allocates
// from (cidrallocator.go, isReady and syncAllocators).
func TestServiceCIDRReady(t *testing.T) {
	ready := serviceCIDR("a", "10.97.0.0/28", false)
	notReady := ready.DeepCopy()
	notReady.Status.Conditions = condition(metav1.ConditionFalse)
	readySet := ready.DeepCopy()
	readySet.Status.Conditions = condition(metav1.ConditionTrue)
	deleting := serviceCIDR("a", "10.97.0.0/28", true)
	deleting.Status.Conditions = condition(metav1.ConditionTrue)
	for _, tc := range []struct {
		name string
		sc   *networkingv1.ServiceCIDR
		want bool
	}{
		{"no Ready condition yet", ready, true},
		{"Ready true", readySet, true},
		{"Ready false", notReady, false},
		{"being deleted", deleting, false},
	} {
		if got := ServiceCIDRReady(tc.sc); got != tc.want {
			t.Errorf("ServiceCIDRReady(%s) = %v; want %v", tc.name, got, tc.want)
		}
	}
}

// fillDefault takes every address of the test's 10.96.0.0/29 for other owners.
func (f *fixture) fillDefault() {
	f.t.Helper()
	for _, ip := range []string{"10.96.0.2", "10.96.0.3", "10.96.0.4", "10.96.0.5", "10.96.0.6"} {
		f.take("filler-"+ip, []string{ip}, nil)
	}
}

// addAllocdCIDR creates ServiceCIDR name in allocd, as the bridge does, and waits
// until allocd allocates from it.
func (f *fixture) addAllocdCIDR(name, cidr string) {
	f.t.Helper()
	if _, err := f.c.CreateServiceCIDR(f.t.Context(), name, cidr); err != nil {
		f.t.Fatalf("CreateServiceCIDR(%s, %s) = %v", name, cidr, err)
	}
	waitFor(f.t, "allocd's range "+cidr, func() bool {
		ranges, err := f.c.ListRanges(f.t.Context())
		return err == nil && slices.ContainsFunc(ranges, func(r *allocdv1.Range) bool {
			return r.GetName() == cidr
		})
	})
}

// TestDeletingServiceCIDR: the cluster is deleting ServiceCIDR "extra" (kube-apiserver
// allocates nothing new from it, and refuses an address in it with "the provided
// network does not match the current range"), and allocd, not told yet, still
// allocates from it. The webhook never writes such an address into a Service: one
// allocd picked is allocd's error (ErrBehind: HTTP 500, the failure policy decides,
// nothing held), one the user asked for is kube-apiserver's refusal, in its words.
func TestDeletingServiceCIDR(t *testing.T) {
	tiny := setup{ranges: "10.96.0.0/29", cidrs: []string{"10.96.0.0/29"}}
	f := newFixture(t, tiny, serviceCIDR("extra", "10.97.0.0/28", true))
	f.addAllocdCIDR("extra", "10.97.0.0/28")
	f.fillDefault()
	r := f.admit(spec{name: "web"}.object(), nil, false)
	if !errors.Is(r.err, ErrBehind) {
		t.Errorf("Admit(a dynamic address, the cluster's ready range full) = %+v, %q, %v, patched %v; want "+
			"ErrBehind", r.resp, r.result, r.err, r.patched.Spec.ClusterIPs)
	}
	if held := f.held(r.owner()); len(held) != 0 {
		t.Errorf("allocd holds %v for the admission; want nothing", held)
	}
	r = f.admit(spec{name: "pinned", ips: []string{"10.97.0.5"}}.object(), nil, false)
	const want = "failed to allocate IP 10.97.0.5: the provided network does not match the current range"
	if r.err != nil || r.result != ResultDenied || r.resp.Result.Code != 422 ||
		!strings.HasSuffix(r.resp.Result.Message, want) {
		t.Errorf("Admit(an address of the deleting ServiceCIDR) = %+v, %v; want denied %q", r.resp, r.err, want)
	}
	if held := f.held(r.owner()); len(held) != 0 {
		t.Errorf("allocd holds %v after the refusal; want nothing", held)
	}
}

// TestNewServiceCIDRNotInAllocd: the cluster gained ServiceCIDR "more" and its default
// range is full; until the bridge copies "more" into allocd, allocd finds its ranges
// full. kube-apiserver would allocate from "more": the webhook answers allocd's error
// (ErrBehind: the failure policy decides), not kube-apiserver's "range is full"
// refusal; once allocd has "more", the create is patched with an address of it.
func TestNewServiceCIDRNotInAllocd(t *testing.T) {
	tiny := setup{ranges: "10.96.0.0/29", cidrs: []string{"10.96.0.0/29"}}
	f := newFixture(t, tiny, serviceCIDR("more", "10.97.0.0/28", false))
	f.fillDefault()
	r := f.admit(spec{name: "web"}.object(), nil, false)
	if !errors.Is(r.err, ErrBehind) || !strings.Contains(r.err.Error(), "ServiceCIDR more") {
		t.Errorf("Admit(allocd full, the cluster's \"more\" not in allocd) = %+v, %q, %v; want ErrBehind "+
			"naming ServiceCIDR more", r.resp, r.result, r.err)
	}
	f.addAllocdCIDR("more", "10.97.0.0/28")
	r = f.admit(spec{name: "web"}.object(), nil, false)
	if a, ok := parseIP(r.patched.Spec.ClusterIP); r.err != nil || r.result != ResultPatched || !ok ||
		!strings.HasPrefix(a.String(), "10.97.0.") {
		t.Errorf("Admit(once allocd has \"more\") = %+v, %v, clusterIP %q; want an address of 10.97.0.0/28",
			r.resp, r.err, r.patched.Spec.ClusterIP)
	}
}
