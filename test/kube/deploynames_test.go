package kube

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// TestDeployNames checks that every in-cluster name the manifests dial resolves, by
// the manifests alone, to the program it is meant for, on a port it listens on:
//
//   - <service>.<namespace>.svc: a Service of the manifests in that namespace whose
//     selector picks the Pods of the program, and whose port is one the program's
//     container declares;
//   - <pod>.<service>.<namespace>.svc: a Pod of a StatefulSet whose serviceName is that
//     headless Service (the only way such a name exists);
//   - an admission webhook's service: a Service of the manifests with that port, whose
//     target port a container of the Pods it selects declares.
//
// The names are those of allocd's --advertise-address and --etcd-servers, the
// clients' --allocd-address, and etcd's own advertised URLs and --initial-cluster.
func TestDeployNames(t *testing.T) {
	ms := readManifests(t)
	ws := workloads(t, ms)
	services := map[string]corev1.Service{}
	for _, m := range ms {
		if m.obj.GetKind() != "Service" {
			continue
		}
		var s corev1.Service
		b, _ := json.Marshal(m.obj.Object)
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		services[s.Namespace+"/"+s.Name] = s
	}
	byProgram := map[string][]podContainer{}
	for _, w := range ws {
		for _, c := range w.pod.Spec.Containers {
			byProgram[program(c)] = append(byProgram[program(c)], podContainer{w: w, c: c})
		}
	}
	type dial struct {
		from    podContainer
		flag    string
		address string // host:port
		to      string // the program
	}
	var dials []dial
	for _, from := range byProgram["allocd"] {
		for i := range from.w.replicas {
			dials = append(dials, dial{from, "advertise-address",
				from.w.expand(flagValue(from.c.Args, "advertise-address"), i), "allocd"})
		}
		for _, u := range strings.Split(flagValue(from.c.Args, "etcd-servers"), ",") {
			dials = append(dials, dial{from, "etcd-servers", urlHostPort(t, u), "etcd"})
		}
	}
	for _, from := range byProgram["allocd-bridge"] {
		if a := flagValue(from.c.Args, "allocd-address"); a != "" {
			for _, target := range strings.Split(strings.TrimPrefix(a, "dns:///"), ",") {
				dials = append(dials, dial{from, "allocd-address", target, "allocd"})
			}
		}
	}
	for _, from := range byProgram["etcd"] {
		for i := range from.w.replicas {
			for _, f := range []string{"advertise-client-urls", "initial-advertise-peer-urls"} {
				u := from.w.expand(flagValue(from.c.Args, f), i)
				dials = append(dials, dial{from, f, urlHostPort(t, u), "etcd"})
			}
		}
		for _, member := range strings.Split(flagValue(from.c.Args, "initial-cluster"), ",") {
			_, u, _ := strings.Cut(member, "=")
			dials = append(dials, dial{from, "initial-cluster", urlHostPort(t, u), "etcd"})
		}
	}
	if len(dials) == 0 {
		t.Fatal("no address dialled in the manifests")
	}
	if _, err := webhookTargets(ms, ws); err != nil {
		t.Error(err)
	}
	for _, d := range dials {
		if err := resolves(d.address, byProgram[d.to], services); err != nil {
			t.Errorf("%s --%s=%s: %v", d.from, d.flag, d.address, err)
		}
	}
	t.Logf("%d addresses checked", len(dials))
}

func urlHostPort(t *testing.T, s string) string {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil || u.Port() == "" {
		t.Fatalf("URL %q: want a host and a port (%v)", s, err)
	}
	return u.Host
}

// resolves says why address does not reach one of targets (nil when it does).
func resolves(address string, targets []podContainer, services map[string]corev1.Service) error {
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("port %q: %w", portStr, err)
	}
	parts := strings.Split(strings.TrimSuffix(host, ".cluster.local"), ".")
	if len(parts) < 3 || parts[len(parts)-1] != "svc" || len(parts) > 4 {
		return fmt.Errorf("not a Service's or a StatefulSet Pod's name (<pod>.<service>.<namespace>.svc)")
	}
	ns, svcName := parts[len(parts)-2], parts[len(parts)-3]
	svc, ok := services[ns+"/"+svcName]
	if !ok {
		return fmt.Errorf("no Service %s/%s in the manifests", ns, svcName)
	}
	for _, tc := range targets {
		if tc.w.m.obj.GetNamespace() != ns || len(svc.Spec.Selector) == 0 ||
			!labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(tc.w.pod.Labels)) {
			continue
		}
		if !listens(tc.c, port) {
			return fmt.Errorf("%s declares no containerPort %d", tc, port)
		}
		if len(parts) == 3 {
			return nil
		}
		if tc.w.m.obj.GetKind() != "StatefulSet" || svc.Spec.ClusterIP != corev1.ClusterIPNone {
			return fmt.Errorf("a Pod's name needs a StatefulSet and a headless Service")
		}
		serviceName, _, _ := unstructured.NestedString(tc.w.m.obj.Object, "spec", "serviceName")
		if serviceName != svcName {
			return fmt.Errorf("%s's serviceName is %q, not %q: its Pods have no name under %s", tc.w.m,
				serviceName, svcName, svcName)
		}
		for i := range tc.w.replicas {
			if parts[0] == fmt.Sprintf("%s-%d", tc.w.m.obj.GetName(), i) {
				return nil
			}
		}
		return fmt.Errorf("%s has no Pod %s (%d replicas)", tc.w.m, parts[0], tc.w.replicas)
	}
	return fmt.Errorf("Service %s/%s selects no Pod of the program meant", ns, svcName)
}

