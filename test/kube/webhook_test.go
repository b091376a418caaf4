package kube

import (
	"context"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// webhookCase is a Service created through kube-apiserver with allocd's webhook.
type webhookCase struct {
	name   string
	mutate func(*corev1.Service)
	// sharedNodePort: every port has the same node port (one port number).
	sharedNodePort bool
}

func webhookCases() []webhookCase {
	policy := func(p corev1.IPFamilyPolicy, fams ...corev1.IPFamily) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Spec.IPFamilyPolicy, s.Spec.IPFamilies = &p, fams }
	}
	typed := func(t corev1.ServiceType, more func(*corev1.Service)) func(*corev1.Service) {
		return func(s *corev1.Service) {
			s.Spec.Type = t
			if more != nil {
				more(s)
			}
		}
	}
	noNodePorts := false
	np, lb := corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer
	return []webhookCase{
		{name: "clusterip"},
		{name: "prefer-dual", mutate: policy(corev1.IPFamilyPolicyPreferDualStack)},
		{name: "require-dual-v6-first", mutate: policy(corev1.IPFamilyPolicyRequireDualStack,
			corev1.IPv6Protocol, corev1.IPv4Protocol)},
		{name: "single-v6", mutate: policy(corev1.IPFamilyPolicySingleStack, corev1.IPv6Protocol)},
		{name: "requested", mutate: func(s *corev1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.77", []string{"10.96.0.77"}
		}},
		{name: "nodeport", mutate: typed(np, nil)},
		{name: "nodeport-53", sharedNodePort: true, mutate: typed(np, func(s *corev1.Service) {
			s.Spec.Ports = []corev1.ServicePort{{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
				{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP}}
		})},
		{name: "nodeport-requested", mutate: typed(np, func(s *corev1.Service) {
			s.Spec.Ports[1].NodePort = 30077
		})},
		{name: "loadbalancer", mutate: typed(lb, nil)},
		{name: "loadbalancer-no-nodeports", mutate: typed(lb, func(s *corev1.Service) {
			s.Spec.AllocateLoadBalancerNodePorts = &noNodePorts
		})},
		{name: "loadbalancer-local", mutate: typed(lb, func(s *corev1.Service) {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		})},
		{name: "", mutate: typed(np, func(s *corev1.Service) { s.GenerateName = "generated-" })},
	}
}

// TestWebhook creates Services of every kind through a real kube-apiserver v1.37 with
// allocd's webhook registered over TLS (two replicas, failurePolicy Fail): every
// ClusterIP, node port and health check node port the Service is stored with is the
// one allocd allocated (held in allocd by the admission's provisional owner first, then
// bound to the Service's UID by the bridge: its mod revision is past its create
// revision), and every ClusterIP has kube-apiserver's IPAddress object. Requested
// addresses and ports that are taken are refused with kube-apiserver's words; a dry run
// allocates nothing; a create refused after admission leaves nothing held past the
// bridge's grace; and `allocd describe allocation` names a Service created as
// `kubectl create service clusterip web --tcp=80` makes it.
func TestWebhook(t *testing.T) {
	d := startDeciding(t, decidingConfig{
		bridge:  []string{"--pending-grace=15s", "--pending-sweep-interval=1s"},
		webhook: webhookConfig{failurePolicy: admissionregistrationv1.Fail},
	})
	mustCreateNamespace(t, d.c.Admin, testNS)
	t.Run("creates", func(t *testing.T) { webhookCreates(t, d) })
	t.Run("updates", func(t *testing.T) { webhookUpdates(t, d) })
	t.Run("refused", func(t *testing.T) { webhookRefused(t, d) })
	t.Run("dry-run", func(t *testing.T) { webhookDryRun(t, d) })
	t.Run("refused-after-admission", func(t *testing.T) { webhookQuota(t, d) })
	t.Run("acceptance", func(t *testing.T) { webhookAcceptance(t, d) })
	t.Run("skip-label", func(t *testing.T) { webhookSkipLabel(t, d) })
	t.Run("servicecidrs", func(t *testing.T) { webhookServiceCIDRs(t, d) })
	t.Run("allocd-down", func(t *testing.T) { webhookAllocdDown(t, d) })
	bridge := "http://" + d.allocd.bridgeHealth + "/metrics"
	if n := metricSum(bridge, "allocd_bridge_pending_bound_total"); n == 0 {
		t.Errorf("allocd_bridge_pending_bound_total = 0; want the bound items counted")
	}
}

