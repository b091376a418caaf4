package doctest

import (
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allocd/allocd/cmd/allocd/cli"
	"github.com/allocd/allocd/cmd/allocd/daemon"
	"github.com/allocd/allocd/internal/testing/leakcheck"
)

// root is the repository, from this package's directory.
var root = filepath.Join("..", "..", "..")

// A claim is how the test runs a marked block: the block's commands run against allocd
// with tools (grpcurl, and the allocd binary for the command line) first on PATH, their
// outputs compared as norm masks them. A block has at least min commands, so that a
// block that parses as nothing fails.
type claim struct {
	cli  bool // the allocd command line on PATH (builds the binary)
	norm func(s string, varies bool) string
	min  int
}

// claims names every marked block of README.md and docs/; a block that none claims
// fails TestDocMarkers.
var claims = map[string]claim{
	"quick-tour":          {cli: true, norm: normalizeCLI, min: 6},  // README.md
	"cli-tour":            {cli: true, norm: normalizeCLI, min: 30}, // docs/operators/cli-tour.md
	"grpcurl-tour":        {cli: false, norm: normalize, min: 40},   // docs/operators/grpcurl-tour.md
	"service-cidrs-tour":  {cli: false, norm: normalize, min: 8},    // docs/operators/service-cidrs.md
	"endpointslices-tour": {cli: true, norm: normalizeCLI, min: 9},  // docs/shims/endpointslices.md
}

// docs reads every markdown file that the tests cover, by path relative to root.
func docs(t *testing.T) map[string]string {
	t.Helper()
	files, err := Files(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("Files found %d markdown files (%q); the docs are not where this test expects", len(files),
			files)
	}
	texts := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		texts[f] = string(b)
	}
	return texts
}

// blocks returns every marked block of the docs by name, failing t on bad markers and
// on a name used twice.
func blocks(t *testing.T) map[string]Block {
	t.Helper()
	found := map[string]Block{}
	for file, text := range docs(t) {
		bs, errs := Blocks(file, text)
		for _, err := range errs {
			t.Error(err)
		}
		for _, b := range bs {
			if other, ok := found[b.Name]; ok {
				t.Errorf("%s:%d: block %s again (first in %s:%d); names are unique across the docs",
					b.File, b.Line, b.Name, other.File, other.Line)
			}
			found[b.Name] = b
		}
	}
	return found
}

// TestDocMarkers fails on a marked block that no claim runs, and on a claim whose
// block is gone (a tour that would silently stop being checked).
func TestDocMarkers(t *testing.T) {
	found := blocks(t)
	for name, b := range found {
		if _, ok := claims[name]; !ok {
			t.Errorf("%s:%d: marked block %s is claimed by no test: add it to claims in %s",
				b.File, b.Line, name, "internal/testing/doctest/doctest_test.go")
		}
	}
	for name := range claims {
		if _, ok := found[name]; !ok {
			t.Errorf("claims has %s, but no doc has <!-- %s:begin --> ... <!-- %s:end -->", name, name, name)
		}
	}
}

// TestDocLinks fails on a relative link of README.md or docs/ whose file or #anchor
// does not exist, and on a heading that its file has twice.
func TestDocLinks(t *testing.T) {
	texts := docs(t)
	files := make([]string, 0, len(texts))
	for f, text := range texts {
		files = append(files, f)
		seen := map[string]int{}
		for _, h := range Headings(text) {
			if first, ok := seen[Slug(h.Text)]; ok {
				t.Errorf("%s:%d: heading %q again (line %d): headings are unique within a file", f, h.Line,
					h.Text, first)
			}
			seen[Slug(h.Text)] = h.Line
		}
	}
	sort.Strings(files)
	for _, p := range CheckLinks(root, files) {
		t.Error(p)
	}
}

