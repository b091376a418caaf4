package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/allocd/allocd/cmd/allocd/cli"
	"github.com/allocd/allocd/cmd/allocd/daemon"
)

// TestReadmeFlags keeps the README's flag reference equal to `allocd --help`.
func TestReadmeFlags(t *testing.T) {
	readme := readReadme(t)
	got := section(t, readme, "flags")
	var help bytes.Buffer
	run([]string{"--help"}, &help, &help)
	want := "```text\n" + help.String() + "```\n"
	if strings.TrimSpace(got) != strings.TrimSpace(want) {
		t.Errorf("README flags section differs from allocd --help; paste this between the flags markers:\n%s", want)
	}
}

// step is one command of the README walkthrough and the output the README shows for it.
type step struct {
	cmd    string
	want   string
	varies bool // "# output varies": addresses and ports are masked
}

// TestReadmeWalkthrough runs every command of the README's operator walkthrough against a
// real allocd and compares its output with the README's, so the two cannot drift apart.
// Values that change from run to run (revisions, lease ids, times, TTLs left) are masked;
// commands marked "# addresses vary" also have addresses and ports masked.
func TestReadmeWalkthrough(t *testing.T) {
	if testing.Short() {
		t.Skip("runs grpcurl and the commands of the README as processes")
	}
	grpcurl := findGrpcurl(t)
	runTour(t, "walkthrough", []string{filepath.Dir(grpcurl)}, normalize)
}

// TestReadmeOperatorTour runs the README's tour of the allocd command line, as
// TestReadmeWalkthrough runs the grpcurl one: the allocd on PATH is this package built,
// pointed at the tour's allocd through $ALLOCD_SERVER; grpcurl plays the shims.
func TestReadmeOperatorTour(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	grpcurl := findGrpcurl(t)
	bin := buildAllocd(t)
	runTour(t, "operator-tour", []string{filepath.Dir(bin), filepath.Dir(grpcurl)}, normalizeCLI)
}

