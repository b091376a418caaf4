package kube

import (
	"context"
	"crypto/x509/pkix"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/internal/testing/etcdtest"
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
