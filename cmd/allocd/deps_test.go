package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestBinaryDeps checks, with `go list -deps`, that the allocd binary does not link
// package testing (test helpers of the daemon take an interface instead), nor the
// tests' leak check (goleak) and harnesses.
func TestBinaryDeps(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("go command not found: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/allocd/allocd/cmd/allocd").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/allocd/allocd/cmd/allocd/daemon") {
		t.Fatalf("go list -deps lists %d packages without cmd/allocd/daemon; the listing is not "+
			"what this test expects", len(deps))
	}
	for _, dep := range deps {
		if dep == "testing" || dep == "go.uber.org/goleak" ||
			strings.HasPrefix(dep, "github.com/allocd/allocd/internal/testing/") {
			t.Errorf("the allocd binary links %s, which is the tests'", dep)
		}
	}
}
