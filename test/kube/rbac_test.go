package kube

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// manifest is the bridge's deployment manifest, from the repository.
const manifest = "../../deploy/kube/allocd-bridge.yaml"

// applyBridgeRBAC creates the manifest's ClusterRole and binds it to user, so that the
// bridge runs in the test with exactly the rights the manifest grants.
func applyBridgeRBAC(t testing.TB, cs kubernetes.Interface, user string) {
	t.Helper()
	b, err := os.ReadFile(filepath.FromSlash(manifest))
	if err != nil {
		t.Fatal(err)
	}
	var role *rbacv1.ClusterRole
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s: %v", manifest, err)
		}
		if meta.Kind == "ClusterRole" {
			role = &rbacv1.ClusterRole{}
			if err := yaml.UnmarshalStrict([]byte(doc), role); err != nil {
				t.Fatalf("%s: ClusterRole: %v", manifest, err)
			}
		}
	}
	if role == nil {
		t.Fatalf("%s has no ClusterRole", manifest)
	}
	ctx := context.Background()
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "allocd-bridge-e2e"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