// TestDocTours runs every claimed block against a real allocd and compares each
// command's output with the doc's; UPDATE_DOCS=1 writes the outputs into the docs.
func TestDocTours(t *testing.T) {
	if testing.Short() {
		t.Skip("runs grpcurl, and the allocd binary, as processes: seconds")
	}
	found := blocks(t)
	names := make([]string, 0, len(claims))
	for name := range claims {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			c := claims[name]
			b, ok := found[name]
			if !ok {
				t.Fatalf("no doc has the block %s", name)
			}
			path := []string{filepath.Dir(findGrpcurl(t))}
			if c.cli {
				path = append([]string{filepath.Dir(buildAllocd(t))}, path...)
			}
			runTour(t, b, c, path)
		})
	}
}

// runTour runs the commands of b against allocd, started in process where b says
// `go run ./cmd/allocd ...`, with path's directories first on PATH, and compares what
// each prints, as c.norm masks it, with the doc.
func runTour(t *testing.T, b Block, c claim, path []string) {
	steps := Steps(b.Body)
	if len(steps) < c.min {
		t.Fatalf("%s:%d: %s has %d commands; want at least %d (the whole tour)", b.File, b.Line, b.Name,
			len(steps), c.min)
	}
	var d *daemon.Daemon
	outputs := make([]string, len(steps))
	for i, s := range steps {
		if strings.HasPrefix(s.Cmd, "go run ./cmd/allocd") {
			d = startFromDoc(t, strings.TrimPrefix(s.Cmd, "go run ./cmd/allocd"))
			continue
		}
		if d == nil {
			t.Fatalf("%s: step %d (%s) comes before the block starts allocd", b.Name, i, s.Cmd)
		}
		outputs[i] = runStep(d, s.Cmd, path)
		got, want := c.norm(outputs[i], s.Varies), c.norm(s.Want, s.Varies)
		if got != want && os.Getenv("UPDATE_DOCS") == "" {
			t.Errorf("%s (%s) step %d:\n$ %s\ngot:\n%s\nwant (as the doc says):\n%s", b.Name, b.File, i,
				s.Cmd, outputs[i], s.Want)
		}
	}
	if os.Getenv("UPDATE_DOCS") != "" {
		// UPDATE_DOCS=1 go test -run TestDocTours ./internal/testing/doctest writes the
		// outputs of this run into the docs, for a reviewer to read in the diff.
		file := filepath.Join(root, filepath.FromSlash(b.File))
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		updated, err := Replace(string(text), b.Name, Rewrite(b.Body, outputs))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(updated), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// runStep runs cmd in bash against d, with path first on PATH and $ALLOCD_SERVER set
// to d, and returns what it printed, with d's address written as the doc's.
func runStep(d *daemon.Daemon, cmd string, path []string) string {
	cmd = strings.ReplaceAll(cmd, "127.0.0.1:8080", d.GRPCAddr())
	cmd = strings.ReplaceAll(cmd, "127.0.0.1:9090", d.MetricsAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sh := exec.CommandContext(ctx, "bash", "-c", cmd)
	sh.Env = append(os.Environ(),
		"PATH="+strings.Join(append(path, os.Getenv("PATH")), string(os.PathListSeparator)),
		cli.ServerEnv+"="+d.GRPCAddr())
	out, _ := sh.CombinedOutput()
	// What allocd says of itself (the repair leader) is said of the doc's address.
	return strings.ReplaceAll(string(out), d.GRPCAddr(), "127.0.0.1:8080")
}

// startFromDoc starts allocd in process with the doc's flags, on test addresses.
func startFromDoc(t *testing.T, args string) *daemon.Daemon {
	t.Helper()
	return daemon.StartForTest(t, func(c *daemon.Config) {
		keep := *c
		fs := flag.NewFlagSet("doc", flag.ContinueOnError)
		c.RegisterFlags(fs)
		if err := fs.Parse(strings.Fields(strings.ReplaceAll(args, "\\\n", " "))); err != nil {
			t.Fatalf("start flags %q: %v", args, err)
		}
		c.DataDir, c.GRPCAddress, c.MetricsAddress = keep.DataDir, keep.GRPCAddress, keep.MetricsAddress
	})
}

var (
	buildOnce sync.Once
	built     string
	buildErr  string
)

// buildAllocd builds the allocd binary once per test run and returns its path.
func buildAllocd(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "doctest")
		if err != nil {
			buildErr = err.Error()
			return
		}
		built = filepath.Join(dir, "allocd")
		cmd := exec.Command("go", "build", "-o", built, "./cmd/allocd")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = err.Error() + "\n" + string(out)
		}
	})
	if buildErr != "" {
		t.Fatalf("go build ./cmd/allocd: %s", buildErr)
	}
	return built
}

