package kube

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// deployDir is the repository's deploy/: every manifest under it is checked.
const deployDir = "../../deploy"

// deployObject is one object of a YAML file under deploy/.
type deployObject struct {
	file  string // relative to deploy/
	index int    // its place among the file's documents, from 0
	obj   *unstructured.Unstructured
}

// String names the manifest for messages: file#index Kind namespace/name.
func (m deployObject) String() string {
	id := m.obj.GetName()
	if ns := m.obj.GetNamespace(); ns != "" {
		id = ns + "/" + id
	}
	return fmt.Sprintf("%s#%d %s %s", m.file, m.index, m.obj.GetKind(), id)
}

// readManifests reads every document of every .yaml and .yml file under deploy/; a
// document that is not a Kubernetes object (no apiVersion or kind) fails the test.
func readManifests(t testing.TB) []deployObject {
	t.Helper()
	var out []deployObject
	err := filepath.WalkDir(deployDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if ext := filepath.Ext(path); ext != ".yaml" && ext != ".yml" {
			return nil
		}
		rel, _ := filepath.Rel(deployDir, path)
		docs, err := yamlDocuments(path)
		if err != nil {
			return err
		}
		for i, doc := range docs {
			var m map[string]any
			if err := yaml.Unmarshal(doc, &m); err != nil {
				t.Errorf("%s#%d: %v", rel, i, err)
				continue
			}
			if m == nil {
				continue // an empty document: only comments
			}
			obj := &unstructured.Unstructured{Object: m}
			if obj.GetAPIVersion() == "" || obj.GetKind() == "" {
				t.Errorf("%s#%d: not a Kubernetes object (no apiVersion or kind): every YAML file under "+
					"deploy/ is applied", rel, i)
				continue
			}
			out = append(out, deployObject{file: rel, index: i, obj: obj})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// yamlDocuments splits a YAML file into its documents as kubectl does.
func yamlDocuments(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		docs = append(docs, doc)
	}
}

// workload is a manifest that runs Pods: its template and how many replicas.
type workload struct {
	m        deployObject
	replicas int
	pod      corev1.PodTemplateSpec
}

// workloads are the manifests of Deployments, StatefulSets and DaemonSets.
func workloads(t testing.TB, ms []deployObject) []workload {
	t.Helper()
	var out []workload
	for _, m := range ms {
		switch m.obj.GetKind() {
		case "Deployment", "StatefulSet", "DaemonSet":
		default:
			continue
		}
		b, err := json.Marshal(m.obj.Object)
		if err != nil {
			t.Fatal(err)
		}
		var w struct {
			Spec struct {
				Replicas *int                   `json:"replicas"`
				Template corev1.PodTemplateSpec `json:"template"`
			} `json:"spec"`
		}
		if err := json.Unmarshal(b, &w); err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		n := 1
		if w.Spec.Replicas != nil {
			n = *w.Spec.Replicas
		}
		out = append(out, workload{m: m, replicas: n, pod: w.Spec.Template})
	}
	return out
}

// program is what a container runs, by its image's name without registry and tag:
// allocd, allocd-bridge, etcd.
func program(c corev1.Container) string {
	name := c.Image
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	name, _, _ = strings.Cut(name, "@")
	name, _, _ = strings.Cut(name, ":")
	return name
}

// flagValues are the values of a command line's --name=value and --name value flags.
func flagValues(args []string, name string) []string {
	var out []string
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			out = append(out, v)
		} else if a == "--"+name && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			out = append(out, args[i+1])
		}
	}
	return out
}

// flagValue is the last value of flag name ("" when none).
func flagValue(args []string, name string) string {
	v := flagValues(args, name)
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// flagNames are the names of the flags on a command line (--name or --name=value).
func flagNames(args []string) []string {
	var out []string
	for _, a := range args {
		if n, ok := strings.CutPrefix(a, "--"); ok && n != "" {
			n, _, _ = strings.Cut(n, "=")
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	return out
}

// expand replaces $(POD_NAME) in s by the name of replica i of w's StatefulSet.
func (w workload) expand(s string, i int) string {
	return strings.ReplaceAll(s, "$(POD_NAME)", fmt.Sprintf("%s-%d", w.m.obj.GetName(), i))
}