func webhookCreates(t *testing.T, d *deciding) {
	ctx := context.Background()
	var stored []*corev1.Service
	for _, tc := range webhookCases() {
		svc := svcSpec{name: tc.name, app: "web"}.object()
		if tc.mutate != nil {
			tc.mutate(svc)
		}
		got, err := d.c.Admin.CoreV1().Services(testNS).Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create %s: %v", tc.name, err)
		}
		if tc.sharedNodePort && got.Spec.Ports[0].NodePort != got.Spec.Ports[1].NodePort {
			t.Errorf("%s: node ports %d and %d; want one shared by the ports of one number", got.Name,
				got.Spec.Ports[0].NodePort, got.Spec.Ports[1].NodePort)
		}
		stored = append(stored, got)
	}
	etcdtest.WaitFor(t, convergeLimit, "every item bound to its Service", func() bool {
		for _, s := range stored {
			for _, it := range serviceItems(s) {
				if al := allocation(d, it); al == nil || al.GetOwner().GetUid() != string(s.UID) {
					return false
				}
			}
		}
		return true
	})
	for _, s := range stored {
		items := serviceItems(s)
		t.Logf("%s/%s: %v", s.Namespace, s.Name, items)
		for _, it := range items {
			al := allocation(d, it)
			if o := al.GetOwner(); o.GetNamespace() != s.Namespace || o.GetName() != s.Name ||
				al.GetModRevision() <= al.GetCreateRevision() {
				t.Errorf("%s of %s: %+v; want allocated before the Service was stored, then bound to it", it,
					s.Name, al)
			}
		}
		for _, ip := range s.Spec.ClusterIPs {
			a, err := d.c.Admin.NetworkingV1().IPAddresses().Get(ctx, ip, metav1.GetOptions{})
			if err != nil || a.Spec.ParentRef == nil || a.Spec.ParentRef.Name != s.Name {
				t.Errorf("IPAddress %s: %+v, %v; want kube-apiserver's, parent %s", ip, a, err, s.Name)
			}
		}
	}
	checkNothingPending(t, d)
}

// serviceItems are the ClusterIPs and node ports of s, as allocd names them.
func serviceItems(s *corev1.Service) []string {
	var out []string
	for _, ip := range s.Spec.ClusterIPs {
		if a, err := netip.ParseAddr(ip); err == nil {
			out = append(out, a.String())
		}
	}
	for _, p := range s.Spec.Ports {
		if n := strconv.Itoa(int(p.NodePort)); p.NodePort != 0 && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	if s.Spec.HealthCheckNodePort != 0 {
		out = append(out, strconv.Itoa(int(s.Spec.HealthCheckNodePort)))
	}
	return out
}

// allocation is allocd's allocation of item (a ClusterIP or a node port), nil if free.
func allocation(d *deciding, item string) *allocdv1.Allocation {
	req := &allocdv1.GetAllocationRequest{Target: &allocdv1.GetAllocationRequest_ClusterIp{ClusterIp: item}}
	if p, err := strconv.Atoi(item); err == nil {
		req.Target = &allocdv1.GetAllocationRequest_NodePort{NodePort: int32(p)}
	}
	al, err := d.allocd.Client.GetAllocation(context.Background(), req)
	if err != nil {
		return nil
	}
	return al
}

// pending lists the items allocd holds for provisional owners.
func pending(t *testing.T, d *deciding) []*allocdv1.Allocation {
	t.Helper()
	resp, err := d.allocd.Client.ListAllocations(context.Background(),
		&allocdv1.ListAllocationsRequest{OwnerUidPrefix: "admission/"})
	if err != nil {
		t.Fatalf("ListAllocations(admission/) = %v", err)
	}
	return resp.GetAllocations()
}

// checkNothingPending waits until no provisional owner holds anything.
func checkNothingPending(t *testing.T, d *deciding) {
	t.Helper()
	etcdtest.WaitFor(t, convergeLimit, "no provisional owner left", func() bool {
		return len(pending(t, d)) == 0
	})
}

// webhookRefused: requested addresses and node ports that are taken are refused with
// kube-apiserver's code and words, whether kube-apiserver or only allocd knows they are.
func webhookRefused(t *testing.T, d *deciding) {
	ctx := context.Background()
	svcs := d.c.Admin.CoreV1().Services(testNS)
	create := func(name string, mutate func(*corev1.Service)) error {
		s := svcSpec{name: name, app: "web"}.object()
		mutate(s)
		_, err := svcs.Create(ctx, s, metav1.CreateOptions{})
		return err
	}
	ip := func(a string) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = a, []string{a} }
	}
	if err := create("taken-a", ip("10.96.0.78")); err != nil {
		t.Fatal(err)
	}
	if _, err := d.allocd.Client.Allocate(ctx, &allocdv1.AllocateRequest{
		Owner:      &allocdv1.Owner{Namespace: "elsewhere", Name: "x", Uid: "uid-elsewhere"},
		ClusterIps: []string{"10.96.0.79"}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, want string
		mutate     func(*corev1.Service)
	}{
		{name: "taken-b", mutate: ip("10.96.0.78"),
			want: "failed to allocate IP 10.96.0.78: provided IP is already allocated"},
		{name: "taken-c", mutate: ip("10.96.0.79"),
			want: "failed to allocate IP 10.96.0.79: provided IP is already allocated"},
		{name: "taken-d", mutate: func(s *corev1.Service) {
			s.Spec.Type, s.Spec.Ports[0].NodePort = corev1.ServiceTypeNodePort, 30077
		}, want: "spec.ports[0].nodePort: Invalid value: 30077: provided port is already allocated"},
		{name: "outside", mutate: ip("10.200.0.5"),
			want: "failed to allocate IP 10.200.0.5: the provided network does not match the current range"},
	} {
		err := create(tc.name, tc.mutate)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("create %s: %v; want 422 Invalid with %q", tc.name, err, tc.want)
		}
	}
	checkNothingPending(t, d)
}

