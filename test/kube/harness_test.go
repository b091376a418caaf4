package kube

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// TestHarness checks the harness alone: a kube-apiserver starts on the test etcd, and
// Nodes, Services and Pods are created through it, with the Pod's status set through
// the status subresource as a kubelet would.
func TestHarness(t *testing.T) {
	e := etcdtest.New(t)
	c := startCluster(t, clusterConfig{name: "harness", etcd: e.Endpoint, reconciler: "lease", advertise: advertise})
	ctx := context.Background()
	mustCreateNamespace(t, c.Admin, testNS)
	if err := createNode(ctx, c.Admin, "node-0", "zone-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admin.CoreV1().Services(testNS).Create(ctx, svcSpec{name: "web", app: "web", dualStack: true}.object(),
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := createPod(ctx, c.Admin, podSpec{name: "web-0", app: "web", node: "node-0", ip4: podIP4(0), ip6: podIP6(0),
		ready: true}); err != nil {
		t.Fatal(err)
	}
	pod, err := c.Admin.CoreV1().Pods(testNS).Get(ctx, "web-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.Status.PodIPs) != 2 || pod.Status.Phase != "Running" || pod.Status.Conditions[0].Status != "True" {
		t.Errorf("pod status = %+v; want two IPs, Running, Ready", pod.Status)
	}
	svc, err := c.Admin.CoreV1().Services(testNS).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(svc.Spec.ClusterIPs) != 2 {
		t.Errorf("dual-stack Service ClusterIPs = %v; want two", svc.Spec.ClusterIPs)
	}
	cidrs, err := c.Admin.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
	if err != nil || len(cidrs.Items) != 1 {
		t.Fatalf("ServiceCIDRs = %v, %v; want the one of --service-cluster-ip-range", cidrs, err)
	}
	t.Logf("ServiceCIDR %s %v; kubernetes endpoints reconciled by kube-apiserver", cidrs.Items[0].Name, cidrs.Items[0].Spec.CIDRs)
}
