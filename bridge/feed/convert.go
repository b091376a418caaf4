package feed

import (
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"google.golang.org/protobuf/types/known/timestamppb"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// Revision is an object's resourceVersion as the etcd revision it is (0 when it is not
// a number: the API server of a cluster backed by etcd always gives one).
func Revision(obj metav1.Object) int64 {
	rv, err := strconv.ParseInt(obj.GetResourceVersion(), 10, 64)
	if err != nil {
		return 0
	}
	return rv
}

// Dropped is told of a value of a cluster's object that allocd refuses (a value it does
// not know: a newer API server's) and that the conversion left out, as upstream's
// controllers ignore it: the kind, the object's namespace/name, the field and the value.
// One such value must not make allocd refuse the object's whole event batch or
// snapshot.
type Dropped func(kind, object, field, value string)

func (d Dropped) tell(kind string, obj metav1.Object, field, value string) {
	if d != nil {
		d(kind, obj.GetNamespace()+"/"+obj.GetName(), field, value)
	}
}

// Service converts a Kubernetes Service into the feed's message: what repair and
// allocd's Endpoints controller read of it.
func Service(s *corev1.Service) *allocdv1.Service { return convertService(s, nil) }

// trafficDistributions are the spec.trafficDistribution values allocd knows; upstream's
// EndpointSlice controller ignores any other.
var trafficDistributions = []string{corev1.ServiceTrafficDistributionPreferClose,
	corev1.ServiceTrafficDistributionPreferSameZone, corev1.ServiceTrafficDistributionPreferSameNode}

func convertService(s *corev1.Service, dropped Dropped) *allocdv1.Service {
	out := &allocdv1.Service{
		Namespace:                s.Namespace,
		Name:                     s.Name,
		Uid:                      string(s.UID),
		ClusterIps:               specClusterIPs(s),
		HealthCheckNodePort:      s.Spec.HealthCheckNodePort,
		Labels:                   s.Labels,
		Type:                     string(s.Spec.Type),
		PublishNotReadyAddresses: s.Spec.PublishNotReadyAddresses,
		Annotations:              s.Annotations,
	}
	if td := s.Spec.TrafficDistribution; td != nil && slices.Contains(trafficDistributions, *td) {
		out.TrafficDistribution = *td
	} else if td != nil && *td != "" {
		dropped.tell("services", s, "spec.trafficDistribution", *td)
	}
	for _, f := range s.Spec.IPFamilies {
		out.IpFamilies = append(out.IpFamilies, string(f))
	}
	if len(s.Spec.Selector) > 0 {
		out.Selector = &allocdv1.Selector{MatchLabels: s.Spec.Selector}
	}
	if !s.CreationTimestamp.IsZero() {
		out.CreationTime = timestamppb.New(s.CreationTimestamp.Time)
	}
	for _, p := range s.Spec.Ports {
		out.Ports = append(out.Ports, servicePort(p))
		if p.NodePort != 0 {
			out.NodePorts = append(out.NodePorts, &allocdv1.ServicePort{Port: p.NodePort, Protocol: protocol(p.Protocol)})
		}
	}
	return out
}

// ClusterIPs is the addresses a Service holds: spec.clusterIPs, or spec.clusterIP for a
// Service written before dual-stack; without "None" (a headless Service has no
// address).
func ClusterIPs(s *corev1.Service) []string {
	var out []string
	for _, ip := range specClusterIPs(s) {
		if ip != corev1.ClusterIPNone {
			out = append(out, ip)
		}
	}
	return out
}

// specClusterIPs is spec.clusterIPs as written, "None" included, or spec.clusterIP for a
// Service written before dual-stack. The feed carries "None": allocd's Endpoints
// controller, as kube-controller-manager's, gives a headless Service without ports the
// port-less subset of its Pods' addresses only when its clusterIP is "None" (not "",
// which an ExternalName Service has); repair skips it as headless.
func specClusterIPs(s *corev1.Service) []string {
	ips := s.Spec.ClusterIPs
	if len(ips) == 0 && s.Spec.ClusterIP != "" {
		ips = []string{s.Spec.ClusterIP}
	}
	var out []string
	for _, ip := range ips {
		if ip != "" {
			out = append(out, ip)
		}
	}
	return out
}

func servicePort(p corev1.ServicePort) *allocdv1.ServicePortSpec {
	out := &allocdv1.ServicePortSpec{Name: p.Name, Port: p.Port, Protocol: protocol(p.Protocol),
		AppProtocol: p.AppProtocol, NodePort: p.NodePort}
	switch {
	case p.TargetPort.Type == intstr.String:
		out.TargetPort = &allocdv1.TargetPort{Value: &allocdv1.TargetPort_StrValue{StrValue: p.TargetPort.StrVal}}
	case p.TargetPort.IntVal != 0:
		out.TargetPort = &allocdv1.TargetPort{Value: &allocdv1.TargetPort_IntValue{IntValue: p.TargetPort.IntVal}}
	}
	return out
}

func protocol(p corev1.Protocol) string {
	if p == "" {
		return string(corev1.ProtocolTCP)
	}
	return string(p)
}

// Pod converts a Kubernetes Pod into the feed's message.
func Pod(p *corev1.Pod) *allocdv1.Pod { return convertPod(p, nil) }

// podPhases are the phases allocd knows.
var podPhases = []corev1.PodPhase{corev1.PodPending, corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed,
	corev1.PodUnknown}

func convertPod(p *corev1.Pod, dropped Dropped) *allocdv1.Pod {
	out := &allocdv1.Pod{
		Namespace:       p.Namespace,
		Name:            p.Name,
		Uid:             string(p.UID),
		ResourceVersion: p.ResourceVersion,
		Labels:          p.Labels,
		NodeName:        p.Spec.NodeName,
		Hostname:        p.Spec.Hostname,
		Subdomain:       p.Spec.Subdomain,
		Phase:           string(p.Status.Phase), // checked below
		Deleting:        p.DeletionTimestamp != nil,
	}
	if ph := p.Status.Phase; ph != "" && !slices.Contains(podPhases, ph) {
		// Neither Succeeded nor Failed: to upstream's controllers, a live Pod.
		dropped.tell("pods", p, "status.phase", string(ph))
		out.Phase = string(corev1.PodUnknown)
	}
	for _, ip := range p.Status.PodIPs {
		out.PodIps = append(out.PodIps, ip.IP)
	}
	if len(out.PodIps) == 0 && p.Status.PodIP != "" {
		out.PodIps = []string{p.Status.PodIP}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			out.Ready = c.Status == corev1.ConditionTrue
			if !c.LastTransitionTime.IsZero() {
				out.ReadyTransitionTime = timestamppb.New(c.LastTransitionTime.Time)
			}
		}
	}
	for _, c := range p.Spec.Containers {
		out.Containers = append(out.Containers, container(c))
	}
	for _, c := range p.Spec.InitContainers {
		ic := container(c)
		switch {
		case c.RestartPolicy == nil:
		case *c.RestartPolicy == corev1.ContainerRestartPolicyAlways:
			ic.RestartPolicy = string(*c.RestartPolicy) // a sidecar: its ports count
		default:
			// allocd knows "" and Always; any other is no sidecar, as upstream reads it.
			dropped.tell("pods", p, "spec.initContainers["+c.Name+"].restartPolicy",
				string(*c.RestartPolicy))
		}
		out.InitContainers = append(out.InitContainers, ic)
	}
	return out
}

func container(c corev1.Container) *allocdv1.Container {
	out := &allocdv1.Container{Name: c.Name}
	for _, p := range c.Ports {
		out.Ports = append(out.Ports, &allocdv1.ContainerPort{Name: p.Name, ContainerPort: p.ContainerPort,
			Protocol: protocol(p.Protocol)})
	}
	return out
}

// Node converts a Kubernetes Node into the feed's message: its zone (labels), whether
// it is Ready, and its allocatable CPU (topology hints).
func Node(n *corev1.Node) *allocdv1.Node {
	out := &allocdv1.Node{Name: n.Name, ResourceVersion: n.ResourceVersion, Labels: n.Labels}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			out.Ready = c.Status == corev1.ConditionTrue
		}
	}
	if cpu, ok := n.Status.Allocatable[corev1.ResourceCPU]; ok {
		out.AllocatableCpuMillis = cpu.MilliValue()
	}
	return out
}
