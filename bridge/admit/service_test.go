package admit

import (
	"net/netip"
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Shorthands of the tables.
type (
	fams     = []corev1.IPFamily
	svcPorts = []corev1.ServicePort
)

const (
	nodePortType = corev1.ServiceTypeNodePort
	lbType       = corev1.ServiceTypeLoadBalancer
)

// spec describes a Service of the tests; object builds it as kube-apiserver hands it
// to a webhook: decoded, with the v1 defaults applied (SetDefaults_Service), no UID.
type spec struct {
	ns, name, generateName string
	typ                    corev1.ServiceType
	policy                 corev1.IPFamilyPolicy
	families               []corev1.IPFamily
	ips                    []string // clusterIPs (clusterIP is the first)
	ports                  []corev1.ServicePort
	noLBNodePorts          bool
	local                  bool
	hc                     int32
	externalName           string
}

func tcp(port, nodePort int32) corev1.ServicePort {
	return corev1.ServicePort{Name: "tcp-" + strconv.Itoa(int(port)), Port: port, NodePort: nodePort,
		Protocol: corev1.ProtocolTCP}
}

func udp(port, nodePort int32) corev1.ServicePort {
	return corev1.ServicePort{Name: "udp-" + strconv.Itoa(int(port)), Port: port, NodePort: nodePort,
		Protocol: corev1.ProtocolUDP}
}

func (s spec) object() *corev1.Service {
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: s.name, GenerateName: s.generateName},
		Spec: corev1.ServiceSpec{Type: s.typ, IPFamilies: s.families, Ports: slices.Clone(s.ports),
			Selector: map[string]string{"app": "web"}, ExternalName: s.externalName},
	}
	if svc.Namespace == "" {
		svc.Namespace = "ns"
	}
	if svc.Name == "" && svc.GenerateName == "" {
		svc.Name = "web"
	}
	if s.policy != "" {
		p := s.policy
		svc.Spec.IPFamilyPolicy = &p
	}
	if len(s.ips) > 0 {
		svc.Spec.ClusterIP, svc.Spec.ClusterIPs = s.ips[0], slices.Clone(s.ips)
	}
	if len(svc.Spec.Ports) == 0 && svc.Spec.Type != corev1.ServiceTypeExternalName {
		svc.Spec.Ports = svcPorts{tcp(80, 0)}
	}
	// SetDefaults_Service.
	if svc.Spec.Type == "" {
		svc.Spec.Type = corev1.ServiceTypeClusterIP
	}
	svc.Spec.SessionAffinity = corev1.ServiceAffinityNone
	for i := range svc.Spec.Ports {
		svc.Spec.Ports[i].TargetPort = intstr.FromInt32(svc.Spec.Ports[i].Port)
	}
	switch svc.Spec.Type {
	case nodePortType, lbType:
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
		if s.local {
			svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}
	}
	if svc.Spec.Type != corev1.ServiceTypeExternalName {
		itp := corev1.ServiceInternalTrafficPolicyCluster
		svc.Spec.InternalTrafficPolicy = &itp
	}
	if svc.Spec.Type == lbType {
		alloc := !s.noLBNodePorts
		svc.Spec.AllocateLoadBalancerNodePorts = &alloc
		svc.Spec.HealthCheckNodePort = s.hc
	}
	return svc
}

// stored is svc as kube-apiserver stores it after the create: a UID, and the
// families and policy it defaulted.
func stored(svc *corev1.Service, uid string) *corev1.Service {
	out := svc.DeepCopy()
	out.UID = types.UID(uid)
	if out.Name == "" {
		out.Name = out.GenerateName + "x7k2p"
	}
	if out.Spec.IPFamilyPolicy == nil && out.Spec.Type != corev1.ServiceTypeExternalName {
		single := corev1.IPFamilyPolicySingleStack
		out.Spec.IPFamilyPolicy = &single
	}
	return out
}

// acceptable checks what kube-apiserver's allocation and validation require of a
// Service that arrives with its addresses and ports set (the static path): clusterIP
// is clusterIPs[0]; the addresses are of spec.ipFamilies, in allocd's ranges, as many
// as the policy asks on the cluster fs; every port of a NodePort (or allocating
// LoadBalancer) Service has a node port in the range, ports of one number share theirs;
// a LoadBalancer with externalTrafficPolicy Local has a health check node port.
func acceptable(t *testing.T, fs Families, svc *corev1.Service) {
	t.Helper()
	s := svc.Spec
	if len(s.ClusterIPs) == 0 || s.ClusterIP != s.ClusterIPs[0] {
		t.Errorf("clusterIP %q, clusterIPs %v: want clusterIPs[0] = clusterIP", s.ClusterIP, s.ClusterIPs)
		return
	}
	want := 1
	if p := policyOf(svc); p == corev1.IPFamilyPolicyRequireDualStack ||
		p == corev1.IPFamilyPolicyPreferDualStack && fs.dual() {
		want = 2
	}
	if len(s.ClusterIPs) != want || len(s.IPFamilies) != want {
		t.Errorf("clusterIPs %v, ipFamilies %v under %q: want %d of each", s.ClusterIPs, s.IPFamilies,
			policyOf(svc), want)
	}
	for i, ip := range s.ClusterIPs {
		a, ok := parseIP(ip)
		in := ok && (netip.MustParsePrefix(testCIDR4).Contains(a) ||
			netip.MustParsePrefix(testCIDR6).Contains(a))
		if !in || i < len(s.IPFamilies) && familyOfAddr(a) != s.IPFamilies[i] {
			t.Errorf("clusterIPs[%d] = %q with ipFamilies %v: want an address of its family in the ranges",
				i, ip, s.IPFamilies)
		}
	}
	byNumber := map[int32]int32{}
	for i, p := range s.Ports {
		if p.NodePort == 0 {
			if shouldAllocateNodePorts(svc) {
				t.Errorf("ports[%d] has no node port: want one", i)
			}
			continue
		}
		if p.NodePort < 30000 || p.NodePort > 32767 {
			t.Errorf("ports[%d].nodePort = %d: want 30000-32767", i, p.NodePort)
		}
		if prev, ok := byNumber[p.Port]; ok && prev != p.NodePort {
			t.Logf("ports of number %d have node ports %d and %d (asked for)", p.Port, prev, p.NodePort)
		}
		byNumber[p.Port] = p.NodePort
	}
	if needsHealthCheck(svc) != (s.HealthCheckNodePort != 0) {
		t.Errorf("healthCheckNodePort = %d with type %s, externalTrafficPolicy %s", s.HealthCheckNodePort,
			s.Type, s.ExternalTrafficPolicy)
	}
}

// items lists the ClusterIPs and node ports svc holds, as allocd writes them.
func items(svc *corev1.Service) []string {
	var out []string
	for _, ip := range svc.Spec.ClusterIPs {
		if a, ok := parseIP(ip); ok {
			out = append(out, a.String())
		}
	}
	for _, p := range nodePorts(svc) {
		if s := strconv.Itoa(int(p)); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	if hc := svc.Spec.HealthCheckNodePort; hc != 0 {
		out = append(out, strconv.Itoa(int(hc)))
	}
	slices.Sort(out)
	return out
}
