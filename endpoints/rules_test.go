package endpoints

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/allocd/allocd/endpoints/kube"
)

// The pure rules, case by case from kube-controller-manager's
// pkg/controller/endpoint/endpoints_controller_test.go and pkg/api/v1/endpoints/util_test.go.
// The cases that need a stored object and writes run against etcd in controller_test.go.

// TestPodToEndpointAddressForService is upstream's test of the same name: the address
// family chosen for a Pod, and the address's fields.
func TestPodToEndpointAddressForService(t *testing.T) {
	v4, v6 := "1.2.3.4", "2000::1"
	cases := []struct {
		name      string
		podIPs    []string
		clusterIP string
		families  []string
		wantIP    string // "" = no address (upstream returns an error)
	}{
		{"v4 pod, v4 service", []string{v4}, "10.0.0.1", nil, v4},
		{"v4v6 pod, v4 service", []string{v4, v6}, "10.0.0.1", nil, v4},
		{"v6v4 pod, v4 service", []string{v6, v4}, "10.0.0.1", nil, v4},
		{"v4 pod, headless, no families", []string{v4}, "None", nil, v4},
		{"v4v6 pod, headless, families [v4]", []string{v4, v6}, "None", []string{kube.FamilyIPv4}, v4},
		{"v4v6 pod, headless, no families", []string{v4, v6}, "None", nil, v4},
		{"v6v4 pod, headless, no families", []string{v6, v4}, "None", nil, v6},
		{"v4v6 pod, v6 service", []string{v4, v6}, "3000::1", nil, v6},
		{"v6 pod, headless", []string{v6}, "None", nil, v6},
		{"v4v6 pod, headless, families [v6]", []string{v4, v6}, "None", []string{kube.FamilyIPv6}, v6},
		{"v4v6 pod, empty cluster IP, no families", []string{v4, v6}, "", nil, v4},
		{"v4 pod, v6 service", []string{v4}, "3000::1", nil, ""},
		{"v4 pod, v6 service, families [v6]", []string{v4}, "3000::1", []string{kube.FamilyIPv6}, ""},
		// Kubernetes publishes addresses in canonical form (ParseIPSloppy(ip).String()).
		{"v6 pod, non-canonical", []string{"2000:0::0001"}, "None", nil, "2000::1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			svc := &kube.Service{Namespace: "ns", Name: "foo", ClusterIPs: []string{tc.clusterIP},
				IPFamilies: tc.families}
			p := &kube.Pod{Namespace: "ns", Name: "pod1", UID: "uid-1", ResourceVersion: "7",
				NodeName: "node-1", PodIPs: tc.podIPs}
			a, ok := podAddress(svc, p)
			if tc.wantIP == "" {
				if ok {
					t.Fatalf("podAddress = %+v; want none", a)
				}
				return
			}
			want := kube.Address{IP: tc.wantIP, NodeName: "node-1",
				TargetRef: &kube.ObjectRef{Kind: "Pod", Namespace: "ns", Name: "pod1", UID: "uid-1"}}
			if !ok || !addressEqual(a, want) {
				t.Fatalf("podAddress = %+v, %v; want %+v", a, ok, want)
			}
		})
	}
}

// TestSyncServiceAddresses is upstream's test of the same name: ready and not-ready
// counts by phase, readiness, termination and publishNotReadyAddresses.
func TestSyncServiceAddresses(t *testing.T) {
	cases := []struct {
		phase               string
		ready, terminating  bool
		tolerate            bool
		wantReady, wantNotR int
	}{
		{kube.PhaseRunning, true, false, false, 1, 0},
		{kube.PhaseRunning, true, true, false, 0, 0},
		{kube.PhaseUnknown, true, false, false, 1, 0},
		{kube.PhaseUnknown, true, true, false, 0, 0},
		{kube.PhasePending, true, false, false, 1, 0},
		{kube.PhasePending, true, true, false, 0, 0},
		{kube.PhaseUnknown, false, false, false, 0, 1},
		{kube.PhasePending, false, false, false, 0, 1},
		{kube.PhaseFailed, false, false, false, 0, 0},
		{kube.PhaseSucceeded, false, false, false, 0, 0},
		{kube.PhaseRunning, false, false, true, 1, 0},
		{kube.PhaseRunning, false, true, true, 1, 0},
		{kube.PhaseUnknown, false, false, true, 1, 0},
		{kube.PhaseUnknown, false, true, true, 1, 0},
		{kube.PhasePending, false, false, true, 1, 0},
		{kube.PhasePending, false, true, true, 1, 0},
		{kube.PhaseFailed, false, false, true, 0, 0},
		{kube.PhaseSucceeded, false, false, true, 0, 0},
	}
	for _, tc := range cases {
		name := fmt.Sprintf("%s ready=%v terminating=%v publishNotReady=%v", tc.phase, tc.ready,
			tc.terminating, tc.tolerate)
		t.Run(name, func(t *testing.T) {
			svc := testService("default")
			svc.ClusterIPs = []string{"1.1.1.1"}
			svc.PublishNotReadyAddresses = tc.tolerate
			p := testPod("default", 0, tc.ready, 1)
			p.Phase, p.Deleting = tc.phase, tc.terminating
			ready, notReady := CountAddresses(ComputeSubsets(svc, []*kube.Pod{p}))
			if ready != tc.wantReady || notReady != tc.wantNotR {
				t.Errorf("ready, not ready = %d, %d; want %d, %d", ready, notReady, tc.wantReady, tc.wantNotR)
			}
		})
	}
}

