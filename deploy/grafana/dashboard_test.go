package grafana

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/cmd/allocd/daemon"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// dashboard is what the test reads of allocd.json besides the panels' expressions.
type dashboard struct {
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"` // a string, or {"query": "..."} in newer Grafana
		} `json:"list"`
	} `json:"templating"`
}

// dashboardExprs returns every PromQL expression of the dashboard at path: the
// "expr" of every target (in rows too) and the queries of its template variables.
func dashboardExprs(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var tree any
	var d dashboard
	if err := json.Unmarshal(b, &tree); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var exprs []string
	walk(tree, func(key string, v any) {
		if s, ok := v.(string); ok && key == "expr" {
			exprs = append(exprs, s)
		}
	})
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q string
		var obj struct{ Query string }
		if json.Unmarshal(v.Query, &q) != nil && json.Unmarshal(v.Query, &obj) == nil {
			q = obj.Query
		}
		if e := variableExpr(q); e != "" {
			exprs = append(exprs, e)
		}
	}
	return exprs
}

// walk calls visit with every key and value of the objects in v, depth first.
func walk(v any, visit func(key string, v any)) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			visit(k, e)
			walk(e, visit)
		}
	case []any:
		for _, e := range x {
			walk(e, visit)
		}
	}
}

var (
	labelValues = regexp.MustCompile(`^\s*label_values\((.+),\s*[A-Za-z_]\w*\s*\)\s*$`)
	queryResult = regexp.MustCompile(`^\s*query_result\((.+)\)\s*$`)
)

// variableExpr is the PromQL in a Grafana template variable's query:
// label_values(EXPR, label) and query_result(EXPR); "" for the others (label_names(),
// metrics(regex), label_values(label)).
func variableExpr(q string) string {
	if m := labelValues.FindStringSubmatch(q); m != nil {
		return m[1]
	}
	if m := queryResult.FindStringSubmatch(q); m != nil {
		return m[1]
	}
	return ""
}

var (
	// grafanaVar is a dashboard variable: $name, ${name}, ${name:format}.
	grafanaVar = regexp.MustCompile(`\$\{[^}]*\}|\$\w+`)
	// quoted is a PromQL string.
	quoted = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	// matchers and ranges: {label="x", ...} and [5m] or [5m:1m].
	matchers = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	// grouping lists name labels, not metrics: by (le), on (instance) group_left (ip).
	grouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	// token is a number or duration (1e3, 0.99, 5m), or an identifier.
	token = regexp.MustCompile(`[0-9][0-9A-Za-z_.]*|[A-Za-z_:][A-Za-z0-9_:]*`)
)

// keywords are PromQL's words that are neither metrics nor followed by "(".
var keywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"atan2": true, "inf": true, "nan": true, "Inf": true, "NaN": true}

// metricNames returns the metric names that a PromQL expression selects, as they are
// exported (a histogram's _bucket, _sum and _count series by those names): what is
// left once strings, label matchers, ranges, grouping label lists, numbers,
// functions and aggregations (names followed by "("), and keywords are taken out.
func metricNames(expr string) []string {
	s := grafanaVar.ReplaceAllString(expr, "")
	s = quoted.ReplaceAllString(s, `""`)
	s = matchers.ReplaceAllString(s, " ")
	s = grouping.ReplaceAllString(s, " ")
	var names []string
	for _, loc := range token.FindAllStringIndex(s, -1) {
		w := s[loc[0]:loc[1]]
		if w[0] >= '0' && w[0] <= '9' || keywords[w] {
			continue
		}
		if rest := strings.TrimLeft(s[loc[1]:], " \t\n"); strings.HasPrefix(rest, "(") {
			continue // a function, or an aggregation whose grouping was taken out
		}
		if !slices.Contains(names, w) {
			names = append(names, w)
		}
	}
	return names
}

func TestMetricNames(t *testing.T) {
	for _, tt := range []struct {
		expr string
		want []string
	}{
		{`allocd_masterlease_leases`, []string{"allocd_masterlease_leases"}},
		{`max by (range, band) (allocd_allocator_allocated{job=~"$job", band="static"}) / ` +
			`max by (range, band) (allocd_allocator_allocated + allocd_allocator_available)`,
			[]string{"allocd_allocator_allocated", "allocd_allocator_available"}},
		{`histogram_quantile(0.99, sum by (le, method) ` +
			`(rate(allocd_etcd_request_duration_seconds_bucket{code!="OK"}[$__rate_interval])))`,
			[]string{"allocd_etcd_request_duration_seconds_bucket"}},
		{`sum(rate(a_sum[5m])) by (le) / on (instance) group_left (ip) ` +
			`sum without (x) (rate(a_count[1h:1m] offset 1d)) > bool 1e3`,
			[]string{"a_sum", "a_count"}},
		{`sum by (grpc_code) (increase(grpc_server_handled_total` +
			`{grpc_method="by (x) rate(y)", grpc_code!='OK'}[${__range}]))`,
			[]string{"grpc_server_handled_total"}},
		{`up and on() vector(1) or absent(nothing_here) unless x:recorded:rate5m`,
			[]string{"up", "nothing_here", "x:recorded:rate5m"}},
	} {
		if got := metricNames(tt.expr); !slices.Equal(got, tt.want) {
			t.Errorf("metricNames(%q) = %q; want %q", tt.expr, got, tt.want)
		}
	}
	for q, want := range map[string]string{
		`label_values(allocd_allocator_allocated{job=~"$job"}, instance)`: `allocd_allocator_allocated` +
			`{job=~"$job"}`,
		`query_result(topk(3, allocd_repair_leak_candidates))`: `topk(3, allocd_repair_leak_candidates)`,
		`label_values(job)`: "",
	} {
		if got := variableExpr(q); got != want {
			t.Errorf("variableExpr(%q) = %q; want %q", q, got, want)
		}
	}
}