func listens(c corev1.Container, port int) bool {
	for _, p := range c.Ports {
		if int(p.ContainerPort) == port {
			return true
		}
	}
	return false
}

// webhookTarget is the container that serves an admission webhook of the manifests,
// and the name kube-apiserver verifies its certificate for.
type webhookTarget struct {
	webhook string
	host    string
	pc      podContainer
}

// webhookTargets resolves the service of every webhook of the manifests'
// Mutating- and ValidatingWebhookConfigurations to the container serving it.
func webhookTargets(ms []deployObject, ws []workload) ([]webhookTarget, error) {
	services := map[string]corev1.Service{}
	for _, m := range ms {
		if m.obj.GetKind() == "Service" {
			var s corev1.Service
			b, _ := json.Marshal(m.obj.Object)
			if err := json.Unmarshal(b, &s); err != nil {
				return nil, fmt.Errorf("%s: %w", m, err)
			}
			services[s.Namespace+"/"+s.Name] = s
		}
	}
	var out []webhookTarget
	for _, m := range ms {
		k := m.obj.GetKind()
		if k != "MutatingWebhookConfiguration" && k != "ValidatingWebhookConfiguration" {
			continue
		}
		var cfg admissionv1.MutatingWebhookConfiguration // the fields read are the same in both
		b, _ := json.Marshal(m.obj.Object)
		if err := json.Unmarshal(b, &cfg); err != nil {
			return nil, fmt.Errorf("%s: %w", m, err)
		}
		for _, wh := range cfg.Webhooks {
			ref := wh.ClientConfig.Service
			if ref == nil {
				continue
			}
			target, err := serviceTarget(services, ws, ref.Namespace, ref.Name, ptrOr(ref.Port, 443))
			if err != nil {
				return nil, fmt.Errorf("%s webhook %s: %w", m, wh.Name, err)
			}
			out = append(out, webhookTarget{webhook: wh.Name, host: ref.Name + "." + ref.Namespace + ".svc",
				pc: target})
		}
	}
	return out, nil
}

func ptrOr(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}

// serviceTarget is the container behind port of Service ns/name: of a Pod the Service
// selects, declaring the port's targetPort (by name or number).
func serviceTarget(services map[string]corev1.Service, ws []workload, ns, name string,
	port int32) (podContainer, error) {
	svc, ok := services[ns+"/"+name]
	if !ok {
		return podContainer{}, fmt.Errorf("no Service %s/%s in the manifests", ns, name)
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Port == port {
			sp = &svc.Spec.Ports[i]
		}
	}
	if sp == nil {
		return podContainer{}, fmt.Errorf("Service %s/%s has no port %d", ns, name, port)
	}
	for _, w := range ws {
		if w.m.obj.GetNamespace() != ns || len(svc.Spec.Selector) == 0 ||
			!labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(w.pod.Labels)) {
			continue
		}
		for _, c := range w.pod.Spec.Containers {
			for _, cp := range c.Ports {
				if targets(sp, cp) {
					return podContainer{w: w, c: c}, nil
				}
			}
		}
	}
	return podContainer{}, fmt.Errorf("Service %s/%s port %d: no container of the Pods it selects declares "+
		"its target port %s", ns, name, port, sp.TargetPort.String())
}

// targets reports whether Service port sp reaches container port cp: its targetPort
// names cp, or is cp's number, or is unset and sp's own number is cp's.
func targets(sp *corev1.ServicePort, cp corev1.ContainerPort) bool {
	tp := sp.TargetPort
	switch {
	case tp.StrVal != "":
		return tp.StrVal == cp.Name
	case tp.IntValue() == 0:
		return sp.Port == cp.ContainerPort
	default:
		return tp.IntValue() == int(cp.ContainerPort)
	}
}
