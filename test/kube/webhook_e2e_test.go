package kube

import (
	"context"
	"crypto/x509/pkix"
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// e2eNS is the namespace of the workload of the e2e of allocd deciding.
const e2eNS = "decide"

// e2eScale is the size of the workload: KUBE_E2E_DECIDE_SERVICES, default 1,000.
func e2eScale() int { return envInt("KUBE_E2E_DECIDE_SERVICES", 1000) }

// agreeLimit bounds the wait for allocd and the cluster to agree after a step: the
// bridge's adoption of what changed, a repair pass or the sweeper's grace.
const agreeLimit = 3 * time.Minute

// agreement is the check, after a step, that allocd and a cluster agree exactly.
type agreement struct {
	cs     kubernetes.Interface
	allocd *client.Client
	// last is the state of the last look.
	lastCluster clusterState
	lastAllocd  allocdState
	lastDiff    disagreement
}

// look reads both sides once.
func (a *agreement) look(ctx context.Context) error {
	cl, err := clusterHolds(ctx, a.cs)
	if err != nil {
		return err
	}
	al, err := allocdHolds(ctx, a.allocd)
	if err != nil {
		return err
	}
	a.lastCluster, a.lastAllocd, a.lastDiff = cl, al, compareHolds(cl, al)
	return nil
}

// wait waits until allocd and the cluster agree exactly, and returns how long it took
// from since (the end of the step); it fails the test with the last differences after
// limit.
func (a *agreement) wait(t *testing.T, what string, since time.Time, limit time.Duration) time.Duration {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(limit)
	for {
		err := a.look(ctx)
		if err == nil && a.lastDiff.none() {
			d := time.Since(since)
			t.Logf("%s: allocd and the cluster agree (%d items) %v after the step's end", what,
				len(a.lastCluster), d.Round(time.Millisecond))
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: allocd and the cluster still differ %v after the step: %v (last error: %v)", what,
				limit, a.lastDiff, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// checkBookkeeping fails the test unless kube-apiserver's IPAddress objects match the
// Services of the last look.
func (a *agreement) checkBookkeeping(t *testing.T, what string) {
	t.Helper()
	diffs, err := checkIPAddresses(context.Background(), a.cs, a.lastCluster)
	if err != nil {
		t.Fatal(err)
	}
	if len(diffs) > 0 {
		t.Errorf("%s: kube-apiserver's IPAddress objects differ from its Services (%d): %s", what, len(diffs),
			strings.Join(diffs[:min(10, len(diffs))], "; "))
	}
}

// kindsCount is how many Services of each kind run created.
func kindsCount(run *createRun) string {
	n := map[string]int{}
	for _, s := range run.created {
		if s != nil {
			n[s.Labels["kind"]]++
		}
	}
	var out []string
	for _, k := range workloadKinds {
		out = append(out, fmt.Sprintf("%s %d", k.name, n[k.name]))
	}
	return strings.Join(out, ", ")
}

// TestAdoptionAgrees is the control of the e2e of allocd deciding: the same workload,
// changes and deletes with no webhook, kube-apiserver allocating and the bridge
// adopting. allocd must agree with the cluster after each step (every item of every
// Service held by its UID, nothing else, no item held twice), kube-apiserver's
// IPAddress objects with its Services; and the check that tells an item allocd decided
// from one it adopted must find every item adopted, which is what makes that check's
// "decided" worth something in the webhook's e2e.
func TestAdoptionAgrees(t *testing.T) {
	e := etcdtest.New(t)
	c := startCluster(t, clusterConfig{name: "agree", etcd: e.Endpoint, reconciler: "lease",
		advertise: advertise})
	side := startAllocd(t, e.Endpoint, 3)
	applyBridgeRBAC(t, c.Admin, "bridge-user")
	side.startBridge(t, c, c.pki.kubeconfig(t, "bridge", c.URL, pkix.Name{CommonName: "bridge-user"}))
	mustCreateNamespace(t, c.Admin, e2eNS)
	etcd := e.NewClient()
	a := &agreement{cs: c.Admin, allocd: side.Client}
	runWorkload(t, a, etcd, "/"+c.name, false)
}

// runWorkload creates the workload from 16 clients, changes it, deletes a quarter of
// it, and checks agreement after each step; decided says whether allocd decided the
// items at admission (the webhook) or adopted them.
func runWorkload(t *testing.T, a *agreement, etcd *clientv3.Client, clusterPrefix string, decided bool) {
	ctx := context.Background()
	n := e2eScale()
	run := runCreates(ctx, a.cs, n, 16, func(i int) *corev1.Service { return workloadService(e2eNS, i) })
	t.Logf("%d creates from 16 clients in %v: %.0f/s, p50 %v, p99 %v; refused: %s; load %s", n,
		run.wall.Round(time.Millisecond), run.rate(), pct(run.lat, .5), pct(run.lat, .99), &run.refused,
		loadavg())
	t.Logf("Services by kind: %s", kindsCount(run))
	if run.refused.total() > 0 {
		t.Fatalf("%d creates refused: %s", run.refused.total(), &run.refused)
	}
	a.wait(t, "after the creates", time.Now(), agreeLimit)
	a.checkBookkeeping(t, "after the creates")
	dec, adopted, unheld, err := decidedCount(ctx, etcd, clusterPrefix, e2eNS, a.lastCluster, a.lastAllocd)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("items allocd allocated before kube-apiserver stored their Service: %d; after (adopted): %d",
		len(dec), len(adopted))
	switch {
	case len(unheld) > 0:
		t.Errorf("%d items not held in allocd: %v", len(unheld), unheld[:min(10, len(unheld))])
	case decided && len(adopted) > 0:
		t.Errorf("%d items adopted, not decided by allocd at admission: %s", len(adopted),
			strings.Join(adopted[:min(10, len(adopted))], "; "))
	case !decided && len(dec) > 0:
		t.Errorf("with kube-apiserver allocating, %d items look decided by allocd: %v", len(dec),
			dec[:min(10, len(dec))])
	}

	before := a.lastCluster
	start := time.Now()
	changes, err := changeWorkload(ctx, a.cs, run.created, 16)
	if err != nil {
		t.Fatalf("after %d changes: %v", changes, err)
	}
	t.Logf("%d changes from 16 clients in %v", changes, time.Since(start).Round(time.Millisecond))
	a.wait(t, fmt.Sprintf("after %d changes", changes), time.Now(), agreeLimit)
	a.checkBookkeeping(t, "after the changes")
	gained, lost := itemsDiff(before, a.lastCluster)
	t.Logf("the changes gave the cluster's Services %d items and took %d", gained, lost)
	if gained == 0 || lost == 0 {
		t.Errorf("the changes gained %d items and lost %d; want some of both", gained, lost)
	}

	var names []string
	for i, s := range run.created {
		if s != nil && i%4 == 0 {
			names = append(names, s.Name)
		}
	}
	start = time.Now()
	if err := runDeletes(ctx, a.cs, e2eNS, names, 16); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d deletes from 16 clients in %v", len(names), time.Since(start).Round(time.Millisecond))
	a.wait(t, fmt.Sprintf("after %d deletes", len(names)), time.Now(), agreeLimit)
	a.checkBookkeeping(t, "after the deletes")
}

// itemsDiff counts the items after holds that before did not, and the reverse.
func itemsDiff(before, after clusterState) (gained, lost int) {
	for item := range after {
		if _, ok := before[item]; !ok {
			gained++
		}
	}
	for item := range before {
		if _, ok := after[item]; !ok {
			lost++
		}
	}
	return gained, lost
}

// loadavg is the machine's load average over 1, 5 and 15 minutes.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// The sweeper's grace in the e2e, short so that a create refused after admission is
// seen freed within the test (the default is minutes: docs/operators/kubernetes.md).
const (
	e2eGrace = 10 * time.Second
	e2eSweep = time.Second
)

// TestAllocdDecides is the e2e of allocd deciding a real kube-apiserver's ClusterIPs
// and NodePorts: kube-apiserver v1.37 with the webhook registered over TLS (two
// replicas, failurePolicy Fail), allocd (three replicas on the test etcd) and the
// bridge (a 10 s grace for what no Service was stored with):
//
//   - the workload (1,000 Services of every kind from 16 clients), its changes and
//     deletes: every item of every Service allocated by allocd before kube-apiserver
//     stored the Service, held in allocd by the Service's UID and in kube-apiserver's
//     IPAddress objects, and allocd agreeing with the cluster after each step;
//   - dry-run creates of every kind allocate nothing;
//   - creates refused after admission (a ResourceQuota, a ValidatingAdmissionPolicy)
//     leave their provisional items held no longer than the grace and a sweep, and not
//     freed before the grace;
//   - faults: allocd's leader and a webhook replica killed during 16-client creates;
//     allocd and the bridge stopped under failurePolicy Ignore while creates go on
//     (kube-apiserver allocates), allocd started again and creates sent through it
//     before the bridge can adopt kube-apiserver's choices: 0 items held twice, 0
//     creates refused as already allocated, and allocd agreeing with the cluster
//     exactly afterwards.
func TestAllocdDecides(t *testing.T) {
	d := startDeciding(t, decidingConfig{allocdReplicas: 3,
		bridge: []string{"--pending-grace=" + e2eGrace.String(),
			"--pending-sweep-interval=" + e2eSweep.String()},
		webhook: webhookConfig{replicas: 2, failurePolicy: admissionregistrationv1.Fail}})
	for _, ns := range []string{e2eNS, quotaNS} {
		mustCreateNamespace(t, d.c.Admin, ns)
	}
	etcd := d.etcd.NewClient()
	a := &agreement{cs: d.c.Admin, allocd: d.allocd.Client}
	t.Run("workload", func(t *testing.T) { runWorkload(t, a, etcd, "/"+d.c.name, true) })
	t.Run("dry-run", func(t *testing.T) { decideDryRun(t, d, a) })
	t.Run("refused-after-admission", func(t *testing.T) { decideRefused(t, d, a) })
	t.Run("faults", func(t *testing.T) { decideFaults(t, d, etcd) })
	bridge := "http://" + d.allocd.bridgeHealth + "/metrics"
	t.Logf("the bridge bound %.0f items to their Services and freed %.0f unbound",
		metricSum(bridge, "allocd_bridge_pending_bound_total"),
		metricSum(bridge, "allocd_bridge_pending_freed_total"))
}

// decideDryRun sends a dry-run create of every kind of the workload, from 16 clients,
// and requires allocd to hold exactly what it held before, nothing provisional.
func decideDryRun(t *testing.T, d *deciding, a *agreement) {
	ctx := context.Background()
	if err := a.look(ctx); err != nil {
		t.Fatal(err)
	}
	before := a.lastAllocd
	n := 10 * len(workloadKinds)
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	var refused refusals
	var wg sync.WaitGroup
	next := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				s := workloadService(e2eNS, 5000+i)
				if _, err := d.c.Admin.CoreV1().Services(e2eNS).Create(ctx, s, dry); err != nil {
					refused.add(err)
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if refused.total() > 0 {
		t.Errorf("dry-run creates refused: %s", &refused)
	}
	if err := a.look(ctx); err != nil {
		t.Fatal(err)
	}
	if !maps.EqualFunc(before, a.lastAllocd, func(x, y *allocdv1.Allocation) bool {
		return x.GetOwner().GetUid() == y.GetOwner().GetUid() && x.GetModRevision() == y.GetModRevision()
	}) {
		t.Errorf("allocd held %d items before %d dry-run creates, %d after (or other owners); want no change",
			len(before), n, len(a.lastAllocd))
	}
	if p := pending(t, d); len(p) > 0 {
		t.Errorf("%d items held by provisional owners after dry-run creates; want none", len(p))
	}
	t.Logf("%d dry-run creates: allocd unchanged (%d items)", n, len(before))
}

// decideRefused sends creates that are refused after admission, 40 in a namespace whose
// ResourceQuota admits quotaServices Services and 40 of which half carry the label a
// ValidatingAdmissionPolicy refuses, and follows what the webhook allocated for them:
// each refused create's items stay held by its provisional owner at least the grace
// (kube-apiserver could still be storing the Service) and are freed within the grace
// and a few sweeps; each stored create's are bound to its Service.
func decideRefused(t *testing.T, d *deciding, a *agreement) {
	ctx := context.Background()
	if err := setQuota(ctx, d.c.Admin); err != nil {
		t.Fatal(err)
	}
	if err := setDenyPolicy(ctx, d.c.Admin, e2eNS); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	w := watchProvisional(wctx, a.allocd)
	quota := runCreates(ctx, d.c.Admin, 40, 16, func(i int) *corev1.Service {
		return workloadService(quotaNS, 6000+i)
	})
	denied := runCreates(ctx, d.c.Admin, 40, 16, func(i int) *corev1.Service {
		s := workloadService(e2eNS, 7000+i)
		if i%2 == 0 {
			s.Labels[denyLabel] = "yes"
		}
		return s
	})
	end := time.Now()
	t.Logf("quota: %d stored, refused: %s; policy: %d stored, refused: %s", len(quota.lat), &quota.refused,
		len(denied.lat), &denied.refused)
	if quota.refused.get(string(metav1.StatusReasonForbidden)) != 40-quotaServices ||
		denied.refused.get(string(metav1.StatusReasonInvalid)) != 20 {
		t.Errorf("refusals: quota %s, policy %s; want %d Forbidden and 20 Invalid", &quota.refused,
			&denied.refused, 40-quotaServices)
	}
	etcdtest.WaitFor(t, e2eGrace+time.Minute, "no provisional owner left", func() bool {
		return len(pending(t, d)) == 0
	})
	freed := time.Since(end)
	stop()
	refusedNames, storedNames := map[string]bool{}, map[string]bool{}
	for _, run := range []*createRun{quota, denied} {
		for i, s := range run.created {
			ns, name := quotaNS, fmt.Sprintf("w-%d", 6000+i)
			if run == denied {
				ns, name = e2eNS, fmt.Sprintf("w-%d", 7000+i)
			}
			if s == nil {
				refusedNames[ns+"/"+name] = true
			} else {
				storedNames[ns+"/"+name] = true
			}
		}
	}
	held, bound := w.held(refusedNames), w.held(storedNames)
	if len(held) == 0 {
		t.Fatalf("no item seen held for the %d refused creates; want the webhook's allocations",
			len(refusedNames))
	}
	t.Logf("%d items of refused creates held by their provisional owners: longest %v, shortest %v "+
		"(grace %v, a sweep every %v); all freed %v after the last create; %d items of stored creates "+
		"bound within %v",
		len(held), held[0].Round(10*time.Millisecond), held[len(held)-1].Round(10*time.Millisecond), e2eGrace,
		e2eSweep, freed.Round(100*time.Millisecond), len(bound), firstOr(bound).Round(10*time.Millisecond))
	// The watch polls every 100 ms: an item is last seen up to then before it is freed.
	if shortest := held[len(held)-1]; shortest < e2eGrace-250*time.Millisecond {
		t.Errorf("an item of a refused create freed %v after its allocation; want no sooner than the "+
			"grace %v", shortest, e2eGrace)
	}
	if held[0] > e2eGrace+30*time.Second {
		t.Errorf("an item of a refused create held %v; want freed within the grace and a few sweeps", held[0])
	}
	a.wait(t, "after the refused creates", time.Now(), agreeLimit)
}

// firstOr is the first of d, or 0.
func firstOr(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[0]
}

// decideFaults runs 600 creates from 16 clients while allocd's leader is killed (after
// 150 answers) and a webhook replica (after 300), both started again after 450; then an
// outage of allocd under failurePolicy Ignore (decideOutage). Afterwards: no create
// refused as already allocated, no item held twice, allocd agreeing with the cluster
// exactly.
func decideFaults(t *testing.T, d *deciding, etcd *clientv3.Client) {
	ctx := context.Background()
	leader, err := allocdLeader(ctx, etcd, d.allocd)
	if err != nil {
		t.Fatal(err)
	}
	// The test reads allocd through a replica that stays up.
	other := (leader + 1) % len(d.allocd.Replicas)
	c, err := client.New("dns:///" + d.allocd.Addrs[other])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a := &agreement{cs: d.c.Admin, allocd: c}
	hook := d.webhook.Replicas[0]
	obj := func(base int) func(i int) *corev1.Service {
		return func(i int) *corev1.Service { return workloadService(e2eNS, base+i) }
	}
	run := runCreatesHooked(ctx, d.c.Admin, 600, 16, obj(10000),
		createHook{150, func() { d.allocd.Replicas[leader].Kill() }},
		createHook{300, hook.Kill},
		createHook{450, func() { d.allocd.Replicas[leader].Start(); hook.Start() }})
	t.Logf("600 creates, allocd's leader (replica %d) killed after 150 answers, webhook replica 0 after "+
		"300, both started after 450: %d stored in %v; refused: %s", leader, len(run.lat),
		run.wall.Round(time.Millisecond), &run.refused)
	allocated := run.refused.get(refusedAllocated)
	a.wait(t, "after the kills", time.Now(), agreeLimit)
	a.checkBookkeeping(t, "after the kills")

	allocated += decideOutage(t, d)
	a.wait(t, "after allocd's outage under Ignore", time.Now(), agreeLimit)
	a.checkBookkeeping(t, "after allocd's outage")
	if allocated > 0 {
		t.Errorf("%d creates refused as already allocated; want none", allocated)
	}
	dec, adopted, _, err := decidedCount(ctx, etcd, "/"+d.c.name, e2eNS, a.lastCluster, a.lastAllocd)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("items of the namespace's Services decided by allocd at admission: %d; adopted after "+
		"kube-apiserver chose them (the outage under Ignore): %d", len(dec), len(adopted))
}

// decideOutage stops the bridge and every allocd replica under failurePolicy Ignore,
// creates 150 NodePort Services of two ports (kube-apiserver allocates them by itself),
// starts allocd again (the bridge still stopped, so that nothing of the outage is
// adopted) and creates 300 more through the webhook: allocd, knowing nothing of
// kube-apiserver's choices, hands some of them out, and the webhook must give each to
// its holder and ask again, never letting a create be refused as already allocated.
// Then the bridge starts (its first sweep must not free what its first adoption pass
// binds: the provisional items of the 300 are older than the grace by then), and the
// registration is Fail again. It returns the creates refused as already allocated.
func decideOutage(t *testing.T, d *deciding) int {
	ctx := context.Background()
	nodePorts := func(base int) func(i int) *corev1.Service {
		return func(i int) *corev1.Service {
			s := plainService(e2eNS, fmt.Sprintf("np-%d", base+i))
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "https", Port: 443,
				Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8443)})
			return s
		}
	}
	setFailurePolicy(t, d, admissionregistrationv1.Ignore)
	d.allocd.Bridge.Stop()
	for _, r := range d.allocd.Replicas {
		r.Stop()
	}
	down := runCreates(ctx, d.c.Admin, 150, 16, nodePorts(0))
	t.Logf("150 creates with allocd and the bridge stopped under Ignore: %d stored in %v; refused: %s",
		len(down.lat), down.wall.Round(time.Millisecond), &down.refused)
	for _, r := range d.allocd.Replicas {
		r.Start()
	}
	for i, h := range d.webhook.Health {
		waitHTTP(t, d.webhook.Replicas[i], "http://"+h+"/readyz", "", 2*time.Minute)
	}
	held := d.webhook.clusterHeld()
	after := runCreates(ctx, d.c.Admin, 300, 16, nodePorts(1000))
	took := d.webhook.clusterHeld() - held
	t.Logf("300 creates through allocd, started again, the bridge still stopped: %d stored in %v; "+
		"refused: %s; items allocd handed out that kube-apiserver had chosen (given to their holder, "+
		"asked again): %.0f",
		len(after.lat), after.wall.Round(time.Millisecond), &after.refused, took)
	if took == 0 {
		t.Errorf("allocd handed out none of the %d items kube-apiserver chose in the outage: the webhook's "+
			"check went untried", 3*len(down.lat))
	}
	d.allocd.Bridge.Start()
	d.allocd.WaitBridgeReady(t)
	setFailurePolicy(t, d, admissionregistrationv1.Fail)
	return down.refused.get(refusedAllocated) + after.refused.get(refusedAllocated)
}

// setFailurePolicy sets the failurePolicy of the webhook's registration.
func setFailurePolicy(t *testing.T, d *deciding, p admissionregistrationv1.FailurePolicyType) {
	t.Helper()
	ctx := context.Background()
	regs := d.c.Admin.AdmissionregistrationV1().MutatingWebhookConfigurations()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		reg, err := regs.Get(ctx, d.webhook.Config.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		reg.Webhooks[0].FailurePolicy = &p
		_, err = regs.Update(ctx, reg, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// clusterHeld is allocd_webhook_cluster_held_total over the webhook's replicas: the
// items allocd handed out that the cluster used (kube-apiserver chose them while the
// webhook was bypassed), which the webhook gave to their holder before asking again.
func (w *webhookSide) clusterHeld() float64 {
	var n float64
	for _, h := range w.Health {
		n += metricSum("http://"+h+"/metrics", "allocd_webhook_cluster_held_total")
	}
	return n
}
