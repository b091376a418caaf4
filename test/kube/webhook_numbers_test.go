package kube

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// TestWebhookNumbers measures Service creates through kube-apiserver v1.37 alone
// (kube-apiserver allocates every ClusterIP: AllocateNextService holds one mutex across
// the IPAddress create and its two lists of every IPAddress) against kube-apiserver
// with allocd's webhook (allocd allocates at admission and kube-apiserver takes the
// addresses as requested ones, without that mutex), side by side in one run on one
// etcd (fsync on), at KUBE_E2E_LEVELS existing Services (default 0,5000,10000):
//
//   - creates/s and the p50 / p99 of a create, as 16 clients see them, over
//     KUBE_E2E_CREATES creates (default 1,000) of single-stack ClusterIP Services, each
//     client sending its next create when the last is answered;
//   - the webhook's own latency (its histogram) and kube-apiserver's view of it
//     (apiserver_admission_webhook_admission_duration_seconds), p50 / p99, interpolated
//     within their buckets as Prometheus' histogram_quantile does;
//   - the CPU time of each process in the run, and the machine's load.
//
// The existing Services are filled in chunks of 1,000 (every chunk's rate is logged:
// a curve from 0 to the top level); the measured creates are deleted after each run
// (and, with the webhook, released by the bridge) so that every run of a level starts
// from the same state. The sides alternate, ABBA over the levels and KUBE_E2E_RUNS runs
// (default 1) so that a drift of the machine falls on both. KUBE_E2E_SIDES=alone
// measures kube-apiserver alone. KUBE_E2E_PROFILE=1 saves CPU profiles of every
// process that serves them, over each run, into the logs, with their top functions.
// It runs with KUBE_E2E_WEBHOOK_NUMBERS=1 (make kube-webhook-numbers) and prints a
// markdown table, also written to the logs as webhook-numbers.md.
func TestWebhookNumbers(t *testing.T) {
	if os.Getenv("KUBE_E2E_WEBHOOK_NUMBERS") == "" {
		t.Skip("KUBE_E2E_WEBHOOK_NUMBERS is not set (make kube-webhook-numbers)")
	}
	levels := envInts("KUBE_E2E_LEVELS", []int{0, 5000, 10000})
	creates, runs := envInt("KUBE_E2E_CREATES", 1000), envInt("KUBE_E2E_RUNS", 1)
	e := etcdtest.New(t, etcdtest.WithFsync())
	sides := []*createSide{startAloneSide(t, e)}
	if os.Getenv("KUBE_E2E_SIDES") != "alone" {
		sides = append(sides, startWebhookSide(t, e))
	}
	var rows []numbersRow
	for li, level := range levels {
		for _, s := range sides {
			s.fill(t, level)
		}
		for r := range runs {
			order := []int{0, 1}
			if (li*runs+r)%2 == 1 {
				order = []int{1, 0}
			}
			for _, i := range order {
				if i < len(sides) {
					row := sides[i].measure(t, level, r, creates)
					t.Logf("%s", row.line())
					rows = append(rows, row)
				}
			}
		}
	}
	table := numbersTable(rows, sides)
	t.Logf("Service creates, 16 clients, %d creates a run, %s:\n%s", creates,
		time.Now().UTC().Format(time.RFC3339), table)
	if err := os.WriteFile(filepath.Join(logDir(t), "webhook-numbers.md"), []byte(table), 0o644); err != nil {
		t.Error(err)
	}
}

// envInts is the comma-separated integers of env variable name, or def.
func envInts(name string, def []int) []int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(f), &n); err != nil || n < 0 {
			return def
		}
		out = append(out, n)
	}
	return out
}

// fillNS and benchNS are the namespaces of the existing Services and of the measured
// creates.
const (
	fillNS  = "fill"
	benchNS = "bench"
)

// createSide is one side of the numbers: a cluster and what serves its creates.
type createSide struct {
	name string
	c    *cluster
	// procs are the processes whose CPU time a run reports (kube-apiserver first).
	procs []*proc
	// metrics are Prometheus endpoints scraped around a run (the webhook's).
	metrics []string
	// profiles are CPU profile URLs by process name (besides kube-apiserver's).
	profiles map[string]string
	// webhook is the name of the MutatingWebhookConfiguration's webhook ("" alone).
	webhook string
	// settle waits, after the measured creates are deleted, until what serves the side
	// has caught up (allocd has released them); nil when nothing lags.
	settle func(t *testing.T)
	filled int
}

