package kube

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// svcChange is a change of a Service of one kind: what it gives up or newly needs.
type svcChange struct {
	kind, what string
	apply      func(s *corev1.Service)
}

// workloadChanges are the changes the e2e makes to the workload's Services, by kind:
// type changes both ways, ports added and removed, family policy up and down, the
// healthCheckNodePort dropped, node ports turned on for a LoadBalancer.
var workloadChanges = []svcChange{
	{"single-stack", "ClusterIP → NodePort", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
	}},
	{"nodeport", "NodePort → ClusterIP", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeClusterIP
	}},
	{"loadbalancer", "LoadBalancer → ClusterIP", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeClusterIP
	}},
	{"prefer-dual-stack", "ClusterIP → ExternalName", func(s *corev1.Service) {
		s.Spec.Type, s.Spec.ExternalName, s.Spec.Selector = corev1.ServiceTypeExternalName, "example.org", nil
	}},
	{"externalname", "ExternalName → ClusterIP", func(s *corev1.Service) {
		s.Spec.Type, s.Spec.ExternalName = corev1.ServiceTypeClusterIP, ""
		s.Spec.Selector = map[string]string{"app": s.Name}
	}},
	{"nodeport-tcp-udp", "a port removed", func(s *corev1.Service) { s.Spec.Ports = s.Spec.Ports[:2] }},
	{"requested-nodeport", "a port added", func(s *corev1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "https", Port: 443,
			Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8443)})
	}},
	{"requested-clusterip", "SingleStack → PreferDualStack", func(s *corev1.Service) {
		s.Spec.IPFamilyPolicy = policy(corev1.IPFamilyPolicyPreferDualStack)
	}},
	{"require-dual-stack", "RequireDualStack → SingleStack", func(s *corev1.Service) {
		s.Spec.IPFamilyPolicy = policy(corev1.IPFamilyPolicySingleStack)
		s.Spec.ClusterIPs, s.Spec.IPFamilies = s.Spec.ClusterIPs[:1], s.Spec.IPFamilies[:1]
	}},
	{"loadbalancer-local", "externalTrafficPolicy Local → Cluster", func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
		s.Spec.HealthCheckNodePort = 0
	}},
	{"loadbalancer-no-nodeports", "allocateLoadBalancerNodePorts false → true", func(s *corev1.Service) {
		yes := true
		s.Spec.AllocateLoadBalancerNodePorts = &yes
	}},
}

// changeWorkload makes each change of workloadChanges to every other Service of its
// kind among created (from clients goroutines), and returns how many it made.
func changeWorkload(ctx context.Context, cs kubernetes.Interface, created []*corev1.Service,
	clients int) (int, error) {
	byKind := map[string]svcChange{}
	for _, c := range workloadChanges {
		byKind[c.kind] = c
	}
	seen := map[string]int{}
	type job struct {
		s *corev1.Service
		c svcChange
	}
	var jobs []job
	for _, s := range created {
		if s == nil {
			continue
		}
		c, ok := byKind[s.Labels["kind"]]
		if !ok {
			continue
		}
		if seen[c.kind]++; seen[c.kind]%2 == 1 {
			jobs = append(jobs, job{s, c})
		}
	}
	errs := make(chan error, len(jobs))
	var wg sync.WaitGroup
	next := make(chan job)
	for range clients {
		wg.Go(func() {
			for j := range next {
				if err := updateService(ctx, cs, j.s.Namespace, j.s.Name, j.c.apply); err != nil {
					errs <- fmt.Errorf("%s/%s %s: %w", j.s.Namespace, j.s.Name, j.c.what, err)
				}
			}
		})
	}
	for _, j := range jobs {
		next <- j
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		return len(jobs), err
	}
	return len(jobs), nil
}

// updateService reads the Service, changes it with fn and writes it, again on a
// conflict.
func updateService(ctx context.Context, cs kubernetes.Interface, ns, name string,
	fn func(*corev1.Service)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := cs.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		fn(s)
		_, err = cs.CoreV1().Services(ns).Update(ctx, s, metav1.UpdateOptions{})
		return err
	})
}
