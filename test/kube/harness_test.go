package kube

import (
	"context"
	"crypto/x509/pkix"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
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

// TestBridge runs allocd and the bridge for one cluster with no kube-controller-manager
// at all: the Endpoints in the cluster can only come from allocd.
func TestBridge(t *testing.T) {
	e := etcdtest.New(t)
	c := startCluster(t, clusterConfig{name: "alone", etcd: e.Endpoint, reconciler: "none", advertise: advertise})
	side := startAllocd(t, e.Endpoint, 1, "--kubernetes-service-port=443")
	applyBridgeRBAC(t, c.Admin, "bridge-user")
	side.startBridge(t, c, c.pki.kubeconfig(t, "bridge", c.URL, pkix.Name{CommonName: "bridge-user"}))
	ctx := context.Background()
	mustCreateNamespace(t, c.Admin, testNS)
	if err := createNode(ctx, c.Admin, "node-0", "zone-a"); err != nil {
		t.Fatal(err)
	}
	for _, s := range []svcSpec{{name: "web", app: "web", labels: map[string]string{"tier": "front"}}, {name: "head", app: "web", headless: true}} {
		if _, err := c.Admin.CoreV1().Services(testNS).Create(ctx, s.object(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		if err := createPod(ctx, c.Admin, podSpec{name: fmt.Sprintf("web-%d", i), app: "web", node: "node-0", ip4: podIP4(i),
			ready: i < 3}); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string][2]int{"web": {3, 2}, "head": {3, 2}}
	var got map[string]normEndpoints
	etcdtest.WaitFor(t, convergeLimit, "Endpoints written by the bridge", func() bool {
		var err error
		got, err = listEndpoints(ctx, c.Admin, testNS)
		return err == nil && countsAre(got, want)
	})
	webEP, err := c.Admin.CoreV1().Endpoints(testNS).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	web := webEP.ObjectMeta
	if web.Labels["tier"] != "front" || web.Labels["endpoints.kubernetes.io/managed-by"] != "endpoint-controller" ||
		web.Annotations[corev1.EndpointsLastChangeTriggerTime] == "" {
		t.Errorf("web Endpoints labels %v annotations %v; want the Service's labels, managed-by endpoint-controller, a trigger time",
			web.Labels, web.Annotations)
	}
	if _, ok := got["head"].Labels[corev1.IsHeadlessService]; !ok {
		t.Errorf("head Endpoints = %s; want the headless label", js(got["head"]))
	}
}
