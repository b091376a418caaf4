package codeshape

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/allocd/allocd"

// A floor of the house: a package may import packages of lower floors, and packages of
// its own folder below it (allocator imports allocator/bitmap), never a higher floor or
// a sibling of its own floor. docs/contributors/architecture.md draws the same floors.
type floor struct {
	rank int
	name string
	// prefixes are module-relative package paths; a prefix covers the folder below it.
	prefixes []string
}

var floors = []floor{
	{1, "plumbing", []string{"internal/etcd", "internal/badrequest", "internal/loopback", "tlsfiles",
		"allocator/bitmap"}},
	{1, "API types", []string{"proto"}},
	{1, "Kubernetes types", []string{"endpoints/kube"}},
	{2, "domain", []string{"allocator", "masterlease"}},
	{2, "slice planning", []string{"endpoints/endpointslice"}},
	{3, "leadership", []string{"leader"}},
	{4, "controllers", []string{"repair", "endpoints"}},
	{5, "API surface", []string{"server", "client"}},
	{6, "process wiring", []string{"cmd/allocd/daemon", "cmd/allocd/cli"}},
	{7, "command", []string{"cmd/allocd"}},
	{8, "test harnesses", []string{"internal/testing"}},
	{8, "programs", []string{"tools"}},
	{8, "deployment checks", []string{"deploy"}},
}

// floorOf returns the floor of a module-relative package path: the one with the longest
// matching prefix.
func floorOf(rel string) (floor, bool) {
	var best floor
	n := -1
	for _, f := range floors {
		for _, p := range f.prefixes {
			if (rel == p || strings.HasPrefix(rel, p+"/")) && len(p) > n {
				best, n = f, len(p)
			}
		}
	}
	return best, n >= 0
}

// violations returns every import of imports (package → what its non-test files
// import, module-relative) that breaks a rule of the house:
//   - an import of a package on the same or a higher floor, unless the imported package
//     is in the importer's own folder tree;
//   - a domain, leadership or controller package importing the API types (proto
//     conversion lives in server/: the domain has its own types);
//   - a package outside the test harnesses and programs importing a test harness;
//   - a package no floor covers (a new folder must be given one).
func violations(imports map[string][]string) []string {
	var out []string
	for pkg, deps := range imports {
		pf, ok := floorOf(pkg)
		if !ok {
			out = append(out,
				fmt.Sprintf("%s is on no floor of the house: give it one in layout_test.go", pkg))
			continue
		}
		for _, dep := range deps {
			df, ok := floorOf(dep)
			switch {
			case !ok:
				out = append(out, fmt.Sprintf("%s imports %s, which is on no floor", pkg, dep))
			case strings.HasPrefix(dep, pkg+"/"):
				// its own folder tree: allocator → allocator/bitmap
			case df.name == "test harnesses" && pf.rank < 8:
				out = append(out, fmt.Sprintf("%s (%s) imports the test harness %s", pkg, pf.name, dep))
			case df.name == "API types" && pf.rank >= 2 && pf.rank <= 4:
				out = append(out,
					fmt.Sprintf("%s (%s) imports the API types %s: convert in server/", pkg, pf.name, dep))
			case df.rank >= pf.rank && pf.rank < 8:
				out = append(out,
					fmt.Sprintf("%s (%s, floor %d) imports %s (%s, floor %d): an import that runs back up",
						pkg, pf.name, pf.rank, dep, df.name, df.rank))
			}
		}
	}
	sort.Strings(out)
	return out
}

// TestLayout checks the imports of every package of the module against the floors.
func TestLayout(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list over the module")
	}
	imports := moduleImports(t)
	if len(imports) < 20 {
		t.Fatalf("go list found %d packages; the listing is not what this test expects", len(imports))
	}
	for _, v := range violations(imports) {
		t.Error(v)
	}
}

