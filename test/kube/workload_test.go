package kube

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// svcKind is one kind of Service the workload creates: what it sets on a plain
// ClusterIP Service with one TCP port. j counts the Services of the kind so far (from
// 0): the kinds that ask for specific addresses or ports take the j-th of their own.
type svcKind struct {
	name string
	set  func(s *corev1.Service, j int)
}

// requestedLimit bounds the Services of a kind that asks for specific items: each asks
// for its own, from the static bands (the lowest 256 ClusterIPs of each family's range,
// the lowest 86 NodePorts: KEP-3070 and KEP-3668, which kube-apiserver and allocd
// follow), where no dynamic allocation lands, so that a refusal of one is never the
// workload's own collision. Services of such a kind beyond it ask for nothing.
const requestedLimit = 80

// requestedIPv4, requestedIPv6 and requestedPort are the j-th specific items.
func requestedIPv4(j int) string { return fmt.Sprintf("10.96.0.%d", 20+j) }
func requestedIPv6(j int) string { return fmt.Sprintf("fd00:10:96::%x", 0x20+j) }
func requestedPort(j int) int32  { return int32(30000 + j) }

func policy(p corev1.IPFamilyPolicy) *corev1.IPFamilyPolicy { return &p }

// workloadKinds is the e2e's mix, in turn: every ClusterIP family policy, requested
// ClusterIPs and NodePorts, NodePort (with a port number twice, TCP and UDP, which
// kube-apiserver gives one NodePort), LoadBalancer with and without node ports,
// externalTrafficPolicy Local (a healthCheckNodePort), and the two kinds that hold
// nothing (headless, ExternalName).
var workloadKinds = []svcKind{
	{"single-stack", func(s *corev1.Service, j int) {}},
	{"prefer-dual-stack", func(s *corev1.Service, j int) {
		s.Spec.IPFamilyPolicy = policy(corev1.IPFamilyPolicyPreferDualStack)
	}},
	{"require-dual-stack", func(s *corev1.Service, j int) {
		s.Spec.IPFamilyPolicy = policy(corev1.IPFamilyPolicyRequireDualStack)
	}},
	{"requested-clusterip", func(s *corev1.Service, j int) {
		if j < requestedLimit {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = requestedIPv4(j), []string{requestedIPv4(j)}
		}
	}},
	{"requested-dual-stack", func(s *corev1.Service, j int) {
		s.Spec.IPFamilyPolicy = policy(corev1.IPFamilyPolicyRequireDualStack)
		if j < requestedLimit {
			s.Spec.ClusterIPs = []string{requestedIPv6(j), requestedIPv4(j + requestedLimit)}
			s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
		}
	}},
	{"nodeport", func(s *corev1.Service, j int) { s.Spec.Type = corev1.ServiceTypeNodePort }},
	{"requested-nodeport", func(s *corev1.Service, j int) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		if j < requestedLimit {
			s.Spec.Ports[0].NodePort = requestedPort(j)
		}
	}},
	{"nodeport-tcp-udp", func(s *corev1.Service, j int) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports = []corev1.ServicePort{
			{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)},
			{Name: "dns-udp", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
			{Name: "metrics", Port: 9153, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(9153)},
		}
	}},
	{"loadbalancer", func(s *corev1.Service, j int) { s.Spec.Type = corev1.ServiceTypeLoadBalancer }},
	{"loadbalancer-no-nodeports", func(s *corev1.Service, j int) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		no := false
		s.Spec.AllocateLoadBalancerNodePorts = &no
	}},
	{"loadbalancer-local", func(s *corev1.Service, j int) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}},
	{"headless", func(s *corev1.Service, j int) { s.Spec.ClusterIP = corev1.ClusterIPNone }},
	{"externalname", func(s *corev1.Service, j int) {
		s.Spec.Type, s.Spec.ExternalName, s.Spec.Selector = corev1.ServiceTypeExternalName, "example.org", nil
	}},
}

// workloadService is Service i of the workload in namespace ns (named w-i), of kind
// i modulo the kinds.
func workloadService(ns string, i int) *corev1.Service {
	k := workloadKinds[i%len(workloadKinds)]
	s := plainService(ns, fmt.Sprintf("w-%d", i))
	s.Labels = map[string]string{"kind": k.name}
	k.set(s, i/len(workloadKinds))
	return s
}