// webhookDryRun: a dry-run create allocates nothing in allocd.
func webhookDryRun(t *testing.T, d *deciding) {
	ctx := context.Background()
	before := countAllocations(t, d)
	s := svcSpec{name: "dry", app: "web", nodePort: true, dualStack: true}.object()
	if _, err := d.c.Admin.CoreV1().Services(testNS).Create(ctx, s,
		metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatal(err)
	}
	if after := countAllocations(t, d); after != before || len(pending(t, d)) != 0 {
		t.Errorf("allocations %d before a dry-run create, %d after (%d pending); want no change",
			before, after, len(pending(t, d)))
	}
}

func countAllocations(t *testing.T, d *deciding) int {
	t.Helper()
	n := 0
	req := &allocdv1.ListAllocationsRequest{PageSize: 1000}
	for {
		resp, err := d.allocd.Client.ListAllocations(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		n += len(resp.GetAllocations())
		if resp.GetNextPageToken() == "" {
			return n
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// webhookQuota: a create that a ResourceQuota refuses after admission leaves what the
// webhook allocated for it held until the bridge's grace (15 s here) has passed, then
// freed.
func webhookQuota(t *testing.T, d *deciding) {
	ctx := context.Background()
	mustCreateNamespace(t, d.c.Admin, "quota")
	q := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Namespace: "quota", Name: "no-services"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{
			corev1.ResourceServices: resource.MustParse("0")}}}
	q, err := d.c.Admin.CoreV1().ResourceQuotas("quota").Create(ctx, q, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// What kube-controller-manager's quota controller would write (none runs here).
	q.Status = corev1.ResourceQuotaStatus{Hard: q.Spec.Hard,
		Used: corev1.ResourceList{corev1.ResourceServices: resource.MustParse("0")}}
	_, err = d.c.Admin.CoreV1().ResourceQuotas("quota").UpdateStatus(ctx, q, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := svcSpec{name: "refused", app: "web", nodePort: true}.object()
	s.Namespace = "quota"
	start := time.Now()
	etcdtest.WaitFor(t, time.Minute, "the quota enforced", func() bool {
		_, err = d.c.Admin.CoreV1().Services("quota").Create(ctx, s, metav1.CreateOptions{})
		return apierrors.IsForbidden(err)
	})
	held := pending(t, d)
	if len(held) == 0 {
		t.Fatalf("nothing pending after a create refused by the quota (%v); want the webhook's "+
			"allocation", err)
	}
	checkNothingPending(t, d)
	t.Logf("a create refused after admission: %d items held by its provisional owner, freed %v after the "+
		"create (grace 15 s, sweeps every 1 s)", len(held), time.Since(start).Round(100*time.Millisecond))
	if took := time.Since(start); took < 15*time.Second {
		t.Errorf("freed %v after the create; want no sooner than the 15 s grace", took)
	}
}

// webhookAcceptance: `kubectl create service clusterip web --tcp=80` through the API
// server, then `allocd describe allocation <its ClusterIP>` names default/web and its
// UID.
func webhookAcceptance(t *testing.T, d *deciding) {
	ctx := context.Background()
	// What kubectl create service clusterip web --tcp=80 sends.
	labels := map[string]string{"app": "web"}
	web := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: labels},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "80", Port: 80, TargetPort: intstr.FromInt32(80),
				Protocol: corev1.ProtocolTCP}}}}
	got, err := d.c.Admin.CoreV1().Services("default").Create(ctx, web, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	etcdtest.WaitFor(t, convergeLimit, "allocd describe allocation naming default/web", func() bool {
		out, err = exec.Command(binary(t, "allocd"), "describe", "allocation", got.Spec.ClusterIP,
			"--server="+d.allocd.Addrs[0]).CombinedOutput()
		return err == nil && strings.Contains(string(out), "default/web") &&
			strings.Contains(string(out), string(got.UID))
	})
	t.Logf("$ allocd describe allocation %s\n%s", got.Spec.ClusterIP, out)
}

