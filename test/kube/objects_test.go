package kube

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// readyTime is the Ready condition's lastTransitionTime of every Pod the test makes
// ready, the same in both clusters.
var readyTime = metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))

const testNS = "e2e"

func mustCreateNamespace(t testing.TB, cs kubernetes.Interface, name string) {
	t.Helper()
	_, err := cs.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", name, err)
	}
}

// node makes a Ready Node in zone, as a kubelet would register it.
func createNode(ctx context.Context, cs kubernetes.Interface, name, zone string) error {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"kubernetes.io/hostname": name, corev1.LabelTopologyZone: zone}}}
	created, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	created.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		LastHeartbeatTime: readyTime, LastTransitionTime: readyTime, Reason: "KubeletReady"}}
	created.Status.Allocatable = corev1.ResourceList{}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node %s status: %w", name, err)
	}
	return nil
}

// setNodeZone moves a Node to another zone.
func setNodeZone(ctx context.Context, cs kubernetes.Interface, name, zone string) error {
	n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	n.Labels[corev1.LabelTopologyZone] = zone
	_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	return err
}

// svcSpec describes a test Service.
type svcSpec struct {
	name      string
	app       string // selector app=...
	dualStack bool
	headless  bool
	noPorts   bool // no spec.ports (a headless Service may have none)
	nodePort  bool
	labels    map[string]string
}

func (s svcSpec) object() *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: s.name, Labels: s.labels},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": s.app},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP},
				{Name: "metrics", Port: 9090, TargetPort: intstr.FromInt32(9090), Protocol: corev1.ProtocolTCP},
			},
		},
	}
	if s.dualStack {
		p := corev1.IPFamilyPolicyRequireDualStack
		svc.Spec.IPFamilyPolicy = &p
	}
	if s.headless {
		svc.Spec.ClusterIP = corev1.ClusterIPNone
	}
	if s.noPorts {
		svc.Spec.Ports = nil
	}
	if s.nodePort {
		svc.Spec.Type = corev1.ServiceTypeNodePort
	}
	return svc
}

// podSpec describes a test Pod; ip4 and ip6 are its addresses (ip6 empty: single-stack).
type podSpec struct {
	name, app, node string
	ip4, ip6        string
	ready           bool
}

func (p podSpec) object() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: p.name, Labels: map[string]string{"app": p.app}},
		Spec: corev1.PodSpec{
			NodeName: p.node,
			Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1",
				Ports: []corev1.ContainerPort{
					{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
					{Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP},
				}}},
		},
	}
}

// status is the Pod status a kubelet would report.
func (p podSpec) status() corev1.PodStatus {
	st := corev1.PodStatus{Phase: corev1.PodRunning, PodIP: p.ip4, PodIPs: []corev1.PodIP{{IP: p.ip4}}}
	if p.ip6 != "" {
		st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: p.ip6})
	}
	ready := corev1.ConditionFalse
	if p.ready {
		ready = corev1.ConditionTrue
	}
	st.Conditions = []corev1.PodCondition{
		{Type: corev1.PodReady, Status: ready, LastTransitionTime: readyTime},
		{Type: corev1.ContainersReady, Status: ready, LastTransitionTime: readyTime},
	}
	return st
}

// createPod creates the Pod and reports its status through the status subresource.
func createPod(ctx context.Context, cs kubernetes.Interface, p podSpec) error {
	created, err := cs.CoreV1().Pods(testNS).Create(ctx, p.object(), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s: %w", p.name, err)
	}
	created.Status = p.status()
	if _, err := cs.CoreV1().Pods(testNS).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("pod %s status: %w", p.name, err)
	}
	return nil
}

// setReady flips a Pod's Ready condition at time at.
func setReady(ctx context.Context, cs kubernetes.Interface, name string, ready bool, at metav1.Time) error {
	pod, err := cs.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	for i := range pod.Status.Conditions {
		if c := &pod.Status.Conditions[i]; c.Type == corev1.PodReady || c.Type == corev1.ContainersReady {
			c.Status, c.LastTransitionTime = st, at
		}
	}
	_, err = cs.CoreV1().Pods(testNS).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	return err
}

// deletePod deletes a Pod; with grace it is left terminating (no kubelet finishes the
// deletion), as a Pod shutting down is.
func deletePod(ctx context.Context, cs kubernetes.Interface, name string, grace bool) error {
	var secs int64
	if grace {
		secs = 3600
	}
	return cs.CoreV1().Pods(testNS).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &secs})
}

// podIP4 and podIP6 are the test Pods' addresses, by index.
func podIP4(i int) string { return fmt.Sprintf("10.244.%d.%d", i/250, i%250+1) }
func podIP6(i int) string { return fmt.Sprintf("fd00:244::%x", i+1) }
