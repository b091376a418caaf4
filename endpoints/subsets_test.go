package endpoints

import (
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"

	"github.com/allocd/allocd/endpoints/kube"
)

// TestOnePortSubsetsIsRepack: where ComputeSubsets takes its one-port way, it returns
// what the general way (a subset per Pod and port, repacked) returns, for Pods with
// shared IPs, targets with and without uids, readiness mixed, terminating and terminal
// Pods, ports named and numbered, resolved or not, and headless Services.
func TestOnePortSubsetsIsRepack(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	taken := 0
	for i := range 3000 {
		svc, pods := randomSubsetsCase(r)
		fast, ok := onePortSubsets(svc, pods)
		if !ok {
			continue
		}
		taken++
		if want := repackedSubsets(svc, pods); !reflect.DeepEqual(fast, want) {
			t.Fatalf("case %d: onePortSubsets = %+v\nwant repackedSubsets' %+v\nservice %+v", i, fast, want,
				svc)
		}
	}
	if taken < 1000 {
		t.Fatalf("the one-port way was taken in %d of 3000 cases; want most, to test it", taken)
	}
}

func randomSubsetsCase(r *rand.Rand) (*kube.Service, []*kube.Pod) {
	svc := &kube.Service{Namespace: "ns", Name: "svc", UID: "u", ClusterIPs: []string{"10.96.0.1"},
		Selector: map[string]string{}}
	switch r.IntN(6) {
	case 0:
		svc.ClusterIPs = []string{"None"}
	case 1:
		svc.PublishNotReadyAddresses = true
	}
	switch r.IntN(5) {
	case 0: // no port
	case 1:
		svc.Ports = []kube.ServicePort{{Name: "a", Port: 80, Protocol: kube.ProtocolTCP,
			TargetPort: kube.TargetPort{Number: 8080}},
			{Name: "b", Port: 81, Protocol: kube.ProtocolTCP, TargetPort: kube.TargetPort{Name: "http"}}}
	case 2:
		app := "h2c"
		svc.Ports = []kube.ServicePort{{Name: "a", Port: 80, Protocol: kube.ProtocolTCP, AppProtocol: &app,
			TargetPort: kube.TargetPort{Number: 8080}}}
	default:
		svc.Ports = []kube.ServicePort{{Name: "a", Port: 80, Protocol: kube.ProtocolTCP,
			TargetPort: kube.TargetPort{Name: "http"}}}
	}
	pods := make([]*kube.Pod, r.IntN(12))
	for j := range pods {
		p := &kube.Pod{Namespace: "ns", Name: "p" + strconv.Itoa(j), UID: "uid" + strconv.Itoa(r.IntN(4)),
			PodIPs: []string{"10.0.0." + strconv.Itoa(r.IntN(5))}, Phase: kube.PhaseRunning,
			Ready: r.IntN(3) > 0, NodeName: "n" + strconv.Itoa(r.IntN(2))}
		switch r.IntN(10) {
		case 0:
			p.Phase = kube.PhaseSucceeded
		case 1:
			p.Deleting = true
		case 2:
			p.UID = ""
		case 3:
			p.PodIPs = nil
		}
		if r.IntN(8) > 0 {
			p.Containers = []kube.Container{{Name: "c", Ports: []kube.ContainerPort{{Name: "http",
				Protocol:      kube.ProtocolTCP,
				ContainerPort: int32(8080 + r.IntN(2)*(r.IntN(6)/5))}}}}
		}
		pods[j] = p
	}
	return svc, pods
}