// webhookAllocdDown: with allocd stopped, failurePolicy Fail refuses a create with a
// message that names allocd; Ignore lets kube-apiserver allocate by itself, and once
// allocd is back the bridge adopts what kube-apiserver chose.
func webhookAllocdDown(t *testing.T, d *deciding) {
	ctx := context.Background()
	svcs := d.c.Admin.CoreV1().Services(testNS)
	allocd := d.allocd.Replicas[0]
	allocd.Stop()
	_, err := svcs.Create(ctx, svcSpec{name: "down-fail", app: "web"}.object(), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "allocd") {
		t.Errorf("create under Fail with allocd stopped: %v; want refused with a message naming allocd", err)
	}
	t.Logf("failurePolicy Fail, allocd stopped: %v", err)
	// The replicas stay ready while allocd is down (behind a Service, they stay in its
	// endpoints, and kube-apiserver keeps getting their answer, which names allocd).
	etcdtest.WaitFor(t, 30*time.Second, "the replicas' health checks of allocd failing", func() bool {
		for _, h := range d.webhook.Health {
			if v, ok := scrape("http://" + h + "/metrics")["allocd_webhook_allocd_reachable"]; !ok || v != 0 {
				return false
			}
		}
		return true
	})
	for _, h := range d.webhook.Health {
		resp, err := http.Get("http://" + h + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s/readyz with allocd down: %s; want 200 (readiness is the informers' alone)", h,
				resp.Status)
		}
	}

	regs := d.c.Admin.AdmissionregistrationV1().MutatingWebhookConfigurations()
	reg, err := regs.Get(ctx, d.webhook.Config.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ignore := admissionregistrationv1.Ignore
	reg.Webhooks[0].FailurePolicy = &ignore
	if _, err := regs.Update(ctx, reg, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.Service
	etcdtest.WaitFor(t, time.Minute, "a create let through under Ignore", func() bool {
		svc := svcSpec{name: "down-ignore", app: "web"}.object()
		got, err = svcs.Create(ctx, svc, metav1.CreateOptions{})
		return err == nil
	})
	allocd.Start()
	ip := got.Spec.ClusterIP
	etcdtest.WaitFor(t, convergeLimit, "kube-apiserver's own address adopted after", func() bool {
		al := allocation(d, ip)
		return al != nil && al.GetOwner().GetUid() == string(got.UID)
	})
	if al := allocation(d, ip); al.GetModRevision() != al.GetCreateRevision() {
		t.Errorf("%s: %+v; want adopted (allocated under the Service's UID), not the webhook's", ip, al)
	}
	reg, err = regs.Get(ctx, d.webhook.Config.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reg.Webhooks[0].FailurePolicy = d.webhook.Config.Webhooks[0].FailurePolicy
	if _, err := regs.Update(ctx, reg, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// webhookUpdates: updates through kube-apiserver get what their change newly needs from
// allocd (bound to the Service like a create's), and what a change gives up is
// released by the bridge once stored.
func webhookUpdates(t *testing.T, d *deciding) {
	ctx := context.Background()
	svcs := d.c.Admin.CoreV1().Services(testNS)
	create := func(name string, mutate func(*corev1.Service)) *corev1.Service {
		s := svcSpec{name: name, app: "web"}.object()
		if mutate != nil {
			mutate(s)
		}
		got, err := svcs.Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		return got
	}
	update := func(s *corev1.Service, mutate func(*corev1.Service)) *corev1.Service {
		mutate(s)
		got, err := svcs.Update(ctx, s, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("update %s: %v", s.Name, err)
		}
		return got
	}
	require := corev1.IPFamilyPolicyRequireDualStack
	np := func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort }
	var updated []*corev1.Service
	updated = append(updated,
		update(create("to-nodeport", nil), np),
		update(create("to-dual", nil), func(s *corev1.Service) { s.Spec.IPFamilyPolicy = &require }),
		update(create("more-ports", np), func(s *corev1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "extra", Port: 8080,
				Protocol: corev1.ProtocolTCP})
		}),
		update(create("to-local", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeLoadBalancer }),
			func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}),
		update(create("from-external", func(s *corev1.Service) {
			s.Spec.Type, s.Spec.ExternalName = corev1.ServiceTypeExternalName, "example.com"
			s.Spec.Ports = nil
		}), func(s *corev1.Service) {
			s.Spec.Type, s.Spec.ExternalName = corev1.ServiceTypeClusterIP, ""
			s.Spec.Ports = svcSpec{}.object().Spec.Ports
		}),
	)
	gone := create("to-clusterip", np)
	given := serviceItems(gone)[1:]
	updated = append(updated, update(gone, func(s *corev1.Service) {
		s.Spec.Type, s.Spec.ExternalTrafficPolicy = corev1.ServiceTypeClusterIP, ""
		for i := range s.Spec.Ports {
			s.Spec.Ports[i].NodePort = 0
		}
	}))
	etcdtest.WaitFor(t, convergeLimit, "the updated Services' items bound, the given-up freed", func() bool {
		for _, s := range updated {
			for _, it := range serviceItems(s) {
				if al := allocation(d, it); al == nil || al.GetOwner().GetUid() != string(s.UID) {
					return false
				}
			}
		}
		return allocation(d, given[0]) == nil && allocation(d, given[1]) == nil
	})
	for _, s := range updated {
		t.Logf("%s: %s %v", s.Name, s.Spec.Type, serviceItems(s))
		for _, it := range serviceItems(s) {
			if al := allocation(d, it); al.GetModRevision() <= al.GetCreateRevision() {
				t.Errorf("%s of %s: %+v; want allocated by the webhook, then bound", it, s.Name, al)
			}
		}
	}
	checkNothingPending(t, d)
}