// TestLayoutRules plants imports that break each rule and checks that violations
// reports them, so that TestLayout cannot pass by checking nothing.
func TestLayoutRules(t *testing.T) {
	for _, tc := range []struct {
		pkg, dep string
		bad      bool
	}{
		{"allocator", "server", true},
		{"allocator", "cmd/allocd/daemon", true},
		{"repair", "cmd/allocd/cli", true},
		{"masterlease", "proto/allocd/v1", true},
		{"endpoints", "proto/allocd/v1", true},
		{"endpoints", "endpoints/endpointslice", false},
		{"endpoints/endpointslice", "endpoints/kube", false},
		{"endpoints/kube", "endpoints/endpointslice", true},
		{"endpoints/endpointslice", "endpoints", true},
		{"endpoints/endpointslice", "leader", true},
		{"leader", "repair", true},
		{"masterlease", "repair", true},
		{"repair", "endpoints", true},
		{"server", "internal/testing/etcdtest", true},
		{"internal/etcd/call", "allocator", true},
		{"cmd/allocd/daemon", "internal/testing/devpki", true},
		{"client", "server", true},
		{"newfolder", "allocator", true},
		{"allocator", "allocator/bitmap", false},
		{"repair", "allocator", false},
		{"repair", "leader", false},
		{"server", "proto/allocd/v1", false},
		{"server", "endpoints", false},
		{"cmd/allocd/daemon", "server", false},
		{"cmd/allocd", "cmd/allocd/daemon", false},
		{"internal/testing/fault", "cmd/allocd/daemon", false},
		{"tools/bench", "internal/etcd/embedded", false},
		{"cmd/allocd", "cmd/allocd/app", false},
		{"cmd/allocd/app", "cmd/allocd/daemon", false},
		{"cmd/allocd/daemon", "cmd/allocd/app", true},
		{"cmd/allocd/cli", "cmd/allocd/app", true},
		{"tools/gendocs", "cmd/allocd/app", false},
		{"internal/testing/doctest", "cmd/allocd/daemon", false},
		{"cmd/allocd/app", "internal/testing/doctest", true},
	} {
		got := violations(map[string][]string{tc.pkg: {tc.dep}})
		if (len(got) > 0) != tc.bad {
			t.Errorf("violations(%s imports %s) = %q; want a violation: %v", tc.pkg, tc.dep, got, tc.bad)
		}
	}
}

// moduleImports lists, with go list, what the non-test files of each package of the
// module import from the module, as module-relative paths.
func moduleImports(t *testing.T) map[string][]string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("go command not found: %v", err)
	}
	cmd := exec.Command(goTool, "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, module+"/...")
	cmd.Dir = filepath.Join("..", "..", "..")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	imports := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := rel(fields[0])
		imports[pkg] = nil
		for _, dep := range fields[1:] {
			if r := rel(dep); r != dep {
				imports[pkg] = append(imports[pkg], r)
			}
		}
	}
	return imports
}

func rel(path string) string {
	if path == module {
		return "."
	}
	return strings.TrimPrefix(path, module+"/")
}

// TestNoBuildOutputsInGit fails for a tracked file that is a compiled binary or etcd
// data (a member's WAL or snapshot): `git ls-files` of a fresh clone has neither.
func TestNoBuildOutputsInGit(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("not a git checkout (%v)", err)
	}
	files := strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	if len(files) < 50 {
		t.Fatalf("git ls-files lists %d files; the listing is not what this test expects", len(files))
	}
	for _, f := range files {
		if strings.Contains(f, "member/wal/") || strings.Contains(f, "member/snap/") ||
			strings.HasSuffix(f, ".wal") {
			t.Errorf("%s is etcd data; delete it from git (.gitignore keeps allocd-data/ out)", f)
			continue
		}
		b, err := readHead(filepath.Join(root, f), 4)
		if err != nil {
			continue // deleted in the work tree
		}
		for _, magic := range [][]byte{{0x7f, 'E', 'L', 'F'}, {0xcf, 0xfa, 0xed, 0xfe}, {'M', 'Z'}} {
			if bytes.HasPrefix(b, magic) {
				t.Errorf("%s is a compiled binary; delete it from git and .gitignore it", f)
			}
		}
	}
}

func readHead(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	m, _ := f.Read(b)
	return b[:m], nil
}
