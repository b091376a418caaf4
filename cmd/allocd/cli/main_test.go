package cli

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/cmd/allocd/daemon"
	"github.com/allocd/allocd/internal/testing/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.MustTestMain(m) }

var update = flag.Bool("update", false, "rewrite testdata/*.golden from this run")

// allocd is an allocd for a test, with a Go client on it (a shim's) and the commands'
// transcript.
type allocd struct {
	t  *testing.T
	d  *daemon.Daemon
	c  *client.Client
	tr strings.Builder
}

// start starts allocd on the embedded etcd with mutate's config, points the commands at
// it through $ALLOCD_SERVER, and connects a client.
func start(t *testing.T, mutate ...func(*daemon.Config)) *allocd {
	t.Helper()
	d := daemon.StartForTest(t, mutate...)
	t.Setenv(ServerEnv, d.GRPCAddr())
	c, err := client.New(d.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &allocd{t: t, d: d, c: c}
}

// execute runs `allocd args...` (the operator commands under a bare root) and returns
// what it printed and its exit code.
func execute(ctx context.Context, args ...string) (stdout, stderr string, code int) {
	root := &cobra.Command{Use: "allocd"}
	root.AddCommand(Commands()...)
	var out, errOut bytes.Buffer
	code = Execute(ctx, root, args, &out, &errOut)
	return out.String(), errOut.String(), code
}

// run runs a command and adds it and its output to the transcript; it returns stdout.
func (a *allocd) run(args ...string) string {
	a.t.Helper()
	out, errOut, code := execute(context.Background(), args...)
	a.record(args, out+errOut, code)
	return out
}

// record adds a command, its output and its exit code (when not 0) to the transcript.
func (a *allocd) record(args []string, output string, code int) {
	quoted := make([]string, len(args))
	for i, s := range args {
		quoted[i] = s
		if strings.ContainsAny(s, " '\"|") {
			quoted[i] = "'" + s + "'"
		}
	}
	a.tr.WriteString("$ allocd " + strings.Join(quoted, " ") + "\n" + output)
	if code != 0 {
		a.tr.WriteString("[exit " + strconv.Itoa(code) + "]\n")
	}
}

// note adds what a shim did, through the Go client, to the transcript.
func (a *allocd) note(s string) { a.tr.WriteString("# " + s + "\n") }

// golden compares the transcript, masked, with testdata/name.golden (-update writes
// it).
func (a *allocd) golden(name string) {
	a.t.Helper()
	compareGolden(a.t, name, mask(a.tr.String(), a.d.GRPCAddr()))
}

func compareGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -run %s -update writes it)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("output differs from %s (go test -run %s -update rewrites it; read the diff):\n%s", path,
			t.Name(), diff(string(want), got))
	}
}

// diff lists the lines of got that differ from want's, with their numbers.
func diff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			b.WriteString("line " + strconv.Itoa(i+1) + ":\n  want: " + wl + "\n  got:  " + gl + "\n")
		}
	}
	return b.String()
}

var (
	timeRE     = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	agoRE      = regexp.MustCompile(`\(\S+ ago\)`)
	revisionRE = regexp.MustCompile(`at revision \d+`)
	tookRE     = regexp.MustCompile(`took [^:]+:`)
	describeRE = regexp.MustCompile(`(?m)^((?:Create|Mod) Revision:\s+)\d+$`)
	jsonRE     = regexp.MustCompile(`"(` + volatileKeys + `)":\s?("[^"]*"|-?\d+)`)
	yamlRE     = regexp.MustCompile(`(?m)^(\s*(?:- )?)(` + volatileKeys + `): .*$`)
	lastCellRE = regexp.MustCompile(`(\s{3,})\S+$`)
)

// volatileKeys are the JSON and YAML keys whose values change from run to run.
const volatileKeys = "revision|createRevision|modRevision|leaseId|remainingTtlSeconds|allocateTime|" +
	"startTime|duration|age|allocationRevision|createTime|deleteTime|leader"

// volatileColumns are the table columns whose cells change from run to run.
var volatileColumns = []string{"AGE", "EXPIRES IN", "REVISION", "CREATE REVISION", "MOD REVISION", "LEASE ID",
	"ALLOCATED", "CREATED", "DELETED"}

// mask replaces what changes from run to run (times, ages, revisions, lease ids, the
// server's address) with placeholders.
func mask(s, server string) string {
	s = strings.ReplaceAll(s, server, "<server>")
	s = maskTables(s)
	s = timeRE.ReplaceAllString(s, "<time>")
	s = agoRE.ReplaceAllString(s, "(<age> ago)")
	s = revisionRE.ReplaceAllString(s, "at revision <rev>")
	s = tookRE.ReplaceAllString(s, "took <duration>:")
	s = describeRE.ReplaceAllString(s, "${1}<rev>")
	s = jsonRE.ReplaceAllString(s, `"$1": <masked>`)
	return yamlRE.ReplaceAllString(s, "$1$2: <masked>")
}

// maskTables masks the cells of volatile columns: a table starts at a header line of
// upper-case names apart by 3 spaces or more and runs to a blank line or the next
// command. Cells are found by the header's offsets, the last one as the last cell (a
// paged listing aligns each page apart).
func maskTables(s string) string {
	lines := strings.Split(s, "\n")
	var spans [][2]int // start, end (-1: the last column) of the volatile columns
	for i, line := range lines {
		if line == "" || strings.HasPrefix(line, "$ ") || strings.HasPrefix(line, "# ") {
			spans = nil
			continue
		}
		if h := headerSpans(line); h != nil {
			spans = h
			continue
		}
		for _, sp := range spans {
			if sp[1] < 0 {
				line = lastCellRE.ReplaceAllString(line, "$1*")
			} else if len(line) > sp[0] {
				end := min(sp[1], len(line))
				line = line[:sp[0]] + "*" + strings.Repeat(" ", end-sp[0]-1) + line[end:]
			}
		}
		lines[i] = line
	}
	return strings.Join(lines, "\n")
}

// headerSpans returns the spans of the volatile columns of a header line, nil when
// line is no header (or has none).
func headerSpans(line string) [][2]int {
	if strings.ToUpper(line) != line || !strings.Contains(line, "   ") || strings.ContainsAny(line, ":/[") {
		return nil
	}
	type col struct {
		name  string
		start int
	}
	var cols []col
	for i := 0; i < len(line); {
		for i < len(line) && line[i] == ' ' {
			i++
		}
		j := strings.Index(line[i:], "   ")
		if j < 0 {
			j = len(line) - i
		}
		if j > 0 {
			cols = append(cols, col{line[i : i+j], i})
		}
		i += j
	}
	var spans [][2]int
	for k, c := range cols {
		for _, v := range volatileColumns {
			if c.name == v {
				end := -1
				if k+1 < len(cols) {
					end = cols[k+1].start
				}
				spans = append(spans, [2]int{c.start, end})
			}
		}
	}
	if len(spans) == 0 {
		return [][2]int{}
	}
	return spans
}

// within fails the test when f takes longer than d.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	start := time.Now()
	f()
	if took := time.Since(start); took > d {
		t.Errorf("%s took %s; want at most %s", what, took, d)
	}
}