// webhookSkipLabel: the label allocd.io/admission: skip keeps the webhook away only in
// kube-system (the webhook's own Service, allocd's): a Service of another namespace that
// carries it is admitted all the same (its address allocated by allocd, then bound),
// so that nobody bypasses allocd with a label; one of kube-system gets kube-apiserver's
// own address, adopted by the bridge.
func webhookSkipLabel(t *testing.T, d *deciding) {
	ctx := context.Background()
	for _, tc := range []struct {
		ns       string
		admitted bool
	}{{testNS, true}, {metav1.NamespaceSystem, false}} {
		s := svcSpec{name: "skip-label", app: "web",
			labels: map[string]string{"allocd.io/admission": "skip"}}.object()
		s.Namespace = tc.ns
		got, err := d.c.Admin.CoreV1().Services(tc.ns).Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create %s/skip-label: %v", tc.ns, err)
		}
		var al *allocdv1.Allocation
		etcdtest.WaitFor(t, convergeLimit, tc.ns+"/skip-label's address held by its UID", func() bool {
			al = allocation(d, got.Spec.ClusterIP)
			return al != nil && al.GetOwner().GetUid() == string(got.UID)
		})
		if admitted := al.GetModRevision() > al.GetCreateRevision(); admitted != tc.admitted {
			t.Errorf("%s/skip-label (allocd.io/admission: skip): %+v; admitted by the webhook %v, want %v",
				tc.ns, al, admitted, tc.admitted)
		}
	}
}

