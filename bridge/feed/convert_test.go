package feed

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestService(t *testing.T) {
	app := "http"
	s := Service(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "u", ResourceVersion: "42",
			Labels: map[string]string{"tier": "front"}},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, ClusterIP: "10.0.0.1", ClusterIPs: []string{"10.0.0.1", "fd00::1"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			Selector:   map[string]string{"app": "web"}, HealthCheckNodePort: 31000,
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, TargetPort: intstr.FromString("web"), NodePort: 30080, AppProtocol: &app},
				{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(5353)},
			},
		},
	})
	if s.GetUid() != "u" || len(s.GetClusterIps()) != 2 || s.GetType() != "NodePort" || s.GetHealthCheckNodePort() != 31000 {
		t.Fatalf("Service = %v", s)
	}
	if got := s.GetSelector().GetMatchLabels()["app"]; got != "web" {
		t.Errorf("selector app = %q; want web", got)
	}
	if len(s.GetNodePorts()) != 1 || s.GetNodePorts()[0].GetPort() != 30080 || s.GetNodePorts()[0].GetProtocol() != "TCP" {
		t.Errorf("node ports = %v; want [30080/TCP]", s.GetNodePorts())
	}
	p0, p1 := s.GetPorts()[0], s.GetPorts()[1]
	if p0.GetTargetPort().GetStrValue() != "web" || p0.GetAppProtocol() != "http" || p0.GetProtocol() != "TCP" {
		t.Errorf("port 0 = %v", p0)
	}
	if p1.GetTargetPort().GetIntValue() != 5353 || p1.GetProtocol() != "UDP" {
		t.Errorf("port 1 = %v", p1)
	}
	if Revision(&metav1.ObjectMeta{ResourceVersion: "42"}) != 42 {
		t.Errorf("Revision(42) != 42")
	}
}

// TestServiceWithoutSelector: an empty selector is none; a headless Service's "None"
// reaches allocd (its Endpoints controller tells "None" from no address), and holds no
// address to adopt.
func TestServiceWithoutSelector(t *testing.T) {
	in := &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: "None", ClusterIPs: []string{"None"},
		Selector: map[string]string{}}}
	headless := Service(in)
	if headless.GetSelector() != nil || !slices.Equal(headless.GetClusterIps(), []string{"None"}) {
		t.Errorf("Service(headless, empty selector) = %v; want no selector, cluster_ips [None]", headless)
	}
	if got := ClusterIPs(in); len(got) != 0 {
		t.Errorf("ClusterIPs(headless) = %q; want none", got)
	}
}

func TestPod(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	ts := metav1.Now()
	p := Pod(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u", ResourceVersion: "7", DeletionTimestamp: &ts},
		Spec: corev1.PodSpec{NodeName: "n", Hostname: "h", Subdomain: "web",
			Containers:     []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: 8080}}}},
			InitContainers: []corev1.Container{{Name: "side", RestartPolicy: &always}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1",
			PodIPs:     []corev1.PodIP{{IP: "10.0.0.1"}, {IP: "fd00::1"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: ts}}},
	})
	if !p.GetReady() || !p.GetDeleting() || p.GetPhase() != "Running" || len(p.GetPodIps()) != 2 || p.GetNodeName() != "n" {
		t.Fatalf("Pod = %v", p)
	}
	if p.GetReadyTransitionTime().AsTime().Unix() != ts.Unix() {
		t.Errorf("ready transition = %v; want %v", p.GetReadyTransitionTime(), ts)
	}
	if c := p.GetContainers()[0].GetPorts()[0]; c.GetContainerPort() != 8080 || c.GetProtocol() != "TCP" {
		t.Errorf("container port = %v", c)
	}
	if p.GetInitContainers()[0].GetRestartPolicy() != "Always" {
		t.Errorf("init container restart policy = %q; want Always", p.GetInitContainers()[0].GetRestartPolicy())
	}
}