// TestPodContribution: the rules of one Pod's contribution not covered above: a Pod
// without IPs; the hostname and subdomain; a Service without ports, headless or not;
// target ports by number and by name (containers before sidecars, the protocol
// matching), a name no container has, and the port fields copied from the Service's.
func TestPodContribution(t *testing.T) {
	app := "h2c"
	cases := []struct {
		name string
		svc  func(*kube.Service)
		pod  func(*kube.Pod)
		want []kube.Subset
	}{{
		name: "no pod IP",
		pod:  func(p *kube.Pod) { p.PodIPs = nil },
	}, {
		name: "hostname with the Service's name as subdomain",
		pod:  func(p *kube.Pod) { p.Hostname, p.Subdomain = "h", "foo" },
		want: []kube.Subset{{Addresses: []kube.Address{withHostname(addr("1.2.3.4", "default", "pod0"), "h")},
			Ports: []kube.Port{tcp(8080)}}},
	}, {
		name: "hostname with another subdomain",
		pod:  func(p *kube.Pod) { p.Hostname, p.Subdomain = "h", "bar" },
		want: []kube.Subset{{Addresses: []kube.Address{addr("1.2.3.4", "default", "pod0")},
			Ports: []kube.Port{tcp(8080)}}},
	}, {
		name: "headless without ports",
		svc:  func(s *kube.Service) { s.ClusterIPs, s.Ports = []string{"None"}, nil },
		want: []kube.Subset{{Addresses: []kube.Address{addr("1.2.3.4", "default", "pod0")}}},
	}, {
		name: "not headless, no ports",
		svc:  func(s *kube.Service) { s.ClusterIPs, s.Ports = []string{"10.0.0.1"}, nil },
	}, {
		// A number is never checked against the containers; a port 0 (which the feed
		// never carries: it defaults the target port to the port) is dropped by
		// RepackSubsets as upstream drops it, leaving the address without ports.
		name: "target port number unchecked",
		svc:  func(s *kube.Service) { s.Ports[0].TargetPort = kube.TargetPort{Number: 9999} },
		want: []kube.Subset{{Addresses: []kube.Address{addr("1.2.3.4", "default", "pod0")},
			Ports: []kube.Port{tcp(9999)}}},
	}, {
		name: "target port 0",
		svc:  func(s *kube.Service) { s.Ports[0].TargetPort = kube.TargetPort{Number: 0} },
		want: []kube.Subset{{Addresses: []kube.Address{addr("1.2.3.4", "default", "pod0")}}},
	}, {
		name: "named target port",
		svc: func(s *kube.Service) {
			s.Ports[0].TargetPort, s.Ports[0].Name = kube.TargetPort{Name: "port1"}, "web"
		},
		want: []kube.Subset{{Addresses: []kube.Address{addr("1.2.3.4", "default", "pod0")},
			Ports: []kube.Port{{Name: "web", Port: 8081, Protocol: kube.ProtocolTCP}}}},
	}, {
		name: "named target port, only the protocol differs",
		svc: func(s *kube.Service) {
			s.Ports[0].TargetPort = kube.TargetPort{Name: "port1"}
			s.Ports[0].Protocol = kube.ProtocolUDP
		},
	}, {
		name: "named target port in a sidecar, after the containers",
		svc:  func(s *kube.Service) { s.Ports[0].TargetPort = kube.TargetPort{Name: "side"} },
		pod: func(p *kube.Pod) {
			p.InitContainers = []kube.Container{
				{Name: "init",
					Ports: []kube.ContainerPort{{Name: "side", ContainerPort: 1,
						Protocol: kube.ProtocolTCP}}},
				{Name: "sidecar", RestartPolicy: kube.RestartPolicyAlways,
					Ports: []kube.ContainerPort{{Name: "side", ContainerPort: 9000,
						Protocol: kube.ProtocolTCP}}},
			}
		},
		want: []kube.Subset{{Addresses: []kube.Address{addr("1.2.3.4", "default", "pod0")},
			Ports: []kube.Port{tcp(9000)}}},
	}, {
		name: "one of two ports unresolved: the pod stays under the other",
		svc: func(s *kube.Service) {
			s.Ports = append(s.Ports,
				kube.ServicePort{Name: "b", Port: 81, TargetPort: kube.TargetPort{Name: "nope"},
					Protocol: kube.ProtocolTCP})
		},
		want: []kube.Subset{{Addresses: []kube.Address{addr("1.2.3.4", "default", "pod0")},
			Ports: []kube.Port{tcp(8080)}}},
	}, {
		// TestEndpointPortFromServicePort.
		name: "appProtocol copied",
		svc:  func(s *kube.Service) { s.Ports[0].AppProtocol = &app },
		want: []kube.Subset{{Addresses: []kube.Address{addr("1.2.3.4", "default", "pod0")},
			Ports: []kube.Port{{Port: 8080, Protocol: kube.ProtocolTCP, AppProtocol: &app}}}},
	}, {
		name: "dual-stack Service: its primary family only",
		svc: func(s *kube.Service) {
			s.ClusterIPs, s.IPFamilies = []string{"fd00::1", "10.0.0.1"},
				[]string{kube.FamilyIPv6, kube.FamilyIPv4}
		},
		pod: func(p *kube.Pod) { p.PodIPs = []string{"1.2.3.4", "fd00::4"} },
		want: []kube.Subset{{Addresses: []kube.Address{{IP: "fd00::4",
			TargetRef: addr("", "default", "pod0").TargetRef}}, Ports: []kube.Port{tcp(8080)}}},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			svc := testService("default")
			if tc.svc != nil {
				tc.svc(svc)
			}
			p := testPod("default", 0, true, 2)
			if tc.pod != nil {
				tc.pod(p)
			}
			if got := ComputeSubsets(svc, []*kube.Pod{p}); !subsetsEqual(got, tc.want) {
				t.Errorf("subsets = %s; want %s", show(got), show(tc.want))
			}
		})
	}
}