// runTour runs the commands of the README section name against allocd, started in
// process where the section says `go run ./cmd/allocd ...`, with path's directories
// first on PATH, and compares what each prints, as norm masks it, with the README.
// UPDATE_README=1 writes this run's outputs into the README instead.
func runTour(t *testing.T, name string, path []string, norm func(string, bool) string) {
	steps := parseWalkthrough(t, section(t, readReadme(t), name))
	if len(steps) < 10 {
		t.Fatalf("%s has %d commands; want the whole tour", name, len(steps))
	}
	var d *daemon.Daemon
	outputs := make([]string, len(steps))
	for i, s := range steps {
		if strings.HasPrefix(s.cmd, "go run ./cmd/allocd") {
			d = startFromReadme(t, strings.TrimPrefix(s.cmd, "go run ./cmd/allocd"))
			continue
		}
		if d == nil {
			t.Fatalf("step %d (%s) comes before the %s starts allocd", i, s.cmd, name)
		}
		cmd := strings.ReplaceAll(s.cmd, "127.0.0.1:8080", d.GRPCAddr())
		cmd = strings.ReplaceAll(cmd, "127.0.0.1:9090", d.MetricsAddr())
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		sh := exec.CommandContext(ctx, "bash", "-c", cmd)
		sh.Env = append(os.Environ(), "PATH="+strings.Join(append(path, os.Getenv("PATH")), string(os.PathListSeparator)),
			cli.ServerEnv+"="+d.GRPCAddr())
		out, _ := sh.CombinedOutput()
		cancel()
		// What allocd says of itself (the repair leader) is said of the README's address.
		out = []byte(strings.ReplaceAll(string(out), d.GRPCAddr(), "127.0.0.1:8080"))
		outputs[i] = string(out)
		got, want := norm(string(out), s.varies), norm(s.want, s.varies)
		if got != want && os.Getenv("UPDATE_README") == "" {
			t.Errorf("README %s step %d:\n$ %s\ngot:\n%s\nwant (as the README says):\n%s", name, i, s.cmd, out, s.want)
		}
	}
	if os.Getenv("UPDATE_README") != "" {
		// UPDATE_README=1 go test -run TestReadme ./cmd/allocd writes the outputs of
		// this run into the README, for a reviewer to read in the diff.
		readme := readReadme(t)
		old := section(t, readme, name)
		if err := os.WriteFile("../../README.md", []byte(strings.Replace(readme, old, rewriteWalkthrough(old, outputs), 1)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// rewriteWalkthrough replaces the output of every command in text with outputs[i].
func rewriteWalkthrough(text string, outputs []string) string {
	var b strings.Builder
	in, cont, n := false, false, -1
	emit := func() {
		if n >= 0 && n < len(outputs) {
			b.WriteString(outputs[n])
			if o := outputs[n]; o != "" && !strings.HasSuffix(o, "\n") {
				b.WriteString("\n")
			}
		}
	}
	lines := strings.Split(text, "\n")
	for i, line := range lines {
		last := i == len(lines)-1
		switch {
		case strings.HasPrefix(line, "```console"):
			in = true
		case in && strings.HasPrefix(line, "```"):
			emit()
			in, n = false, -1
		case in && cont:
			cont = strings.HasSuffix(line, "\\")
		case in && strings.HasPrefix(line, "$ "):
			if n >= 0 {
				emit()
			}
			n = stepIndex(text, i)
			cont = strings.HasSuffix(line, "\\")
		case in:
			continue // old output
		}
		b.WriteString(line)
		if !last {
			b.WriteString("\n")
		}
	}
	return b.String()
}

// stepIndex counts the commands that start before line i of text.
func stepIndex(text string, i int) int {
	n := -1
	in, cont := false, false
	for j, line := range strings.Split(text, "\n") {
		if j > i {
			break
		}
		switch {
		case strings.HasPrefix(line, "```console"):
			in = true
		case in && strings.HasPrefix(line, "```"):
			in = false
		case in && cont:
			cont = strings.HasSuffix(line, "\\")
		case in && strings.HasPrefix(line, "$ "):
			n++
			cont = strings.HasSuffix(line, "\\")
		}
	}
	return n
}

func readReadme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// section returns the text between <!-- name:begin --> and <!-- name:end -->.
func section(t *testing.T, doc, name string) string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "<!-- "+name+":begin -->")
	if !ok {
		t.Fatalf("README has no <!-- %s:begin --> marker", name)
	}
	body, _, ok := strings.Cut(rest, "<!-- "+name+":end -->")
	if !ok {
		t.Fatalf("README has no <!-- %s:end --> marker", name)
	}
	return body
}

// parseWalkthrough reads the ```console blocks: "$ " starts a command (a trailing
// backslash continues it), the lines up to the next command or the end of the block are
// its output.
func parseWalkthrough(t *testing.T, text string) []step {
	var steps []step
	in := false
	var cur *step
	var cont bool
	flush := func() {
		if cur != nil {
			steps = append(steps, *cur)
			cur = nil
		}
	}
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "```console"):
			in = true
			continue
		case in && strings.HasPrefix(line, "```"):
			flush()
			in = false
			continue
		case !in:
			continue
		}
		if cont {
			cur.cmd += "\n" + line
			cont = strings.HasSuffix(line, "\\")
			continue
		}
		if strings.HasPrefix(line, "$ ") {
			flush()
			c := strings.TrimPrefix(line, "$ ")
			cur = &step{cmd: c}
			cont = strings.HasSuffix(line, "\\")
			continue
		}
		if cur != nil {
			cur.want += line + "\n"
		}
	}
	flush()
	for i := range steps {
		if c, _, ok := strings.Cut(steps[i].cmd, "  # addresses vary"); ok {
			steps[i].cmd, steps[i].varies = c, true
		}
	}
	return steps
}

// startFromReadme starts allocd in-process with the README's flags, on test addresses.
func startFromReadme(t *testing.T, args string) *daemon.Daemon {
	t.Helper()
	return daemon.StartForTest(t, func(c *daemon.Config) {
		keep := *c
		fs := flag.NewFlagSet("readme", flag.ContinueOnError)
		c.RegisterFlags(fs)
		if err := fs.Parse(strings.Fields(strings.ReplaceAll(args, "\\\n", " "))); err != nil {
			t.Fatalf("README start flags %q: %v", args, err)
		}
		c.DataDir, c.GRPCAddress, c.MetricsAddress = keep.DataDir, keep.GRPCAddress, keep.MetricsAddress
	})
}

var (
	volatile = regexp.MustCompile(`"(revision|createRevision|modRevision|leaseId|remainingTtlSeconds|allocateTime|startTime|duration|age|allocationRevision|snapshotRevision|leader|createTime|deleteTime)": ("[^"]*"|-?\d+)`)
	ipv4     = regexp.MustCompile(`\b\d{1,3}(\.\d{1,3}){3}\b`)
	ipv6     = regexp.MustCompile(`\b[0-9a-f]{1,4}(:[0-9a-f]{0,4}){2,7}\b`)
	port     = regexp.MustCompile(`\b3[0-2]\d{3}\b`)
)

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
	yamlKey   = regexp.MustCompile(`(?m)^(\s*(?:- )?)(revision|createRevision|modRevision|leaseId|remainingTtlSeconds|allocateTime|startTime|duration|age|allocationRevision|createTime|deleteTime|leader): .*$`)
	spaces    = regexp.MustCompile(` {2,}`)
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
