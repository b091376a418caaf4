package kube

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// TestDeployDryRun applies every manifest under deploy/ to a real kube-apiserver v1.37
// with a server-side dry run, as `kubectl apply --server-side --dry-run=server` does:
// the API server decodes, defaults, validates and admits each object, and stores
// nothing. The namespaces the manifests declare are created first (for real: a
// namespaced object's dry run needs its namespace). A namespaced object must name its
// namespace: applied with `kubectl apply -f` it would otherwise land in whatever
// namespace the operator's context has.
func TestDeployDryRun(t *testing.T) {
	ms := readManifests(t)
	if len(ms) == 0 {
		t.Fatalf("no manifest under %s", deployDir)
	}
	e := etcdtest.New(t)
	c := startCluster(t, clusterConfig{name: "deploy", etcd: e.Endpoint, reconciler: "lease",
		advertise: advertise})
	rc, err := clientcmd.BuildConfigFromFlags("", c.AdminConfig)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Admin.Discovery()))
	// Namespaces first, for real; then everything else, dry.
	slices.SortStableFunc(ms, func(a, b deployObject) int {
		return boolOrder(b.obj.GetKind() == "Namespace", a.obj.GetKind() == "Namespace")
	})
	ctx := context.Background()
	for _, m := range ms {
		gvk := m.obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Errorf("%s: the API server does not serve this kind: %v", m, err)
			continue
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			if m.obj.GetNamespace() == "" {
				t.Errorf("%s: a namespaced object without metadata.namespace", m)
				continue
			}
			ri = dyn.Resource(mapping.Resource).Namespace(m.obj.GetNamespace())
		}
		opts := metav1.ApplyOptions{FieldManager: "allocd-deploy-check", Force: true}
		if m.obj.GetKind() != "Namespace" {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		if _, err := ri.Apply(ctx, m.obj.GetName(), m.obj, opts); err != nil {
			t.Errorf("%s: server-side apply (dry run: %v): %v", m, opts.DryRun != nil, applyError(err))
			continue
		}
		t.Logf("%s: accepted (%s)", m, gvrString(mapping.Resource))
	}
}

// boolOrder orders true before false.
func boolOrder(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	default:
		return -1
	}
}

func gvrString(r schema.GroupVersionResource) string {
	if r.Group == "" {
		return r.Version + "/" + r.Resource
	}
	return r.Group + "/" + r.Version + "/" + r.Resource
}

// applyError spells out an API status error's causes (the fields the API server refused).
func applyError(err error) string {
	var se *apierrors.StatusError
	if !errors.As(err, &se) || se.ErrStatus.Details == nil {
		return err.Error()
	}
	var causes []string
	for _, c := range se.ErrStatus.Details.Causes {
		causes = append(causes, c.Field+": "+c.Message)
	}
	return se.ErrStatus.Message + " [" + strings.Join(causes, "; ") + "]"
}

// TestDeployPolicy keeps the authorization policy of allocd's manifest the same as
// deploy/authz/policy.json, the example policy the docs and the tests use.
func TestDeployPolicy(t *testing.T) {
	want, err := os.ReadFile(filepath.Join(deployDir, "authz", "policy.json"))
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, m := range readManifests(t) {
		if m.obj.GetKind() != "ConfigMap" {
			continue
		}
		got, ok, _ := unstructured.NestedString(m.obj.Object, "data", "policy.json")
		if !ok {
			continue
		}
		found++
		if got != string(want) {
			t.Errorf("%s: data policy.json differs from deploy/authz/policy.json: copy it again", m)
		}
	}
	if found == 0 {
		t.Errorf("no ConfigMap under %s carries policy.json", deployDir)
	}
}

// TestDeployFlags runs the binaries the manifests' containers name (allocd and
// allocd-bridge, by image) with --help, and fails on a flag in a container's arguments
// or an exec probe that the program does not have (the API server cannot tell; the
// Pod would crash-loop). A $(VAR) in the arguments must be one of the container's env
// variables: Kubernetes leaves an unknown one in the argument as it is.
func TestDeployFlags(t *testing.T) {
	help := map[string]string{}
	usage := func(prog string, sub string) string {
		k := prog + " " + sub
		if h, ok := help[k]; ok {
			return h
		}
		args := []string{"--help"}
		if sub != "" {
			args = []string{sub, "--help"}
		}
		out, err := exec.Command(binary(t, prog), args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", prog, strings.Join(args, " "), err, out)
		}
		help[k] = string(out)
		return help[k]
	}
	checked := 0
	for _, w := range workloads(t, readManifests(t)) {
		for _, c := range w.pod.Spec.Containers {
			for _, line := range commandLines(c) {
				prog, args := line[0], line[1:]
				if prog != "allocd" && prog != "allocd-bridge" {
					continue
				}
				sub := ""
				if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
					sub = args[0]
				}
				h := usage(prog, sub)
				for _, f := range flagNames(args) {
					if !hasFlag(h, f) {
						t.Errorf("%s, container %s: %s has no flag --%s", w.m, c.Name,
							strings.TrimSpace(prog+" "+sub), f)
					}
					checked++
				}
			}
			checkEnvRefs(t, w, c)
		}
	}
	if checked == 0 {
		t.Fatalf("no flag of allocd or allocd-bridge found in the manifests under %s", deployDir)
	}
	t.Logf("%d flags checked", checked)
}

// commandLines are what container c runs that the test checks: its own command line
// when its image is allocd's or allocd-bridge's, and its exec probes; each the program
// (its base name), then the arguments.
func commandLines(c corev1.Container) [][]string {
	var lines [][]string
	if p := program(c); p == "allocd" || p == "allocd-bridge" {
		line := append([]string{p}, c.Command[min(len(c.Command), 1):]...)
		lines = append(lines, append(line, c.Args...))
	}
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe, c.StartupProbe} {
		if p != nil && p.Exec != nil && len(p.Exec.Command) > 0 {
			cmd := p.Exec.Command
			lines = append(lines, append([]string{filepath.Base(cmd[0])}, cmd[1:]...))
		}
	}
	return lines
}

// hasFlag reports whether a --help output lists --name.
func hasFlag(help, name string) bool {
	return regexp.MustCompile(`(^|[\s,])--` + regexp.QuoteMeta(name) + `([\s=,]|$)`).MatchString(help)
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// checkEnvRefs fails on a $(VAR) in c's command or arguments that c's env lacks.
func checkEnvRefs(t *testing.T, w workload, c corev1.Container) {
	t.Helper()
	if len(c.EnvFrom) > 0 {
		return // the names come from a ConfigMap or Secret the test cannot see
	}
	var env []string
	for _, e := range c.Env {
		env = append(env, e.Name)
	}
	for _, a := range append(slices.Clone(c.Command), c.Args...) {
		for _, m := range envRef.FindAllStringSubmatch(a, -1) {
			if !slices.Contains(env, m[1]) {
				t.Errorf("%s, container %s: argument %q refers to $(%s), which is not in its env",
					w.m, c.Name, a, m[1])
			}
		}
	}
}
