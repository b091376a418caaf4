package client_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// forbiddenDeps are import path fragments that must not reach a shim's build through
// this package: the etcd server, Prometheus, and the code generators.
var forbiddenDeps = []string{
	"go.etcd.io/etcd/server",
	"github.com/prometheus",
	"bufbuild",
	"protoc-gen",
	// grpc-go's certificate providers and authorization engine (package tlsfiles,
	// the daemon): a shim that wants certificates re-read from files imports tlsfiles.
	"go-spiffe",
	"envoyproxy",
	// the operator command line's (cmd/allocd/cli): its flags and YAML output.
	"github.com/spf13/",
	"sigs.k8s.io/yaml",
	// the tests' goroutine-leak check and harnesses.
	"go.uber.org/goleak",
	"github.com/allocd/allocd/internal/testing/",
}

// TestDeps checks, with `go list -deps`, what importing the client package builds.
func TestDeps(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("go command not found: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/allocd/allocd/client").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "google.golang.org/grpc") {
		t.Fatalf("go list -deps lists %d packages without google.golang.org/grpc; the listing is not what "+
			"this test expects", len(deps))
	}
	for _, dep := range deps {
		for _, bad := range forbiddenDeps {
			if strings.Contains(dep, bad) {
				t.Errorf("client depends on %s (matches %q)", dep, bad)
			}
		}
	}
}