// exportedNames are the names of the samples in a text exposition (a histogram's
// _bucket, _sum and _count; a metric with no series has none).
func exportedNames(exposition string) map[string]bool {
	names := map[string]bool{}
	for _, line := range strings.Split(exposition, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names
}

// missing returns, sorted, the metrics of uses (name to an expression using it) that
// exported lacks, each with the expression.
func missing(uses map[string]string, exported map[string]bool) []string {
	var out []string
	for name, expr := range uses {
		if !exported[name] {
			out = append(out, name+" (in "+expr+")")
		}
	}
	slices.Sort(out)
	return out
}

func scrape(t *testing.T, addr string) map[string]bool {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics = %s, %v", resp.Status, err)
	}
	return exportedNames(string(b))
}

// TestDashboardMetricsExported: every metric that a query of allocd.json names is
// one that allocd exports, once allocd has served a call of each kind (labelled
// series exist only once something happened).
func TestDashboardMetricsExported(t *testing.T) {
	uses := map[string]string{}
	exprs := dashboardExprs(t, "allocd.json")
	for _, e := range exprs {
		for _, n := range metricNames(e) {
			uses[n] = e
		}
	}
	if len(exprs) < 30 || len(uses) < 30 {
		t.Fatalf("allocd.json: %d expressions naming %d metrics; want at least 30 of each (did "+
			"the parsing miss them?)", len(exprs), len(uses))
	}
	d := daemon.StartForTest(t)
	c, err := client.New(d.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	exercise(t, c)
	// Some series follow a call by a moment (the Endpoints controller writes after
	// the push is acknowledged).
	var gone []string
	etcdtest.Eventually(10*time.Second, func() bool {
		gone = missing(uses, scrape(t, d.MetricsAddr()))
		return len(gone) == 0
	})
	for _, m := range gone {
		t.Errorf("allocd.json queries %s, which allocd does not export", m)
	}
	// The check itself: a misspelt name is caught.
	typo := map[string]string{
		"allocd_allocator_allocations_totl": "rate(allocd_allocator_allocations_totl[5m])"}
	if got := missing(typo, scrape(t, d.MetricsAddr())); len(got) != 1 {
		t.Errorf("missing(%v) = %q; want the misspelt name", typo, got)
	}
}

// exercise calls allocd so that every labelled series the dashboard shows exists:
// allocations and an ALREADY_EXISTS, a master lease, Service and Pod snapshots and an
// event (Endpoints writes), and a repair pass with findings (a Service's address that
// nobody allocated, and an allocation that no Service holds: a leak candidate).
func exercise(t *testing.T, c *client.Client) {
	t.Helper()
	ctx := etcdtest.Context(t)
	web := &allocdv1.Owner{Namespace: "shop", Name: "web", Uid: "uid-web"}
	res, err := c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: web, NodePortCount: 1})
	if err != nil {
		t.Fatalf("Allocate(shop/web) = %v", err)
	}
	other := &allocdv1.Owner{Namespace: "shop", Name: "other", Uid: "uid-other"}
	if _, err := c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: other,
		ClusterIps: res.GetClusterIps()}); !errors.Is(err, client.ErrAlreadyAllocated) {
		t.Fatalf("Allocate(%v) held by shop/web = %v; want %v", res.GetClusterIps(), err,
			client.ErrAlreadyAllocated)
	}
	if _, err := c.Renew(ctx, &allocdv1.RenewRequest{Ip: "192.0.2.10", TtlSeconds: 30}); err != nil {
		t.Fatalf("Renew = %v", err)
	}
	db := &allocdv1.Service{Namespace: "shop", Name: "db", Uid: "uid-db", ClusterIps: []string{"10.0.0.77"},
		Selector: &allocdv1.Selector{MatchLabels: map[string]string{"app": "db"}},
		Ports: []*allocdv1.ServicePortSpec{{Port: 5432,
			TargetPort: &allocdv1.TargetPort{Value: &allocdv1.TargetPort_IntValue{IntValue: 5432}}}}}
	pod := &allocdv1.Pod{Namespace: "shop", Name: "db-0", Uid: "uid-db-0",
		Labels: map[string]string{"app": "db"},
		PodIps: []string{"10.244.0.7"}, Phase: "Running", Ready: true}
	etcdtest.WaitFor(t, 20*time.Second, "the leader to take the snapshots", func() bool {
		if _, err := c.PushServiceSnapshot(ctx,
			&allocdv1.ServiceSnapshot{Revision: 1, Services: []*allocdv1.Service{db}}); err != nil {
			return false
		}
		_, err := c.PushPodSnapshot(ctx, &allocdv1.PodSnapshot{Revision: 1, Pods: []*allocdv1.Pod{pod}})
		return err == nil
	})
	pod.Ready, pod.ResourceVersion = false, "2"
	if _, err := c.PushEvents(ctx, &allocdv1.PushEventsRequest{Revision: 2, Events: []*allocdv1.Event{{
		Type: allocdv1.EventType_EVENT_TYPE_UPSERT, Object: &allocdv1.Event_Pod{Pod: pod}}}}); err != nil {
		t.Fatalf("PushEvents = %v", err)
	}
	rep, err := c.RunRepair(ctx, &allocdv1.RunRepairRequest{})
	if err != nil || len(rep.GetFindings()) == 0 {
		t.Fatalf("RunRepair = %v, %v; want findings", rep, err)
	}
}