// webhookServiceCIDRs: allocd's ServiceCIDRs follow the cluster's within moments (the
// bridge's informer, not a periodic copy): one created in the cluster is created in
// allocd; one the cluster deletes is deleted in allocd, whether its deletion is seen
// in progress (a finalizer holds it, as kube-controller-manager's does while addresses
// lie in it) or only once it is gone. A Service asking for an address of the one being
// deleted is refused in kube-apiserver's words.
func webhookServiceCIDRs(t *testing.T, d *deciding) {
	ctx := context.Background()
	cidrs := d.c.Admin.NetworkingV1().ServiceCIDRs()
	const hold = "allocd.io/e2e-hold"
	state := func(name string) allocdv1.ServiceCIDRState {
		sc, err := d.allocd.Client.GetServiceCIDR(ctx, name)
		if err != nil {
			return allocdv1.ServiceCIDRState_SERVICE_CIDR_STATE_UNSPECIFIED
		}
		return sc.GetState()
	}
	for name, cidr := range map[string]string{"held": "10.97.0.0/28", "gone": "10.97.1.0/28"} {
		sc := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{cidr}}}
		if name == "held" {
			sc.Finalizers = []string{hold}
		}
		if _, err := cidrs.Create(ctx, sc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		etcdtest.WaitFor(t, 10*time.Second, "ServiceCIDR "+name+" created in allocd", func() bool {
			return state(name) == allocdv1.ServiceCIDRState_SERVICE_CIDR_STATE_READY
		})
		if err := cidrs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		etcdtest.WaitFor(t, 10*time.Second, "ServiceCIDR "+name+" deleted in allocd", func() bool {
			return state(name) != allocdv1.ServiceCIDRState_SERVICE_CIDR_STATE_READY
		})
	}
	s := svcSpec{name: "in-deleted-cidr", app: "web"}.object()
	s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.97.0.5", []string{"10.97.0.5"}
	_, err := d.c.Admin.CoreV1().Services(testNS).Create(ctx, s, metav1.CreateOptions{})
	const want = "failed to allocate IP 10.97.0.5: the provided network does not match the current range"
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("create with an address of a ServiceCIDR being deleted: %v; want 422 with %q", err, want)
	}
	held, err := cidrs.Get(ctx, "held", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	held.Finalizers = nil
	if _, err := cidrs.Update(ctx, held, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	checkNothingPending(t, d)
}

// TestWebhookManifest checks what no API server checks in the webhook's manifest: with
// its replicas on different nodes (a required anti-affinity), a rolling update must be
// able to take an old replica down before it starts a new one, or it stalls on a
// cluster of as many nodes as replicas.
func TestWebhookManifest(t *testing.T) {
	b, err := os.ReadFile(filepath.FromSlash(webhookManifest))
	if err != nil {
		t.Fatal(err)
	}
	var dep *appsv1.Deployment
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s: %v", webhookManifest, err)
		}
		if meta.Kind == "Deployment" {
			dep = &appsv1.Deployment{}
			if err := yaml.UnmarshalStrict([]byte(doc), dep); err != nil {
				t.Fatalf("%s: Deployment: %v", webhookManifest, err)
			}
		}
	}
	if dep == nil || dep.Spec.Replicas == nil || dep.Spec.Strategy.RollingUpdate == nil {
		t.Fatalf("%s: want a Deployment with replicas and a rolling update", webhookManifest)
	}
	aff := dep.Spec.Template.Spec.Affinity
	if aff == nil || aff.PodAntiAffinity == nil ||
		len(aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) == 0 {
		return // a surge replica can share a node
	}
	unavailable, err := intstr.GetScaledValueFromIntOrPercent(dep.Spec.Strategy.RollingUpdate.MaxUnavailable,
		int(*dep.Spec.Replicas), false)
	if err != nil || unavailable < 1 {
		t.Errorf("%s: maxUnavailable %v (%d of %d replicas, %v) with a required anti-affinity: a rollout on "+
			"%d nodes waits forever for a surge replica to be scheduled", webhookManifest,
			dep.Spec.Strategy.RollingUpdate.MaxUnavailable, unavailable, *dep.Spec.Replicas, err,
			*dep.Spec.Replicas)
	}
}
