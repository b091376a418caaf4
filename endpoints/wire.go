package endpoints

import (
	"strconv"
	"strings"
	"time"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// The conversions from the feeds' wire form validate as they go, adding one violation
// per bad field to inv (with its path under field), and default what the API server
// defaults (a Service's type ClusterIP, a port's protocol TCP and target port = port,
// a Pod's phase Pending), since the controller's rules rely on those defaults. Field
// paths are built only for a violation, so a valid 100k-Pod snapshot costs none.

// ServiceFromProto converts and validates a Service of the feed. A Service with a
// selector of no labels has none, as the API server stores it.
func ServiceFromProto(p *allocdv1.Service, field string, inv *InvalidError) *Service {
	s := &Service{
		Namespace:                p.GetNamespace(),
		Name:                     p.GetName(),
		UID:                      p.GetUid(),
		Labels:                   p.GetLabels(),
		Type:                     p.GetType(),
		ClusterIPs:               p.GetClusterIps(),
		IPFamilies:               p.GetIpFamilies(),
		PublishNotReadyAddresses: p.GetPublishNotReadyAddresses(),
	}
	meta(field, s.Namespace, s.Name, s.UID, true, inv)
	labelKeys(field+".labels", s.Labels, inv)
	if sel := p.GetSelector().GetMatchLabels(); len(sel) > 0 {
		s.Selector = sel
		labelKeys(field+".selector.match_labels", sel, inv)
	}
	switch s.Type {
	case "":
		s.Type = TypeClusterIP
	case TypeClusterIP, TypeNodePort, TypeLoadBalancer, TypeExternalName:
	default:
		inv.Add(field+".type", strconv.Quote(s.Type)+" is not ClusterIP, NodePort, LoadBalancer or ExternalName")
	}
	// cluster_ips are not checked here: a malformed one is a finding of repair
	// (ClusterIPNotValid), which shares this feed. The controller reads it as
	// Kubernetes would: not headless, and not IPv6.
	families(field, s.IPFamilies, inv)
	if n := len(p.GetPorts()); n > 0 {
		s.Ports = make([]ServicePort, n)
		for i, pp := range p.GetPorts() {
			s.Ports[i] = servicePort(pp, field+".ports["+strconv.Itoa(i)+"]", inv)
		}
	}
	if t := p.GetCreationTime(); t != nil {
		s.CreationTime = timeOrZero(t.AsTime())
	}
	return s
}

func servicePort(pp *allocdv1.ServicePortSpec, f string, inv *InvalidError) ServicePort {
	sp := ServicePort{
		Name:        pp.GetName(),
		Port:        pp.GetPort(),
		Protocol:    protocol(pp.GetProtocol(), f+".protocol", inv),
		AppProtocol: pp.AppProtocol,
		NodePort:    pp.GetNodePort(),
	}
	portNumber(sp.Port, f+".port", inv)
	if sp.NodePort < 0 || sp.NodePort > 65535 {
		inv.Add(f+".node_port", strconv.Itoa(int(sp.NodePort))+" is not 0 (none) or a port 1-65535")
	}
	switch tp := pp.GetTargetPort(); {
	case tp == nil || tp.GetValue() == nil:
		sp.TargetPort.Number = sp.Port // the API server's default
	case tp.GetStrValue() != "" || isStr(tp):
		if tp.GetStrValue() == "" {
			inv.Add(f+".target_port.str_value", "must not be empty")
		}
		sp.TargetPort.Name = tp.GetStrValue()
	default:
		sp.TargetPort.Number = tp.GetIntValue()
		portNumber(sp.TargetPort.Number, f+".target_port.int_value", inv)
	}
	return sp
}

func isStr(tp *allocdv1.TargetPort) bool {
	_, ok := tp.GetValue().(*allocdv1.TargetPort_StrValue)
	return ok
}

// PodFromProto converts and validates a Pod of the feed.
func PodFromProto(p *allocdv1.Pod, field string, inv *InvalidError) *Pod {
	pod := &Pod{
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
	meta(field, pod.Namespace, pod.Name, pod.UID, true, inv)
	labelKeys(field+".labels", pod.Labels, inv)
	switch pod.Phase {
	case "":
		pod.Phase = PhasePending
	case PhasePending, PhaseRunning, PhaseSucceeded, PhaseFailed, PhaseUnknown:
	default:
		inv.Add(field+".phase", strconv.Quote(pod.Phase)+" is not Pending, Running, Succeeded, Failed or Unknown")
	}
	if ips := p.GetPodIps(); len(ips) > 0 {
		pod.PodIPs = make([]string, len(ips))
		for i, ip := range ips {
			c, ok := CanonicalIP(ip)
			if !ok {
				inv.Add(field+".pod_ips["+strconv.Itoa(i)+"]", strconv.Quote(ip)+" is not an IP address")
			}
			pod.PodIPs[i] = c
		}
	}
	pod.Containers = containers(p.GetContainers(), field+".containers", false, inv)
	pod.InitContainers = containers(p.GetInitContainers(), field+".init_containers", true, inv)
	if t := p.GetReadyTransitionTime(); t != nil {
		pod.ReadyTransitionTime = timeOrZero(t.AsTime())
	}
	return pod
}

func containers(cs []*allocdv1.Container, f string, init bool, inv *InvalidError) []Container {
	if len(cs) == 0 {
		return nil
	}
	out := make([]Container, len(cs))
	for i, c := range cs {
		ct := Container{Name: c.GetName(), RestartPolicy: c.GetRestartPolicy()}
		switch ct.RestartPolicy {
		case "":
		case RestartPolicyAlways:
			if !init {
				inv.Add(f+"["+strconv.Itoa(i)+"].restart_policy", "only init containers have a restart policy")
			}
		default:
			inv.Add(f+"["+strconv.Itoa(i)+"].restart_policy", strconv.Quote(ct.RestartPolicy)+" is not \"\" or \"Always\"")
		}
		if n := len(c.GetPorts()); n > 0 {
			ct.Ports = make([]ContainerPort, n)
			for j, cp := range c.GetPorts() {
				pf := f + "[" + strconv.Itoa(i) + "].ports[" + strconv.Itoa(j) + "]"
				ct.Ports[j] = ContainerPort{Name: cp.GetName(), ContainerPort: cp.GetContainerPort(),
					Protocol: protocol(cp.GetProtocol(), pf+".protocol", inv)}
				portNumber(cp.GetContainerPort(), pf+".container_port", inv)
			}
		}
		out[i] = ct
	}
	return out
}

// meta checks the identity of an object: a namespace and a name that can be part of a
// key, and a uid when needed.
func meta(field, ns, name, uid string, needUID bool, inv *InvalidError) {
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

func labelKeys(field string, labels map[string]string, inv *InvalidError) {
	for k := range labels {
		if k == "" {
			inv.Add(field, "a label key must not be empty")
		}
	}
}

func families(field string, fs []string, inv *InvalidError) {
	if len(fs) > 2 {
		inv.Add(field+".ip_families", "at most two families (one per family)")
	}
	for i, f := range fs {
		switch {
		case f != FamilyIPv4 && f != FamilyIPv6:
			inv.Add(field+".ip_families["+strconv.Itoa(i)+"]", strconv.Quote(f)+" is not IPv4 or IPv6")
		case i == 1 && fs[0] == f:
			inv.Add(field+".ip_families[1]", "the same family twice")
		}
	}
}

// protocol defaults "" to TCP and refuses anything but TCP, UDP and SCTP.
func protocol(p, field string, inv *InvalidError) string {
	switch p {
	case "":
		return ProtocolTCP
	case ProtocolTCP, ProtocolUDP, ProtocolSCTP:
		return p
	}
	inv.Add(field, strconv.Quote(p)+" is not TCP, UDP or SCTP")
	return p
}

func portNumber(n int32, field string, inv *InvalidError) {
	if n < 1 || n > 65535 {
		inv.Add(field, strconv.Itoa(int(n))+" is not a port number 1-65535")
	}
}

// EventsFromProto converts and validates the events of one PushEvents message. An
// event takes the message's revision unless it has its own, which must not be above
// the message's. A delete needs only the namespace and name of its object.
func EventsFromProto(req *allocdv1.PushEventsRequest) ([]Event, error) {
	inv := &InvalidError{}
	rev := req.GetRevision()
	if rev <= 0 {
		inv.Add("revision", "must be positive (the revision of the caller's store after these events)")
	}
	evs := make([]Event, 0, len(req.GetEvents()))
	for i, pe := range req.GetEvents() {
		f := "events[" + strconv.Itoa(i) + "]"
		ev := Event{Revision: pe.GetRevision()}
		switch {
		case ev.Revision == 0:
			ev.Revision = rev
		case ev.Revision < 0 || ev.Revision > rev:
			inv.Add(f+".revision", "must be 0 (the message's) or positive and not above the message's revision")
		}
		switch pe.GetType() {
		case allocdv1.EventType_EVENT_TYPE_UPSERT:
			ev.Type = Upsert
		case allocdv1.EventType_EVENT_TYPE_DELETE:
			ev.Type = Delete
		default:
			inv.Add(f+".type", "must be EVENT_TYPE_UPSERT or EVENT_TYPE_DELETE")
		}
		switch o := pe.GetObject().(type) {
		case *allocdv1.Event_Service:
			if ev.Type == Delete {
				ev.Service = &Service{Namespace: o.Service.GetNamespace(), Name: o.Service.GetName(), UID: o.Service.GetUid()}
				meta(f+".service", ev.Service.Namespace, ev.Service.Name, "", false, inv)
			} else {
				ev.Service = ServiceFromProto(o.Service, f+".service", inv)
			}
		case *allocdv1.Event_Pod:
			if ev.Type == Delete {
				ev.Pod = &Pod{Namespace: o.Pod.GetNamespace(), Name: o.Pod.GetName(), UID: o.Pod.GetUid()}
				meta(f+".pod", ev.Pod.Namespace, ev.Pod.Name, "", false, inv)
			} else {
				ev.Pod = PodFromProto(o.Pod, f+".pod", inv)
			}
		default:
			inv.Add(f, "must carry a service or a pod")
		}
		evs = append(evs, ev)
	}
	if err := inv.OrNil(); err != nil {
		return nil, err
	}
	return evs, nil
}

// timeOrZero is t, or zero for the zero Unix time a careless feed may send.
func timeOrZero(t time.Time) time.Time {
	if t.Unix() == 0 {
		return time.Time{}
	}
	return t
}
