package kube

import "time"

// Service types, as Kubernetes spells them.
const (
	// TypeClusterIP is a Service reached on its cluster IP, inside the cluster.
	TypeClusterIP = "ClusterIP"
	// TypeNodePort is a ClusterIP Service also reached on a port of every node.
	TypeNodePort = "NodePort"
	// TypeLoadBalancer is a NodePort Service also reached through a load balancer.
	TypeLoadBalancer = "LoadBalancer"
	// TypeExternalName is a DNS name for another name: it has no endpoints.
	TypeExternalName = "ExternalName"
)

// Protocols and IP families, as Kubernetes spells them.
const (
	// ProtocolTCP is the TCP protocol of a port.
	ProtocolTCP = "TCP"
	// ProtocolUDP is the UDP protocol of a port.
	ProtocolUDP = "UDP"
	// ProtocolSCTP is the SCTP protocol of a port.
	ProtocolSCTP = "SCTP"

	// FamilyIPv4 is the IPv4 family.
	FamilyIPv4 = "IPv4"
	// FamilyIPv6 is the IPv6 family.
	FamilyIPv6 = "IPv6"
)

// The values of a Service's spec.trafficDistribution (every one of v1.37:
// PreferSameZone and PreferSameNode are GA since v1.35).
const (
	// TrafficPreferClose asks for endpoints of the client's zone (hints for its zone).
	TrafficPreferClose = "PreferClose"
	// TrafficPreferSameZone is PreferClose under its newer name.
	TrafficPreferSameZone = "PreferSameZone"
	// TrafficPreferSameNode asks for endpoints of the client's node, then of its zone.
	TrafficPreferSameNode = "PreferSameNode"
)

// Service is what the controllers need of a Kubernetes Service.
type Service struct {
	Namespace, Name, UID string
	Labels               map[string]string
	Type                 string
	// ClusterIPs are spec.clusterIPs; ClusterIP() is the first, "" when none.
	ClusterIPs []string
	IPFamilies []string
	// Selector is nil when the Service has none (an empty selector is none too).
	Selector                 map[string]string
	PublishNotReadyAddresses bool
	Ports                    []ServicePort
	// CreationTime is metadata.creationTimestamp, zero when unknown.
	CreationTime time.Time
	// Annotations carry the topology-mode annotation (EndpointSlice controller).
	Annotations map[string]string
	// TrafficDistribution is spec.trafficDistribution ("" when unset).
	TrafficDistribution string
}

// ClusterIP returns spec.clusterIP: the first of ClusterIPs, "" when there is none.
func (s *Service) ClusterIP() string {
	if len(s.ClusterIPs) == 0 {
		return ""
	}
	return s.ClusterIPs[0]
}

// Headless reports whether the Service has no cluster IP ("" or "None").
func (s *Service) Headless() bool {
	ip := s.ClusterIP()
	return ip == "" || ip == "None"
}

// Key returns "namespace/name".
func (s *Service) Key() string { return s.Namespace + "/" + s.Name }

// ServicePort is one port of a Service.
type ServicePort struct {
	Name       string
	Port       int32
	TargetPort TargetPort
	Protocol   string
	// AppProtocol is nil when unset.
	AppProtocol *string
	NodePort    int32
}

// TargetPort is an int-or-string: Name when it is a name, else Number.
type TargetPort struct {
	Number int32
	Name   string
}
