package main

import (
	"fmt"
	"strconv"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// workload is the cluster the bench feeds: Services of svcPerNS per namespace, each
// selecting podsPerSvc Pods by its own label with a named target port, the Pods spread
// over the Nodes round robin, the Nodes over the zones.
type workload struct {
	services, podsPerSvc, nodes, zones int
}

const svcPerNS = 100

// svcName is the namespace and name of Service s.
func (w workload) svcName(s int) (ns, name string) {
	return "ns-" + strconv.Itoa(s/svcPerNS), "app-" + strconv.Itoa(s%svcPerNS)
}

func (w workload) svcKey(s int) string {
	ns, name := w.svcName(s)
	return ns + "/" + name
}

// index maps every Service's "namespace/name" to its number.
func (w workload) index() map[string]int {
	idx := make(map[string]int, w.services)
	for s := range w.services {
		idx[w.svcKey(s)] = s
	}
	return idx
}

func (w workload) nodeList() []*allocdv1.Node {
	out := make([]*allocdv1.Node, w.nodes)
	for i := range out {
		out[i] = &allocdv1.Node{Name: "node-" + strconv.Itoa(i), ResourceVersion: "1", Ready: true,
			AllocatableCpuMillis: 8000,
			Labels: map[string]string{"topology.kubernetes.io/zone": "zone-" + strconv.Itoa(i%w.zones),
				"kubernetes.io/hostname": "node-" + strconv.Itoa(i)}}
	}
	return out
}

// service is Service s: single stack (one IPv4 cluster IP), port 80 to the target
// port named http.
func (w workload) service(s int) *allocdv1.Service {
	ns, app := w.svcName(s)
	return &allocdv1.Service{Namespace: ns, Name: app, Uid: ns + "-" + app, Type: "ClusterIP",
		ClusterIps: []string{fmt.Sprintf("10.96.%d.%d", s/250%250, s%250+1)},
		IpFamilies: []string{"IPv4"},
		Labels:     map[string]string{"app": app},
		Selector:   &allocdv1.Selector{MatchLabels: map[string]string{"app": app}},
		Ports: []*allocdv1.ServicePortSpec{{Name: "http", Port: 80, Protocol: "TCP",
			TargetPort: &allocdv1.TargetPort{Value: &allocdv1.TargetPort_StrValue{StrValue: "http"}}}}}
}

// pod is Pod p of Service s, ready or not, at resource version rev.
func (w workload) pod(s, p int, ready bool, rev int64) *allocdv1.Pod {
	ns, app := w.svcName(s)
	i := s*w.podsPerSvc + p
	return &allocdv1.Pod{
		Namespace: ns, Name: app + "-" + strconv.Itoa(p), Uid: ns + "-" + app + "-" + strconv.Itoa(p),
		ResourceVersion: strconv.FormatInt(rev, 10),
		Labels:          map[string]string{"app": app, "pod-template-hash": "5d8f7c9b4"},
		NodeName:        "node-" + strconv.Itoa(i%w.nodes),
		PodIps:          []string{fmt.Sprintf("10.%d.%d.%d", 1+(i+1)/62500, (i+1)/250%250, (i+1)%250+1)},
		Phase:           "Running", Ready: ready,
		Containers: []*allocdv1.Container{{Name: "app",
			Ports: []*allocdv1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: "TCP"}}}},
	}
}

func (w workload) serviceList() []*allocdv1.Service {
	out := make([]*allocdv1.Service, w.services)
	for s := range out {
		out[s] = w.service(s)
	}
	return out
}

func (w workload) podList() []*allocdv1.Pod {
	out := make([]*allocdv1.Pod, 0, w.services*w.podsPerSvc)
	for s := range w.services {
		for p := range w.podsPerSvc {
			out = append(out, w.pod(s, p, true, 1))
		}
	}
	return out
}