// TestMain removes the binary that buildAllocd built, and checks for goroutine leaks.
func TestMain(m *testing.M) {
	leakcheck.MustTestMain(m, func() {
		if built != "" {
			os.RemoveAll(filepath.Dir(built))
		}
	})
}

// findGrpcurl returns grpcurl's path, skipping the test without it (outside CI).
func findGrpcurl(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("grpcurl"); err == nil {
		return p
	}
	if p, err := filepath.Abs(filepath.Join(root, ".bin", "grpcurl")); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("grpcurl not found: `make tools` installs it into .bin")
	}
	t.Skip("grpcurl not found: run `make tools` (CI runs this test)")
	return ""
}

var (
	volatile = regexp.MustCompile(`"(revision|createRevision|modRevision|leaseId|remainingTtlSeconds|` +
		`allocateTime|startTime|duration|age|allocationRevision|snapshotRevision|leader|createTime|` +
		`deleteTime)": ("[^"]*"|-?\d+)`)
	ipv4 = regexp.MustCompile(`\b\d{1,3}(\.\d{1,3}){3}\b`)
	ipv6 = regexp.MustCompile(`\b[0-9a-f]{1,4}(:[0-9a-f]{0,4}){2,7}\b`)
	port = regexp.MustCompile(`\b3[0-2]\d{3}\b`)
)

// normalize masks what changes from run to run in grpcurl's output: revisions, lease
// ids, times and TTLs left; with varies, also addresses and node ports.
func normalize(s string, varies bool) string {
	s = volatile.ReplaceAllString(s, `"$1": _`)
	if varies {
		s = ipv4.ReplaceAllString(s, "IP")
		s = ipv6.ReplaceAllString(s, "IP")
		s = port.ReplaceAllString(s, "PORT")
	}
	return strings.TrimSpace(s)
}

var (
	timestamp = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	revision  = regexp.MustCompile(`(at revision|Revision:) +\d+`)
	took      = regexp.MustCompile(`took [^:]+:`)
	duration  = regexp.MustCompile(`\b\d+[smhdy](\d+[smh])?\b`)
	yamlKey   = regexp.MustCompile(`(?m)^(\s*(?:- )?)(revision|createRevision|modRevision|leaseId|` +
		`remainingTtlSeconds|allocateTime|startTime|duration|age|allocationRevision|createTime|deleteTime|` +
		`leader): .*$`)
	spaces = regexp.MustCompile(` {2,}`)
)

// normalizeCLI masks what normalize masks and what the allocd commands print that
// changes from run to run: times, ages and TTLs left, revisions, a pass's duration.
// Runs of spaces count as one, since a column is as wide as what it holds.
func normalizeCLI(s string, varies bool) string {
	s = normalize(s, varies)
	s = timestamp.ReplaceAllString(s, "TIME")
	s = revision.ReplaceAllString(s, "$1 REV")
	s = took.ReplaceAllString(s, "took DURATION:")
	s = duration.ReplaceAllString(s, "DURATION")
	s = yamlKey.ReplaceAllString(s, "$1$2: _")
	return spaces.ReplaceAllString(s, "  ")
}