// startAloneSide is kube-apiserver alone on e.
func startAloneSide(t *testing.T, e *etcdtest.Server) *createSide {
	c := startCluster(t, clusterConfig{name: "alone", etcd: e.Endpoint, reconciler: "lease",
		advertise: advertise})
	for _, ns := range []string{fillNS, benchNS} {
		mustCreateNamespace(t, c.Admin, ns)
	}
	return &createSide{name: "kube-apiserver alone", c: c, procs: []*proc{c.APIServer}}
}

// fill creates existing Services until the side has level of them, in chunks of 1,000
// from 16 clients, and logs each chunk's rate.
func (s *createSide) fill(t *testing.T, level int) {
	ctx := context.Background()
	for s.filled < level {
		n := min(1000, level-s.filled)
		from := s.filled
		run := runCreates(ctx, s.c.Admin, n, 16, func(i int) *corev1.Service {
			return plainService(fillNS, fmt.Sprintf("fill-%d", from+i))
		})
		if run.refused.total() > 0 {
			t.Fatalf("%s: filling %d to %d: refused: %s", s.name, from, from+n, &run.refused)
		}
		s.filled += n
		t.Logf("%s: fill %d → %d: %.0f creates/s, p50 %v, p99 %v; load %s", s.name, from, s.filled,
			run.rate(), ms(pct(run.lat, .5)), ms(pct(run.lat, .99)), loadavg())
	}
}

// numbersRow is one measured run.
type numbersRow struct {
	level    int
	side     string
	run      *createRun
	webhook  quantiles // the webhook's own histogram
	viewed   quantiles // kube-apiserver's histogram of the webhook's admission
	allocate quantiles // allocd's Allocate, its gRPC handling time
	calls    string    // allocd's calls by method during the run
	cpu      string
	// apiCPU and sideCPU are kube-apiserver's CPU time per stored create, and that of
	// every process of the side (the test's embedded etcd aside).
	apiCPU, sideCPU time.Duration
	load            string
}

// measure runs creates creates on the side at level existing Services, then deletes
// them and waits for the side to settle.
func (s *createSide) measure(t *testing.T, level, r, creates int) numbersRow {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	name := func(i int) string { return fmt.Sprintf("b-%d-%d-%d", level, r, i) }
	apiBefore, hookBefore := s.apiserverMetrics(t), s.scrape()
	u := startUsage(s.procs...)
	cpu0 := procsCPU(s.procs)
	side := strings.ReplaceAll(s.name, " ", "-")
	prof := s.startProfiles(ctx, t, fmt.Sprintf("numbers-%d-%d-%s", level, r, side))
	run := runCreates(ctx, s.c.Admin, creates, 16, func(i int) *corev1.Service {
		return plainService(benchNS, name(i))
	})
	row := numbersRow{level: level, side: s.name, run: run, cpu: u.String(), load: loadavg(), calls: "none"}
	if cpu := procsCPU(s.procs); len(run.lat) > 0 {
		row.apiCPU = (cpu[0] - cpu0[0]) / time.Duration(len(run.lat))
		for i := range cpu {
			row.sideCPU += (cpu[i] - cpu0[i]) / time.Duration(len(run.lat))
		}
	}
	cancel()
	prof()
	apiAfter, hookAfter := s.apiserverMetrics(t), s.scrape()
	if s.webhook != "" {
		const viewed = "apiserver_admission_webhook_admission_duration_seconds"
		row.viewed = histQuantiles(apiBefore, apiAfter, viewed, `name="`+s.webhook+`"`, `operation="CREATE"`)
		row.webhook = histQuantiles(hookBefore, hookAfter, "allocd_webhook_request_duration_seconds")
		row.allocate = histQuantiles(hookBefore, hookAfter, "grpc_server_handling_seconds",
			`grpc_method="Allocate"`)
		row.calls = callsLine(hookBefore, hookAfter)
	}
	var names []string
	for i, c := range run.created {
		if c != nil {
			names = append(names, name(i))
		}
	}
	if err := runDeletes(context.Background(), s.c.Admin, benchNS, names, 16); err != nil {
		t.Fatal(err)
	}
	if s.settle != nil {
		s.settle(t)
	}
	return row
}

// apiserverMetrics reads kube-apiserver's /metrics.
func (s *createSide) apiserverMetrics(t *testing.T) map[string]float64 {
	b, err := s.c.Admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatalf("%s: kube-apiserver's metrics: %v", s.name, err)
	}
	return parseMetrics(string(b))
}

// scrape reads the side's metrics endpoints into one map.
func (s *createSide) scrape() map[string]float64 {
	out := map[string]float64{}
	for _, url := range s.metrics {
		for k, v := range scrape(url) {
			out[k] += v
		}
	}
	return out
}