// Pods resolving a named port to different numbers land in different subsets (rule 34).
func TestNamedPortDifferentNumbers(t *testing.T) {
	svc := testService("default")
	svc.Ports[0].TargetPort = kube.TargetPort{Name: "port0"}
	p0, p1 := testPod("default", 0, true, 1), testPod("default", 1, true, 1)
	p1.Containers[0].Ports[0].ContainerPort = 9090
	got := ComputeSubsets(svc, []*kube.Pod{p1, p0})
	want := []kube.Subset{
		{Addresses: []kube.Address{addr("1.2.3.4", "default", "pod0")}, Ports: []kube.Port{tcp(8080)}},
		{Addresses: []kube.Address{addr("1.2.3.5", "default", "pod1")}, Ports: []kube.Port{tcp(9090)}},
	}
	if !subsetsEqual(got, want) {
		t.Errorf("subsets = %s; want %s", show(got), show(want))
	}
}

func withHostname(a kube.Address, h string) kube.Address { a.Hostname = h; return a }

// TestRepack is util_test.go's RepackSubsets cases.
func TestRepack(t *testing.T) {
	ref := func(uid string) *kube.ObjectRef {
		return &kube.ObjectRef{Kind: "Pod", Namespace: "ns", Name: "p" + uid, UID: uid}
	}
	a := func(ip, uid string) kube.Address {
		if uid == "" {
			return kube.Address{IP: ip}
		}
		return kube.Address{IP: ip, TargetRef: ref(uid)}
	}
	p := func(name string, n int32) kube.Port {
		return kube.Port{Name: name, Port: n, Protocol: kube.ProtocolTCP}
	}
	cases := []struct {
		name     string
		in, want []kube.Subset
	}{
		{"empty", nil, nil},
		{"one subset",
			[]kube.Subset{{Addresses: []kube.Address{a("1.2.3.4", "")}, Ports: []kube.Port{p("", 111)}}},
			[]kube.Subset{{Addresses: []kube.Address{a("1.2.3.4", "")}, Ports: []kube.Port{p("", 111)}}}},
		{"one subset, one not ready",
			[]kube.Subset{{NotReadyAddresses: []kube.Address{a("1.2.3.4", "")},
				Ports: []kube.Port{p("", 111)}}},
			[]kube.Subset{{NotReadyAddresses: []kube.Address{a("1.2.3.4", "")},
				Ports: []kube.Port{p("", 111)}}}},
		{"one subset, duplicate address and port collapse",
			[]kube.Subset{{Addresses: []kube.Address{a("1.2.3.4", "u1"), a("1.2.3.4", "u1")},
				Ports: []kube.Port{p("", 111), p("", 111)}}},
			[]kube.Subset{{Addresses: []kube.Address{a("1.2.3.4", "u1")}, Ports: []kube.Port{p("", 111)}}}},
		{"same IP, different UIDs: kept twice",
			[]kube.Subset{{Addresses: []kube.Address{a("1.2.3.4", "u2"), a("1.2.3.4", "u1")},
				Ports: []kube.Port{p("", 111)}}},
			[]kube.Subset{{Addresses: []kube.Address{a("1.2.3.4", "u1"), a("1.2.3.4", "u2")},
				Ports: []kube.Port{p("", 111)}}}},
		{"same address ready and not ready: not ready",
			[]kube.Subset{
				{Addresses: []kube.Address{a("1.2.3.4", "")}, Ports: []kube.Port{p("", 111)}},
				{NotReadyAddresses: []kube.Address{a("1.2.3.4", "")}, Ports: []kube.Port{p("", 111)}}},
			[]kube.Subset{{NotReadyAddresses: []kube.Address{a("1.2.3.4", "")},
				Ports: []kube.Port{p("", 111)}}}},
		{"two ports, same address set: one subset",
			[]kube.Subset{
				{Addresses: []kube.Address{a("1.2.3.4", "")}, Ports: []kube.Port{p("p", 111)}},
				{Addresses: []kube.Address{a("1.2.3.4", "")}, Ports: []kube.Port{p("q", 222)}}},
			[]kube.Subset{{Addresses: []kube.Address{a("1.2.3.4", "")},
				Ports: []kube.Port{p("p", 111), p("q", 222)}}}},
		{"two ports, different address sets: two subsets",
			[]kube.Subset{
				{Addresses: []kube.Address{a("1.2.3.4", "")}, Ports: []kube.Port{p("p", 111)}},
				{Addresses: []kube.Address{a("5.6.7.8", "")}, Ports: []kube.Port{p("q", 222)}}},
			[]kube.Subset{
				{Addresses: []kube.Address{a("1.2.3.4", "")}, Ports: []kube.Port{p("p", 111)}},
				{Addresses: []kube.Address{a("5.6.7.8", "")}, Ports: []kube.Port{p("q", 222)}}}},
		{"addresses sorted by IP string, byte-wise",
			[]kube.Subset{{Addresses: []kube.Address{a("10.0.0.9", ""), a("10.0.0.10", ""), a("1.2.3.4", "")},
				Ports: []kube.Port{p("", 111)}}},
			[]kube.Subset{{Addresses: []kube.Address{a("1.2.3.4", ""), a("10.0.0.10", ""), a("10.0.0.9", "")},
				Ports: []kube.Port{p("", 111)}}}},
		{"no target first among equal IPs",
			[]kube.Subset{{Addresses: []kube.Address{a("1.2.3.4", "u1"), a("1.2.3.4", "")},
				Ports: []kube.Port{p("", 111)}}},
			[]kube.Subset{{Addresses: []kube.Address{a("1.2.3.4", ""), a("1.2.3.4", "u1")},
				Ports: []kube.Port{p("", 111)}}}},
		{"the first copy of an address wins",
			[]kube.Subset{
				{Addresses: []kube.Address{{IP: "1.2.3.4", Hostname: "first", TargetRef: ref("u1")}},
					Ports: []kube.Port{p("p", 111)}},
				{Addresses: []kube.Address{{IP: "1.2.3.4", Hostname: "second", TargetRef: ref("u1")}},
					Ports: []kube.Port{p("q", 222)}}},
			[]kube.Subset{{Addresses: []kube.Address{{IP: "1.2.3.4", Hostname: "first",
				TargetRef: ref("u1")}},
				Ports: []kube.Port{p("p", 111), p("q", 222)}}}},
		{"addresses without ports",
			[]kube.Subset{{Addresses: []kube.Address{a("1.2.3.5", ""), a("1.2.3.4", "")}}},
			[]kube.Subset{{Addresses: []kube.Address{a("1.2.3.4", ""), a("1.2.3.5", "")}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Repack(tc.in)
			if !subsetsEqual(got, tc.want) {
				t.Errorf("Repack = %s; want %s", show(got), show(tc.want))
			}
			// The first copy must keep its hostname: subsetsEqual compares it.
			if again := Repack(got); !subsetsEqual(again, got) {
				t.Errorf("Repack is not idempotent: %s then %s", show(got), show(again))
			}
		})
	}
}

// sized returns subsets with the given ready and not-ready counts, each on its own
// port so that Repack keeps them apart, addresses numbered from base.
func sized(ready, notReady []int) []kube.Subset {
	var out []kube.Subset
	ip := 0
	for i := range ready {
		s := kube.Subset{Ports: []kube.Port{tcp(int32(1000 + i))}}
		for range ready[i] {
			ip++
			s.Addresses = append(s.Addresses,
				kube.Address{IP: fmt.Sprintf("10.%d.%d.%d", ip/65536, ip/256%256, ip%256)})
		}
		if i < len(notReady) {
			for range notReady[i] {
				ip++
				s.NotReadyAddresses = append(s.NotReadyAddresses,
					kube.Address{IP: fmt.Sprintf("10.%d.%d.%d", ip/65536, ip/256%256, ip%256)})
			}
		}
		out = append(out, s)
	}
	return out
}

func counts(subsets []kube.Subset) (ready, notReady []int) {
	for _, s := range subsets {
		ready = append(ready, len(s.Addresses))
		notReady = append(notReady, len(s.NotReadyAddresses))
	}
	return ready, notReady
}

// TestTruncateEndpoints is upstream's test of the same name, with its worked examples.
func TestTruncateEndpoints(t *testing.T) {
	cases := []struct {
		name                    string
		ready, notReady         []int
		wantReady, wantNotReady []int
		wantTruncated           bool
	}{
		{"empty", nil, nil, nil, nil, false},
		{"900 in all, untouched", []int{50, 100, 100, 100, 100}, []int{50, 100, 100, 100, 100},
			[]int{50, 100, 100, 100, 100}, []int{50, 100, 100, 100, 100}, false},
		{"exactly 1000, untouched", []int{500}, []int{500}, []int{500}, []int{500}, false},
		{"not ready truncated", []int{90, 110, 50, 10, 20}, []int{101, 200, 200, 201, 298},
			[]int{90, 110, 50, 10, 20}, []int{73, 144, 144, 145, 214}, true},
		{"ready truncated, not ready dropped", []int{205, 400, 402, 400, 693}, []int{100, 100, 100, 100, 100},
			[]int{98, 191, 192, 191, 328}, []int{0, 0, 0, 0, 0}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := sized(tc.ready, tc.notReady)
			before := slices.Clone(in)
			out, truncated := truncate(in, MaxAddresses)
			if truncated != tc.wantTruncated {
				t.Errorf("truncated = %v; want %v", truncated, tc.wantTruncated)
			}
			r, n := counts(out)
			if !slices.Equal(r, tc.wantReady) || !slices.Equal(n, tc.wantNotReady) {
				t.Errorf("kept ready %v, not ready %v; want %v, %v", r, n, tc.wantReady, tc.wantNotReady)
			}
			for i, s := range out {
				if len(s.Addresses) > 0 && s.Addresses[0] != before[i].Addresses[0] {
					t.Errorf("subset %d: kept %v first; want the first entries kept", i, s.Addresses[0])
				}
			}
			if !subsetsEqual(in, before) || len(in) > 0 && len(in[0].Addresses) != tc.ready[0] {
				t.Error("truncate modified its input")
			}
		})
	}
}

