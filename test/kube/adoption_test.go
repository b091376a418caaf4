package kube

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/allocd/allocd/allocator"
	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

const adoptNS = "adopt"

// clusterHoldings is every ClusterIP and NodePort the cluster's Services hold, mapped to
// the holder's UID.
func (p *pair) clusterHoldings(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	opts := metav1.ListOptions{Limit: 500}
	for {
		list, err := p.alc.Admin.CoreV1().Services("").List(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list.Items {
			for _, ip := range s.Spec.ClusterIPs {
				switch {
				case ip == corev1.ClusterIPNone || ip == "":
				case s.Namespace == "default" && s.Name == "kubernetes" && ip == "10.96.0.1":
					// allocd reserves it at start under an owner of its own.
					out[ip] = allocator.KubernetesOwner.UID
				default:
					out[ip] = string(s.UID)
				}
			}
			for _, port := range s.Spec.Ports {
				if port.NodePort != 0 {
					out[fmt.Sprint(port.NodePort)] = string(s.UID)
				}
			}
		}
		if list.Continue == "" {
			return out
		}
		opts.Continue = list.Continue
	}
}

// allocdHoldings is every allocation in allocd, mapped to its owner's UID.
func (p *pair) allocdHoldings(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	req := &allocdv1.ListAllocationsRequest{PageSize: 1000}
	for {
		resp, err := p.allocd.Client.ListAllocations(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range resp.GetAllocations() {
			k := a.GetClusterIp()
			if k == "" {
				k = fmt.Sprint(a.GetNodePort())
			}
			out[k] = a.GetOwner().GetUid()
		}
		if resp.GetNextPageToken() == "" {
			return out
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// testAdoption stops the bridge, creates 1,000 Services (a third of them NodePort, a
// tenth dual-stack), runs the one-shot import, and requires allocd to hold exactly the
// cluster's addresses and ports under their Services' UIDs; then, with the bridge back,
// allocates every free NodePort and 2,000 ClusterIPs through allocd and requires none of
// them to be one the cluster holds.
func (p *pair) testAdoption(t *testing.T) {
	ctx := context.Background()
	p.allocd.Bridge.Stop()
	mustCreateNamespace(t, p.alc.Admin, adoptNS)
	const n = 1000
	err := parallel(ctx, n, func(ctx context.Context, i int) error {
		s := svcSpec{name: fmt.Sprintf("s-%d", i), app: fmt.Sprintf("a-%d", i), nodePort: i%3 == 0, dualStack: i%10 == 0}
		obj := s.object()
		obj.Namespace = adoptNS
		_, err := p.alc.Admin.CoreV1().Services(adoptNS).Create(ctx, obj, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, err := exec.Command(binary(t, "allocd-bridge"), "import",
		"--kubeconfig="+p.alc.AdminConfig, "--allocd-address="+p.allocd.target()).CombinedOutput()
	if err != nil {
		t.Fatalf("allocd-bridge import: %v\n%s", err, notable(out))
	}
	t.Logf("import of %d Services took %v; it printed:\n%s", n, time.Since(start).Round(time.Millisecond), tail(out))
	want := p.clusterHoldings(t)
	if !strings.Contains(string(out), "conflicts: 0, failed: 0") {
		t.Errorf("import reported conflicts:\n%s", tail(out))
	}
	got := p.allocdHoldings(t)
	if !maps.Equal(got, want) {
		t.Fatalf("after import allocd holds %d allocations, the cluster's Services %d; differences:\n%s",
			len(got), len(want), holdingsDiff(want, got))
	}

	p.allocd.Bridge.Start()
	p.allocd.WaitBridgeReady(t)
	// A Service created while the bridge runs is adopted too.
	s := svcSpec{name: "late", app: "late", nodePort: true}.object()
	s.Namespace = adoptNS
	if _, err := p.alc.Admin.CoreV1().Services(adoptNS).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, convergeLimit, "allocd holding what the cluster's Services hold", func() bool {
		return maps.Equal(p.allocdHoldings(t), p.clusterHoldings(t))
	})
	want = p.clusterHoldings(t)
	p.allocateAround(t, want)
}

// allocateAround allocates through allocd every free NodePort and 2,000 dynamic
// ClusterIPs, and fails if any is one the cluster holds.
func (p *pair) allocateAround(t *testing.T, held map[string]string) {
	ctx := context.Background()
	var ports, ips int
	for i := 0; ; i++ {
		resp, err := p.allocd.Client.Allocate(ctx, &allocdv1.AllocateRequest{
			Owner:       &allocdv1.Owner{Namespace: "probe", Name: fmt.Sprint(i), Uid: fmt.Sprintf("probe-port-%d", i)},
			NoClusterIp: true, NodePortCount: 1})
		if errors.Is(err, client.ErrFull) {
			break
		}
		if err != nil {
			t.Fatalf("Allocate a NodePort: %v", err)
		}
		for _, port := range resp.GetNodePorts() {
			if uid, ok := held[fmt.Sprint(port)]; ok {
				t.Fatalf("allocd handed out NodePort %d, held by the cluster's Service %s", port, uid)
			}
			ports++
		}
	}
	for i := range 2000 {
		resp, err := p.allocd.Client.Allocate(ctx, &allocdv1.AllocateRequest{
			Owner: &allocdv1.Owner{Namespace: "probe", Name: fmt.Sprint(i), Uid: fmt.Sprintf("probe-ip-%d", i)}})
		if err != nil {
			t.Fatalf("Allocate a ClusterIP: %v", err)
		}
		for _, ip := range resp.GetClusterIps() {
			if uid, ok := held[ip]; ok {
				t.Fatalf("allocd handed out ClusterIP %s, held by the cluster's Service %s", ip, uid)
			}
			ips++
		}
	}
	heldPorts := 0
	for k := range held {
		if !strings.Contains(k, ".") && !strings.Contains(k, ":") {
			heldPorts++
		}
	}
	t.Logf("allocated %d NodePorts (every free one: the cluster holds %d) and %d ClusterIPs; none held by the cluster",
		ports, heldPorts, ips)
	if ports+heldPorts != 32767-30000+1 {
		t.Errorf("%d free NodePorts allocated + %d held by the cluster = %d; want the whole range, %d",
			ports, heldPorts, ports+heldPorts, 32767-30000+1)
	}
}

func holdingsDiff(want, got map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if got[k] != want[k] {
			out = append(out, fmt.Sprintf("%s: cluster %q, allocd %q", k, want[k], got[k]))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			out = append(out, fmt.Sprintf("%s: allocd %q, no Service holds it", k, got[k]))
		}
	}
	if len(out) > 40 {
		out = append(out[:40], fmt.Sprintf("... %d more", len(out)-40))
	}
	return strings.Join(out, "\n")
}

// notable is the lines of import's output that are not plain adoptions.
func notable(b []byte) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "adopted ") {
			out = append(out, l)
		}
	}
	return tail([]byte(strings.Join(out, "\n")))
}

func tail(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 15 {
		lines = append([]string{fmt.Sprintf("... %d lines ...", len(lines)-15)}, lines[len(lines)-15:]...)
	}
	return strings.Join(lines, "\n")
}
