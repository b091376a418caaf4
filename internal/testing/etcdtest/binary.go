package etcdtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// etcdServerModule is the module whose main package is etcd's server binary.
const etcdServerModule = "go.etcd.io/etcd/server/v3"

var built struct {
	once sync.Once
	path string
	err  string
}

// EtcdBinary returns the path of an etcd server binary of the version go.mod requires
// (the etcd embedded in the tests), building it into the module's .bin/etcd-<version>
// the first time (a few seconds with a warm build cache; make etcd-matrix builds other
// versions beside it). It skips the test under -short, which builds nothing.
func EtcdBinary(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds etcd's server binary")
	}
	built.once.Do(func() { built.path, built.err = buildEtcd() })
	if built.err != "" {
		t.Fatalf("etcd binary: %s", built.err)
	}
	return built.path
}

// buildEtcd builds etcd's server at the version go.mod requires into
// <module root>/.bin/etcd-<version>, unless it is there; a build goes to a temporary
// file renamed into place, so that the tests of two packages may build it at once.
func buildEtcd() (string, string) {
	// A test runs in its package's directory, inside the module.
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", etcdServerModule).Output()
	if err != nil {
		return "", "go list -m " + etcdServerModule + ": " + err.Error()
	}
	version := strings.TrimSpace(string(out))
	out, err = exec.Command("go", "env", "GOMOD").Output()
	gomod := strings.TrimSpace(string(out))
	if err != nil || version == "" || gomod == "" || gomod == os.DevNull {
		return "", "go list -m, go env GOMOD: not in a module that requires " + etcdServerModule
	}
	root := filepath.Dir(gomod)
	bin := filepath.Join(root, ".bin", "etcd-"+version)
	if _, err := os.Stat(bin); err == nil {
		return bin, ""
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err.Error()
	}
	tmp, err := os.CreateTemp(filepath.Dir(bin), "etcd-build-*")
	if err != nil {
		return "", err.Error()
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command("go", "build", "-o", tmp.Name(), etcdServerModule)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "go build " + etcdServerModule + ": " + err.Error() + "\n" + string(out)
	}
	if err := os.Rename(tmp.Name(), bin); err != nil {
		return "", err.Error()
	}
	return bin, ""
}