// TestSyncServiceOverCapacity is upstream's test of the same name over Desired and
// NeedsWrite: the existing annotation, the desired counts, what is kept and the
// annotation written.
func TestSyncServiceOverCapacity(t *testing.T) {
	cases := []struct {
		name               string
		existingAnnotation *string
		existingCount      int
		ready, notReady    int
		wantReady, wantNR  int
		wantAnnotation     *string
	}{
		{"empty", nil, 0, 0, 0, 0, 0, nil},
		{"annotation added past max, not ready truncated", nil, 999, 997, 4, 997, 3, ptr(kube.Truncated)},
		{"annotation added past max, ready truncated", nil, 999, 1000, 10, 1000, 0, ptr(kube.Truncated)},
		{"annotation removed below max", ptr(kube.Truncated), 999, 999, 0, 999, 0, nil},
		{"warning removed at max", ptr("warning"), 1000, 1000, 0, 1000, 0, nil},
		{"warning becomes truncated past max", ptr("warning"), 1001, 1001, 0, 1000, 0, ptr(kube.Truncated)},
		{"annotation removed at max", ptr(kube.Truncated), 1000, 1000, 0, 1000, 0, nil},
		{"invalid value corrected", ptr("invalid"), 1001, 1001, 0, 1000, 0, ptr(kube.Truncated)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			svc := testService("default")
			var pods []*kube.Pod
			for i := range tc.ready + tc.notReady {
				p := testPod("default", i, i < tc.ready, 1)
				p.PodIPs = []string{fmt.Sprintf("10.%d.%d.%d", i/65536, i/256%256, i%256)}
				p.Name = "pod" + strconv.Itoa(i)
				pods = append(pods, p)
			}
			cur := ours(svc, sized([]int{tc.existingCount}, nil)...)
			if tc.existingCount == 0 {
				cur.Subsets = nil
			}
			if tc.existingAnnotation != nil {
				cur.Annotations = map[string]string{kube.AnnotationOverCapacity: *tc.existingAnnotation}
			}
			d := Desired(svc, ComputeSubsets(svc, pods), cur, time.Time{})
			r, n := CountAddresses(d.Subsets)
			if r != tc.wantReady || n != tc.wantNR {
				t.Errorf("kept %d ready, %d not ready; want %d, %d", r, n, tc.wantReady, tc.wantNR)
			}
			got, has := d.Annotations[kube.AnnotationOverCapacity]
			if has != (tc.wantAnnotation != nil) || has && got != *tc.wantAnnotation {
				t.Errorf("over-capacity annotation = %q (present %v); want %v", got, has,
					show(tc.wantAnnotation))
			}
			if (tc.existingCount > 0 || tc.existingAnnotation != nil) && !NeedsWrite(cur, d) {
				t.Error("NeedsWrite = false; want a write")
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestLastTriggerChangeTimeAnnotation covers upstream's three tests of that name: the
// Service's creation time on its first sync, a newer time over an older annotation,
// and the annotation removed when no time is known.
func TestLastTriggerChangeTimeAnnotation(t *testing.T) {
	created := time.Date(2018, 1, 1, 0, 0, 0, 0, time.UTC)
	svc := testService("default")
	svc.CreationTime = created
	pods := []*kube.Pod{testPod("default", 0, true, 1)}
	stored := ours(svc)
	stored.Annotations = map[string]string{
		kube.AnnotationTriggerTime: created.Add(-time.Hour).Format(time.RFC3339Nano)}

	tr := NewTriggerTracker()
	d := Desired(svc, ComputeSubsets(svc, pods), stored, tr.Compute(svc, pods))
	if got, want := d.Annotations[kube.AnnotationTriggerTime], "2018-01-01T00:00:00Z"; got != want {
		t.Errorf("trigger time on the first sync = %q; want %q (the Service's creation)", got, want)
	}

	// Nothing moved since: zero, the annotation is removed.
	if tt := tr.Compute(svc, pods); !tt.IsZero() {
		t.Errorf("trigger time with nothing new = %v; want zero", tt)
	}
	// A Pod's Ready transition moves it.
	flip := created.Add(time.Minute)
	pods[0].ReadyTransitionTime = flip
	if tt := tr.Compute(svc, pods); !tt.Equal(flip) {
		t.Errorf("trigger time after a Ready transition = %v; want %v", tt, flip)
	}

	// AnnotationCleared: no creation time and no transition time known.
	bare := testService("default")
	cleared := Desired(bare, ComputeSubsets(bare, pods[:0]), stored, NewTriggerTracker().Compute(bare, nil))
	if v, ok := cleared.Annotations[kube.AnnotationTriggerTime]; ok {
		t.Errorf("trigger time annotation = %q; want it removed", v)
	}
	// The trigger time alone never causes a write (rule 44).
	same := ours(svc)
	if NeedsWrite(same, Desired(svc, nil, same, created)) {
		t.Error("NeedsWrite = true for a change of the trigger time alone")
	}
}

// TestEndpointSubsetsEqualIgnoreResourceVersion is upstream's test of the same name
// (allocd's targets carry no resourceVersion at all, so its two "equal" cases are the
// identity).
func TestEndpointSubsetsEqualIgnoreResourceVersion(t *testing.T) {
	base := func() []kube.Subset {
		return []kube.Subset{{
			Addresses:         []kube.Address{addr("1.2.3.4", "default", "pod0")},
			NotReadyAddresses: []kube.Address{addr("1.2.3.5", "default", "pod1")},
			Ports:             []kube.Port{tcp(8080)},
		}}
	}
	cases := []struct {
		name   string
		change func([]kube.Subset) []kube.Subset
		equal  bool
	}{
		{"same", func(s []kube.Subset) []kube.Subset { return s }, true},
		{"subset removed", func([]kube.Subset) []kube.Subset { return nil }, false},
		{"ready IP changed",
			func(s []kube.Subset) []kube.Subset { s[0].Addresses[0].IP = "1.2.3.6"; return s }, false},
		{"not-ready IP changed",
			func(s []kube.Subset) []kube.Subset { s[0].NotReadyAddresses[0].IP = "1.2.3.6"; return s },
			false},
		{"port changed", func(s []kube.Subset) []kube.Subset { s[0].Ports[0].Port = 8081; return s }, false},
		{"node name changed",
			func(s []kube.Subset) []kube.Subset { s[0].Addresses[0].NodeName = "n2"; return s },
			false},
		{"target uid changed",
			func(s []kube.Subset) []kube.Subset { s[0].Addresses[0].TargetRef.UID = "other"; return s },
			false},
		{"nil and empty", func([]kube.Subset) []kube.Subset { return []kube.Subset{} }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := subsetsEqual(base(), tc.change(base())); got != tc.equal {
				t.Errorf("subsetsEqual = %v; want %v", got, tc.equal)
			}
		})
	}
	if !subsetsEqual(nil, []kube.Subset{}) {
		t.Error("subsetsEqual(nil, empty) = false; want true")
	}
}

// TestPodChange: which Pod updates enqueue anything (rules 48-50).
func TestPodChange(t *testing.T) {
	cases := []struct {
		name        string
		change      func(*kube.Pod)
		pod, labels bool
	}{
		{"resource version only", func(p *kube.Pod) { p.ResourceVersion = "9" }, false, false},
		{"node name only", func(p *kube.Pod) { p.NodeName = "n9" }, false, false},
		{"readiness", func(p *kube.Pod) { p.Ready = !p.Ready }, true, false},
		{"IPs", func(p *kube.Pod) { p.PodIPs = []string{"9.9.9.9"} }, true, false},
		{"terminating", func(p *kube.Pod) { p.Deleting = true }, true, false},
		{"labels", func(p *kube.Pod) { p.Labels = map[string]string{"x": "y"} }, false, true},
		{"hostname", func(p *kube.Pod) { p.Hostname = "h" }, false, true},
		{"subdomain", func(p *kube.Pod) { p.Subdomain = "s" }, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			old := testPod("default", 0, true, 1)
			cur := testPod("default", 0, true, 1)
			tc.change(cur)
			pod, labels := podChange(old, cur)
			if pod != tc.pod || labels != tc.labels {
				t.Errorf("podChange = %v, %v; want %v, %v", pod, labels, tc.pod, tc.labels)
			}
		})
	}
}

// show prints subsets (or anything) for failure messages.
func show(v any) string {
	switch s := v.(type) {
	case []kube.Subset:
		out := "["
		for _, sub := range s {
			out += "{"
			for _, a := range sub.Addresses {
				out += a.IP + "+" + a.Hostname + " "
			}
			for _, a := range sub.NotReadyAddresses {
				out += a.IP + "- "
			}
			for _, p := range sub.Ports {
				out += fmt.Sprintf("%s:%d/%s ", p.Name, p.Port, p.Protocol)
			}
			out += "}"
		}
		return out + "]"
	case *string:
		if s == nil {
			return "absent"
		}
		return strconv.Quote(*s)
	}
	return fmt.Sprint(v)
}
