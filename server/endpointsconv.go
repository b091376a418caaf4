package server

import (
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/allocd/allocd/endpoints"
	"github.com/allocd/allocd/endpoints/kube"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// This file converts between the API's messages and package endpoints' objects (the
// types of package endpoints/kube). The conversions from the feeds' wire form
// (serviceFromProto, podFromProto, nodeFromProto, eventsFromProto) validate as they go,
// adding one violation per bad field to inv (with its path under field), and default
// what the API server defaults (a Service's type ClusterIP, a port's protocol TCP and
// target port = port, a Pod's phase Pending), since the controller's rules rely on
// those defaults. Field paths are built only for a violation, so a valid snapshot of
// 100,000 Pods costs none. The conversions to the wire form (endpointsToProto,
// sliceToProto) serve the reads.

// serviceFromProto converts and validates a Service of the feed. A Service with a
// selector of no labels has none, as the API server stores it.
func serviceFromProto(p *allocdv1.Service, field string, inv *endpoints.InvalidError) *kube.Service {
	s := &kube.Service{
		Namespace:                p.GetNamespace(),
		Name:                     p.GetName(),
		UID:                      p.GetUid(),
		Labels:                   p.GetLabels(),
		Type:                     p.GetType(),
		ClusterIPs:               p.GetClusterIps(),
		IPFamilies:               p.GetIpFamilies(),
		PublishNotReadyAddresses: p.GetPublishNotReadyAddresses(),
		Annotations:              p.GetAnnotations(),
		TrafficDistribution:      p.GetTrafficDistribution(),
	}
	feedMeta(field, s.Namespace, s.Name, s.UID, true, inv)
	feedLabelKeys(field+".labels", s.Labels, inv)
	feedLabelKeys(field+".annotations", s.Annotations, inv)
	switch s.TrafficDistribution {
	case "", kube.TrafficPreferClose, kube.TrafficPreferSameZone, kube.TrafficPreferSameNode:
	default:
		inv.Add(field+".traffic_distribution", strconv.Quote(s.TrafficDistribution)+
			" is not PreferClose, PreferSameZone, PreferSameNode or empty")
	}
	if sel := p.GetSelector().GetMatchLabels(); len(sel) > 0 {
		s.Selector = sel
		feedLabelKeys(field+".selector.match_labels", sel, inv)
	}
	switch s.Type {
	case "":
		s.Type = kube.TypeClusterIP
	case kube.TypeClusterIP, kube.TypeNodePort, kube.TypeLoadBalancer, kube.TypeExternalName:
	default:
		inv.Add(field+".type", strconv.Quote(s.Type)+
			" is not ClusterIP, NodePort, LoadBalancer or ExternalName")
	}
	// cluster_ips are not checked here: a malformed one is a finding of repair
	// (ClusterIPNotValid), which shares this feed. The controller reads it as
	// Kubernetes would: not headless, and not IPv6.
	feedFamilies(field, s.IPFamilies, inv)
	if n := len(p.GetPorts()); n > 0 {
		s.Ports = make([]kube.ServicePort, n)
		for i, pp := range p.GetPorts() {
			s.Ports[i] = feedServicePort(pp, field+".ports["+strconv.Itoa(i)+"]", inv)
		}
	}
	if t := p.GetCreationTime(); t != nil {
		s.CreationTime = feedTimeOrZero(t.AsTime())
	}
	return s
}

// feedServicePort converts and validates a port of a Service, its target port
// defaulted to its port.
func feedServicePort(pp *allocdv1.ServicePortSpec, f string, inv *endpoints.InvalidError) kube.ServicePort {
	sp := kube.ServicePort{
		Name:        pp.GetName(),
		Port:        pp.GetPort(),
		Protocol:    feedProtocol(pp.GetProtocol(), f+".protocol", inv),
		AppProtocol: pp.AppProtocol,
		NodePort:    pp.GetNodePort(),
	}
	feedPortNumber(sp.Port, f+".port", inv)
	if sp.NodePort < 0 || sp.NodePort > 65535 {
		inv.Add(f+".node_port", strconv.Itoa(int(sp.NodePort))+" is not 0 (none) or a port 1-65535")
	}
	switch tp := pp.GetTargetPort(); {
	case tp == nil || tp.GetValue() == nil:
		sp.TargetPort.Number = sp.Port // the API server's default
	case tp.GetStrValue() != "" || feedIsStr(tp):
		if tp.GetStrValue() == "" {
			inv.Add(f+".target_port.str_value", "must not be empty")
		}
		sp.TargetPort.Name = tp.GetStrValue()
	default:
		sp.TargetPort.Number = tp.GetIntValue()
		feedPortNumber(sp.TargetPort.Number, f+".target_port.int_value", inv)
	}
	return sp
}

// feedIsStr reports whether a target port is a name (even an empty one).
func feedIsStr(tp *allocdv1.TargetPort) bool {
	_, ok := tp.GetValue().(*allocdv1.TargetPort_StrValue)
	return ok
}

// podFromProto converts and validates a Pod of the feed; its IPs are made canonical.
func podFromProto(p *allocdv1.Pod, field string, inv *endpoints.InvalidError) *kube.Pod {
	pod := &kube.Pod{
		Namespace:       p.GetNamespace(),
		Name:            p.GetName(),
		UID:             p.GetUid(),
		ResourceVersion: p.GetResourceVersion(),
		Labels:          p.GetLabels(),
		NodeName:        p.GetNodeName(),
		Hostname:        p.GetHostname(),
		Subdomain:       p.GetSubdomain(),
		Phase:           p.GetPhase(),
		Ready:           p.GetReady(),
		Deleting:        p.GetDeleting(),
	}
	feedMeta(field, pod.Namespace, pod.Name, pod.UID, true, inv)
	feedLabelKeys(field+".labels", pod.Labels, inv)
	switch pod.Phase {
	case "":
		pod.Phase = kube.PhasePending
	case kube.PhasePending, kube.PhaseRunning, kube.PhaseSucceeded, kube.PhaseFailed, kube.PhaseUnknown:
	default:
		inv.Add(field+".phase", strconv.Quote(pod.Phase)+
			" is not Pending, Running, Succeeded, Failed or Unknown")
	}
	if ips := p.GetPodIps(); len(ips) > 0 {
		pod.PodIPs = make([]string, len(ips))
		for i, ip := range ips {
			c, ok := kube.CanonicalIP(ip)
			if !ok {
				inv.Add(field+".pod_ips["+strconv.Itoa(i)+"]", strconv.Quote(ip)+" is not an IP address")
			}
			pod.PodIPs[i] = c
		}
	}
	pod.Containers = feedContainers(p.GetContainers(), field+".containers", false, inv)
	pod.InitContainers = feedContainers(p.GetInitContainers(), field+".init_containers", true, inv)
	if t := p.GetReadyTransitionTime(); t != nil {
		pod.ReadyTransitionTime = feedTimeOrZero(t.AsTime())
	}
	return pod
}

// feedContainers converts and validates the containers of a Pod, or its init
// containers (init), which alone may have a restart policy (Always: a sidecar).
func feedContainers(cs []*allocdv1.Container, f string, init bool,
	inv *endpoints.InvalidError) []kube.Container {
	if len(cs) == 0 {
		return nil
	}
	out := make([]kube.Container, len(cs))
	for i, c := range cs {
		ct := kube.Container{Name: c.GetName(), RestartPolicy: c.GetRestartPolicy()}
		switch ct.RestartPolicy {
		case "":
		case kube.RestartPolicyAlways:
			if !init {
				inv.Add(f+"["+strconv.Itoa(i)+"].restart_policy",
					"only init containers have a restart policy")
			}
		default:
			inv.Add(f+"["+strconv.Itoa(i)+"].restart_policy",
				strconv.Quote(ct.RestartPolicy)+" is not \"\" or \"Always\"")
		}
		if n := len(c.GetPorts()); n > 0 {
			ct.Ports = make([]kube.ContainerPort, n)
			for j, cp := range c.GetPorts() {
				pf := f + "[" + strconv.Itoa(i) + "].ports[" + strconv.Itoa(j) + "]"
				ct.Ports[j] = kube.ContainerPort{Name: cp.GetName(), ContainerPort: cp.GetContainerPort(),
					Protocol: feedProtocol(cp.GetProtocol(), pf+".protocol", inv)}
				feedPortNumber(cp.GetContainerPort(), pf+".container_port", inv)
			}
		}
		out[i] = ct
	}
	return out
}

// feedMeta checks the identity of an object: a namespace and a name that can be part
// of a key, and a uid when needed.
func feedMeta(field, ns, name, uid string, needUID bool, inv *endpoints.InvalidError) {
	if ns == "" || strings.Contains(ns, "/") {
		inv.Add(field+".namespace", "must be a non-empty name without '/'")
	}
	if name == "" || strings.Contains(name, "/") {
		inv.Add(field+".name", "must be a non-empty name without '/'")
	}
	if needUID && uid == "" {
		inv.Add(field+".uid", "must not be empty")
	}
}

// feedLabelKeys refuses an empty label (or annotation) key.
func feedLabelKeys(field string, labels map[string]string, inv *endpoints.InvalidError) {
	for k := range labels {
		if k == "" {
			inv.Add(field, "a label key must not be empty")
		}
	}
}

// feedFamilies checks a Service's IP families: IPv4 or IPv6, at most one of each.
func feedFamilies(field string, fs []string, inv *endpoints.InvalidError) {
	if len(fs) > 2 {
		inv.Add(field+".ip_families", "at most two families (one per family)")
	}
	for i, f := range fs {
		switch {
		case f != kube.FamilyIPv4 && f != kube.FamilyIPv6:
			inv.Add(field+".ip_families["+strconv.Itoa(i)+"]", strconv.Quote(f)+" is not IPv4 or IPv6")
		case i == 1 && fs[0] == f:
			inv.Add(field+".ip_families[1]", "the same family twice")
		}
	}
}

// feedProtocol defaults "" to TCP and refuses anything but TCP, UDP and SCTP.
func feedProtocol(p, field string, inv *endpoints.InvalidError) string {
	switch p {
	case "":
		return kube.ProtocolTCP
	case kube.ProtocolTCP, kube.ProtocolUDP, kube.ProtocolSCTP:
		return p
	}
	inv.Add(field, strconv.Quote(p)+" is not TCP, UDP or SCTP")
	return p
}

// feedPortNumber refuses a port number outside 1-65535.
func feedPortNumber(n int32, field string, inv *endpoints.InvalidError) {
	if n < 1 || n > 65535 {
		inv.Add(field, strconv.Itoa(int(n))+" is not a port number 1-65535")
	}
}

// eventsFromProto converts and validates the events of one PushEvents message. An
// event takes the message's revision unless it has its own, which must not be above
// the message's. A delete needs only the namespace and name of its object.
func eventsFromProto(req *allocdv1.PushEventsRequest) ([]endpoints.Event, error) {
	inv := &endpoints.InvalidError{}
	rev := req.GetRevision()
	if rev <= 0 {
		inv.Add("revision", "must be positive (the revision of the caller's store after these events)")
	}
	evs := make([]endpoints.Event, 0, len(req.GetEvents()))
	for i, pe := range req.GetEvents() {
		f := "events[" + strconv.Itoa(i) + "]"
		ev := endpoints.Event{Revision: pe.GetRevision()}
		switch {
		case ev.Revision == 0:
			ev.Revision = rev
		case ev.Revision < 0 || ev.Revision > rev:
			inv.Add(f+".revision",
				"must be 0 (the message's) or positive and not above the message's revision")
		}
		switch pe.GetType() {
		case allocdv1.EventType_EVENT_TYPE_UPSERT:
			ev.Type = endpoints.Upsert
		case allocdv1.EventType_EVENT_TYPE_DELETE:
			ev.Type = endpoints.Delete
		default:
			inv.Add(f+".type", "must be EVENT_TYPE_UPSERT or EVENT_TYPE_DELETE")
		}
		switch o := pe.GetObject().(type) {
		case *allocdv1.Event_Service:
			if ev.Type == endpoints.Delete {
				ev.Service = &kube.Service{Namespace: o.Service.GetNamespace(), Name: o.Service.GetName(),
					UID: o.Service.GetUid()}
				feedMeta(f+".service", ev.Service.Namespace, ev.Service.Name, "", false, inv)
			} else {
				ev.Service = serviceFromProto(o.Service, f+".service", inv)
			}
		case *allocdv1.Event_Pod:
			if ev.Type == endpoints.Delete {
				ev.Pod = &kube.Pod{Namespace: o.Pod.GetNamespace(), Name: o.Pod.GetName(),
					UID: o.Pod.GetUid()}
				feedMeta(f+".pod", ev.Pod.Namespace, ev.Pod.Name, "", false, inv)
			} else {
				ev.Pod = podFromProto(o.Pod, f+".pod", inv)
			}
		case *allocdv1.Event_Node:
			if ev.Type == endpoints.Delete {
				ev.Node = &kube.Node{Name: o.Node.GetName()}
				feedNodeName(f+".node.name", ev.Node.Name, inv)
			} else {
				ev.Node = nodeFromProto(o.Node, f+".node", inv)
			}
		default:
			inv.Add(f, "must carry a service, a pod or a node")
		}
		evs = append(evs, ev)
	}
	if err := inv.OrNil(); err != nil {
		return nil, err
	}
	return evs, nil
}

// feedTimeOrZero is t, or zero for the zero Unix time a careless feed may send.
func feedTimeOrZero(t time.Time) time.Time {
	if t.Unix() == 0 {
		return time.Time{}
	}
	return t
}

// endpointsToProto converts e to its wire form (the stored form plus the revisions).
func endpointsToProto(e *kube.Endpoints) *allocdv1.ServiceEndpoints {
	p := &allocdv1.ServiceEndpoints{
		Namespace:      e.Namespace,
		Name:           e.Name,
		Labels:         e.Labels,
		Annotations:    e.Annotations,
		Revision:       e.Revision,
		CreateRevision: e.CreateRevision,
		ServiceUid:     e.ServiceUID,
		ManagedBy:      e.ManagedBy,
		AddressCount:   int64(e.AddressCount),
	}
	if len(e.Subsets) > 0 {
		p.Subsets = make([]*allocdv1.ServiceEndpointSubset, len(e.Subsets))
		for i, s := range e.Subsets {
			ps := &allocdv1.ServiceEndpointSubset{
				Addresses:         addressesToProto(s.Addresses),
				NotReadyAddresses: addressesToProto(s.NotReadyAddresses),
			}
			if len(s.Ports) > 0 {
				ps.Ports = make([]*allocdv1.EndpointPort, len(s.Ports))
				for j, pt := range s.Ports {
					ps.Ports[j] = &allocdv1.EndpointPort{Name: pt.Name, Port: pt.Port, Protocol: pt.Protocol,
						AppProtocol: pt.AppProtocol}
				}
			}
			p.Subsets[i] = ps
		}
	}
	return p
}

// addressesToProto converts the addresses of a subset.
func addressesToProto(as []kube.Address) []*allocdv1.EndpointAddress {
	if len(as) == 0 {
		return nil
	}
	out := make([]*allocdv1.EndpointAddress, len(as))
	for i, a := range as {
		pa := &allocdv1.EndpointAddress{Ip: a.IP, Hostname: a.Hostname, NodeName: a.NodeName}
		if r := a.TargetRef; r != nil {
			pa.TargetRef = refToProto(r)
		}
		out[i] = pa
	}
	return out
}

// nodeFromProto converts and validates a Node of the feed.
func nodeFromProto(p *allocdv1.Node, field string, inv *endpoints.InvalidError) *kube.Node {
	n := &kube.Node{
		Name:                 p.GetName(),
		ResourceVersion:      p.GetResourceVersion(),
		Labels:               p.GetLabels(),
		Ready:                p.GetReady(),
		AllocatableCPUMillis: p.GetAllocatableCpuMillis(),
	}
	feedNodeName(field+".name", n.Name, inv)
	feedLabelKeys(field+".labels", n.Labels, inv)
	if n.AllocatableCPUMillis < 0 {
		inv.Add(field+".allocatable_cpu_millis", strconv.FormatInt(n.AllocatableCPUMillis, 10)+" is negative")
	}
	return n
}

// feedNodeName checks a Node's name: not empty, without '/'.
func feedNodeName(field, name string, inv *endpoints.InvalidError) {
	if name == "" || strings.Contains(name, "/") {
		inv.Add(field, "must be a non-empty name without '/'")
	}
}

// sliceToProto is the API form of a stored slice.
func sliceToProto(s *kube.EndpointSlice) *allocdv1.EndpointSlice {
	p := &allocdv1.EndpointSlice{
		Namespace:      s.Namespace,
		Name:           s.Name,
		Labels:         s.Labels,
		Annotations:    s.Annotations,
		AddressType:    s.AddressType,
		ServiceUid:     s.ServiceUID,
		Revision:       s.Revision,
		CreateRevision: s.CreateRevision,
		Endpoints:      make([]*allocdv1.SliceEndpoint, len(s.Endpoints)),
		Ports:          make([]*allocdv1.EndpointSlicePort, len(s.Ports)),
	}
	for i := range s.Endpoints {
		p.Endpoints[i] = sliceEndpointToProto(&s.Endpoints[i])
	}
	for i, pt := range s.Ports {
		p.Ports[i] = &allocdv1.EndpointSlicePort{Name: proto.String(pt.Name), Port: proto.Int32(pt.Port),
			Protocol: proto.String(pt.Protocol), AppProtocol: pt.AppProtocol}
	}
	return p
}

// sliceEndpointToProto is the API form of one endpoint of a slice: its conditions
// always, its optional strings when not empty.
func sliceEndpointToProto(e *kube.SliceEndpoint) *allocdv1.SliceEndpoint {
	cond := &allocdv1.EndpointConditions{Ready: e.Ready, Serving: e.Serving, Terminating: e.Terminating}
	p := &allocdv1.SliceEndpoint{
		Addresses:  e.Addresses,
		Conditions: cond,
		Hostname:   optional(e.Hostname),
		NodeName:   optional(e.NodeName),
		Zone:       optional(e.Zone),
	}
	if r := e.TargetRef; r != nil {
		p.TargetRef = refToProto(r)
	}
	if h := e.Hints; h != nil {
		p.Hints = &allocdv1.EndpointHints{}
		for _, z := range h.ForZones {
			p.Hints.ForZones = append(p.Hints.ForZones, &allocdv1.ForZone{Name: z})
		}
		for _, n := range h.ForNodes {
			p.Hints.ForNodes = append(p.Hints.ForNodes, &allocdv1.ForNode{Name: n})
		}
	}
	return p
}

// refToProto is the API form of an object reference.
func refToProto(r *kube.ObjectRef) *allocdv1.ObjectReference {
	return &allocdv1.ObjectReference{Kind: r.Kind, Namespace: r.Namespace, Name: r.Name, Uid: r.UID}
}

// optional is s as an optional string field: absent when empty.
func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