// startProfiles starts 15-second CPU profiles of kube-apiserver and the side's other
// processes (KUBE_E2E_PROFILE set), saved with their top functions into the logs as
// name-<process>.pprof and .txt; the function it returns waits for them.
func (s *createSide) startProfiles(ctx context.Context, t *testing.T, name string) func() {
	if os.Getenv("KUBE_E2E_PROFILE") == "" {
		return func() {}
	}
	done := make(chan struct{}, len(s.profiles)+1)
	go func() {
		req := s.c.Admin.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", "15")
		b, err := req.DoRaw(context.Background())
		saveTop(t, name+"-kube-apiserver", b, err)
		done <- struct{}{}
	}()
	for proc, url := range s.profiles {
		go func() {
			b, err := httpGet(context.Background(), url+"?seconds=15")
			saveTop(t, name+"-"+proc, b, err)
			done <- struct{}{}
		}()
	}
	return func() {
		for range len(s.profiles) + 1 {
			<-done
		}
	}
}

// saveTop saves a CPU profile and `go tool pprof -top` of it into the logs.
func saveTop(t *testing.T, name string, b []byte, err error) {
	saveProfile(t, name, b, err)
	if err != nil {
		return
	}
	path := filepath.Join(logDir(t), name+".pprof")
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=40", path).CombinedOutput()
	if err != nil {
		t.Logf("pprof -top %s: %v", path, err)
		return
	}
	_ = os.WriteFile(strings.TrimSuffix(path, ".pprof")+".txt", out, 0o644)
}

// line is the row's one-line summary for the log.
func (r numbersRow) line() string {
	return fmt.Sprintf("%d existing, %s: %.1f creates/s, p50 %v, p99 %v, refused %s; webhook %s, "+
		"as kube-apiserver saw it %s; allocd's Allocate %s; allocd's calls: %s; %s", r.level, r.side,
		r.run.rate(), ms(pct(r.run.lat, .5)), ms(pct(r.run.lat, .99)), &r.run.refused, r.webhook, r.viewed,
		r.allocate, r.calls, r.cpu)
}

// numbersTable is the markdown table of the rows, with the ratio of creates/s with the
// webhook to alone at each level.
func numbersTable(rows []numbersRow, sides []*createSide) string {
	var b strings.Builder
	b.WriteString("| existing Services | side | creates/s | p50 | p99 | webhook p50 / p99 (its histogram) " +
		"| webhook p50 / p99 (kube-apiserver's histogram) | allocd's Allocate p50 / p99 " +
		"| CPU per create: kube-apiserver / the side | refused | load |\n" +
		"|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %d | %s | %.1f | %v | %v | %s | %s | %s | %.1f / %.1f ms | %d | %s |\n",
			r.level, r.side, r.run.rate(), ms(pct(r.run.lat, .5)), ms(pct(r.run.lat, .99)), r.webhook,
			r.viewed, r.allocate, msf(r.apiCPU), msf(r.sideCPU), r.run.refused.total(), r.load)
	}
	if len(sides) < 2 {
		return b.String()
	}
	levels := map[int][2][]float64{}
	var order []int
	for _, r := range rows {
		l := levels[r.level]
		i := 0
		if r.side != sides[0].name {
			i = 1
		}
		l[i] = append(l[i], r.run.rate())
		if !slices.Contains(order, r.level) {
			order = append(order, r.level)
		}
		levels[r.level] = l
	}
	b.WriteString("\n")
	for _, level := range order {
		l := levels[level]
		fmt.Fprintf(&b, "At %d existing Services, creates/s %s / %s: %.2f (medians of %d and %d runs)\n",
			level, sides[1].name, sides[0].name, median(l[1])/median(l[0]), len(l[1]), len(l[0]))
	}
	return b.String()
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// ms is d rounded to the millisecond.
func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// callsLine is allocd's calls between two scrapes, by method (grpc_server_handled_total
// summed over codes), or "none".
func callsLine(before, after map[string]float64) string {
	calls := map[string]float64{}
	for k, v := range metricsDelta(before, after, "grpc_server_handled_total{") {
		_, m, ok := strings.Cut(k, `grpc_method="`)
		if !ok || v == 0 {
			continue
		}
		m, _, _ = strings.Cut(m, `"`)
		calls[m] += v
	}
	if len(calls) == 0 {
		return "none"
	}
	var out []string
	for m, n := range calls {
		out = append(out, fmt.Sprintf("%s %d", m, int(n)))
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// msf is d in milliseconds.
func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// procsCPU is the CPU time each process has used so far.
func procsCPU(procs []*proc) []time.Duration {
	out := make([]time.Duration, len(procs))
	for i, p := range procs {
		out[i] = p.cpuTime()
	}
	return out
}