// plainService is a ClusterIP Service with a selector and one TCP port.
func plainService(ns, name string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP,
				TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

// createRun is what a run of creates saw.
type createRun struct {
	n       int             // creates sent
	lat     []time.Duration // of each create that succeeded, sorted
	wall    time.Duration   // from the first send to the last answer
	refused refusals
	created []*corev1.Service // what the API server answered, by index (nil: refused)
}

// rate is the creates that succeeded per second of the run.
func (r *createRun) rate() float64 {
	if r.wall <= 0 {
		return 0
	}
	return float64(len(r.lat)) / r.wall.Seconds()
}

// refusals counts failed requests by reason, with one error kept per reason.
type refusals struct {
	mu      sync.Mutex
	counts  map[string]int
	example map[string]error
}

func (r *refusals) add(err error) {
	reason := refusalReason(err)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counts == nil {
		r.counts, r.example = map[string]int{}, map[string]error{}
	}
	r.counts[reason]++
	if r.example[reason] == nil {
		r.example[reason] = err
	}
}

// total is the number of refusals.
func (r *refusals) total() int {
	n := 0
	for _, c := range r.counts {
		n += c
	}
	return n
}

// get is the count of reason.
func (r *refusals) get(reason string) int { return r.counts[reason] }

// String is "reason: count (an example)" per reason, or "none".
func (r *refusals) String() string {
	if len(r.counts) == 0 {
		return "none"
	}
	var out []string
	for k, n := range r.counts {
		out = append(out, fmt.Sprintf("%s: %d (%v)", k, n, r.example[k]))
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

// Refusal reasons the e2e counts apart.
const (
	// refusedAllocated is a create refused because an address or port it carried is
	// held: kube-apiserver's field error on spec.clusterIPs or a port, whose only
	// machine-readable part is the field and the type; the detail ("provided IP is
	// already allocated", "provided port is already allocated") is kube-apiserver's
	// wording (ipallocator.ErrAllocated, portallocator.ErrAllocated), nothing more.
	refusedAllocated = "already allocated"
	refusedTimeout   = "timeout"
)

// refusalReason classifies a failed request: refusedAllocated, refusedTimeout, else
// the API status reason (Invalid, InternalError, Forbidden...) or "transport".
func refusalReason(err error) string {
	var se apierrors.APIStatus
	if !errors.As(err, &se) {
		if errors.Is(err, context.DeadlineExceeded) {
			return refusedTimeout
		}
		return "transport"
	}
	st := se.Status()
	if st.Details != nil {
		for _, c := range st.Details.Causes {
			invalid := c.Type == metav1.CauseTypeFieldValueInvalid
			if invalid && strings.Contains(c.Message, "already allocated") {
				return refusedAllocated
			}
		}
	}
	if apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) {
		return refusedTimeout
	}
	return string(st.Reason)
}

// runCreates creates obj(i) for i in [0, n) from clients goroutines, each taking the
// next index when its create is answered, and times every create.
func runCreates(ctx context.Context, cs kubernetes.Interface, n, clients int,
	obj func(i int) *corev1.Service) *createRun {
	return runCreatesNotify(ctx, cs, n, clients, obj, nil)
}

// runCreatesNotify is runCreates that calls answered (when not nil) after each answer,
// success or refusal.
func runCreatesNotify(ctx context.Context, cs kubernetes.Interface, n, clients int,
	obj func(i int) *corev1.Service, answered func()) *createRun {
	r := &createRun{n: n, created: make([]*corev1.Service, n)}
	var next atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				s := obj(i)
				t0 := time.Now()
				got, err := cs.CoreV1().Services(s.Namespace).Create(ctx, s, metav1.CreateOptions{})
				d := time.Since(t0)
				if err != nil {
					r.refused.add(err)
				} else {
					mu.Lock()
					r.lat = append(r.lat, d)
					r.created[i] = got
					mu.Unlock()
				}
				if answered != nil {
					answered()
				}
			}
		})
	}
	wg.Wait()
	r.wall = time.Since(start)
	slices.Sort(r.lat)
	return r
}

// runDeletes deletes the Services of names in ns from clients goroutines.
func runDeletes(ctx context.Context, cs kubernetes.Interface, ns string, names []string, clients int) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed refusals
	for range clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(names) {
					return
				}
				err := cs.CoreV1().Services(ns).Delete(ctx, names[i], metav1.DeleteOptions{})
				if err != nil && !apierrors.IsNotFound(err) {
					failed.add(err)
				}
			}
		})
	}
	wg.Wait()
	if failed.total() > 0 {
		return fmt.Errorf("deletes failed: %s", failed.String())
	}
	return ctx.Err()
}

// pct is the q quantile of sorted durations (0 when there are none).
func pct(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}
