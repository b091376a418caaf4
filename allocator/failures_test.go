package allocator

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// TestFailures: a step that keeps failing is counted every time and logged at warning
// the first time, then once a minute on the clock; ok ends its run with one info line
// saying how many failed, and the next failure is logged at once. Steps are apart.
func TestFailures(t *testing.T) {
	h := &recordHandler{}
	reg := prometheus.NewRegistry()
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_failures_total"}, []string{"step"})
	reg.MustRegister(vec)
	f := newFailures(slog.New(h), vec)
	clk := clockwork.NewFakeClock()
	f.clock = clk
	boom := errors.New("boom")
	steps := []struct {
		do   func()
		want []map[string]string // the lines logged, each by some of its attributes
	}{
		{func() { f.fail("a", "a failed", boom) }, []map[string]string{{"msg": "a failed", "step": "a",
			"failures": "1", "err": "boom"}}},
		{func() { f.fail("a", "a failed", boom); f.fail("a", "a failed", boom) }, nil},
		{func() { clk.Advance(failureLogEvery); f.fail("a", "a failed", boom) },
			[]map[string]string{{"msg": "a failed", "failures": "4"}}},
		{func() { f.fail("b", "b failed", boom, "name", "x") },
			[]map[string]string{{"step": "b", "failures": "1", "name": "x"}}},
		{func() { f.ok("a") },
			[]map[string]string{{"msg": "step works again", "step": "a", "failures": "4"}}},
		{func() { f.ok("a") }, nil},
		{func() { f.fail("a", "a failed", boom) }, []map[string]string{{"step": "a", "failures": "1"}}},
	}
	for i, s := range steps {
		s.do()
		got := h.take()
		if len(got) != len(s.want) {
			t.Fatalf("step %d logged %v; want %d lines", i, got, len(s.want))
		}
		for j, w := range s.want {
			for k, v := range w {
				if got[j][k] != v {
					t.Errorf("step %d line %d: %s=%q; want %q (%v)", i, j, k, got[j][k], v, got[j])
				}
			}
		}
	}
	if n := counter(t, reg, "test_failures_total", "a"); n != 5 {
		t.Errorf("failures of a counted = %v; want 5", n)
	}
	var none *failures // records nothing
	none.fail("a", "a failed", boom)
	none.ok("a")
}

// TestFailuresByObject: a step run on several objects keeps a run of failures per
// object: a success on B does not end A's run (whose next failure would be logged again,
// after a "works again" line, at every tick), and A's success ends A's run alone.
func TestFailuresByObject(t *testing.T) {
	h := &recordHandler{}
	f := newFailures(slog.New(h), nil)
	f.clock = clockwork.NewFakeClock()
	boom := errors.New("boom")
	f.failOf(stepDrain, "a", "drain failed", boom)
	f.okOf(stepDrain, "b")
	f.failOf(stepDrain, "a", "drain failed", boom)
	f.failOf(stepDrain, "b", "drain failed", boom)
	got := h.take()
	if len(got) != 2 || got[0]["name"] != "a" || got[0]["failures"] != "1" || got[1]["name"] != "b" {
		t.Fatalf("fail(a), ok(b), fail(a), fail(b) logged %v; want a's first failure and b's", got)
	}
	f.okOf(stepDrain, "a")
	if got := h.take(); len(got) != 1 || got[0]["msg"] != "step works again" || got[0]["name"] != "a" ||
		got[0]["failures"] != "2" {
		t.Errorf("ok(a) logged %v; want a's run of 2 ended", got)
	}
	f.failOf(stepDrain, "b", "drain failed", boom)
	if got := h.take(); len(got) != 0 {
		t.Errorf("b's second failure logged %v; want nothing (its run goes on)", got)
	}
}

// TestProgressRequestEnded: a progress request that fails because its watch's context
// ended does not end a run of failures (it said "works again" while etcd stayed away).
func TestProgressRequestEnded(t *testing.T) {
	e := etcdtest.New(t)
	cli := e.NewClient()
	h := &recordHandler{}
	cfg := testConfig("10.0.0.0/24")
	cfg.Logger = slog.New(h)
	a, err := New(etcdtest.Context(t), cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cli.Close()
	h.take()
	a.idx.requestProgress(context.Background())
	a.idx.requestProgress(context.Background())
	if got := h.take(); len(got) != 1 || got[0]["step"] != stepWatchProgress || got[0]["failures"] != "1" {
		t.Fatalf("two progress requests on a closed client logged %v; want the first failure", got)
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	a.idx.requestProgress(ended)
	if got := h.take(); len(got) != 0 {
		t.Errorf("a progress request of an ended watch logged %v; want nothing", got)
	}
	a.idx.fails.ok(stepWatchProgress)
	if got := h.take(); len(got) != 1 || got[0]["failures"] != "2" {
		t.Errorf("the end of the run logged %v; want a run of 2 failures", got)
	}
}

// TestEpochRoundNothingWaits: a round that finds no tombstone waiting ends the runs of
// failures of the steps it has nothing to do for (moving the epoch on, collecting):
// they were left open, and the next failure, maybe hours later, counted on from them.
func TestEpochRoundNothingWaits(t *testing.T) {
	e := etcdtest.New(t)
	h := &recordHandler{}
	cfg := testConfig("10.0.0.0/24")
	cfg.Logger = slog.New(h)
	a, err := New(etcdtest.Context(t), e.Client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	a.epochs.fails.fail(stepBump, "bump failed", boom)
	a.epochs.fails.fail(stepCollect, "collect failed", boom)
	h.take()
	if err := a.epochs.round(etcdtest.Context(t)); err != nil {
		t.Fatal(err)
	}
	ended := map[string]bool{}
	for _, l := range h.take() {
		if l["msg"] == "step works again" {
			ended[l["step"]] = true
		}
	}
	if !ended[stepBump] || !ended[stepCollect] {
		t.Errorf("a round with no tombstone waiting ended the runs of %v; want %s and %s", ended, stepBump,
			stepCollect)
	}
}

// TestWatchSessionCounted: a session of the index's watch that ends while its context
// lives is counted under step watch (the docs said the watch's failures were counted;
// only its progress requests were); one that ends with its context is not.
func TestWatchSessionCounted(t *testing.T) {
	e := etcdtest.New(t)
	cli := e.NewClient()
	reg := prometheus.NewRegistry()
	cfg := testConfig("10.0.0.0/24")
	cfg.Registerer = reg
	a, err := New(etcdtest.Context(t), cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cli.Close()
	if err := a.idx.session(context.Background()); err == nil {
		t.Fatal("a watch session on a closed client = nil; want its error")
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	a.idx.session(ended)
	if n := counter(t, reg, "allocd_allocator_background_failures_total", stepWatch); n != 1 {
		t.Errorf("background failures of step watch = %v; want 1", n)
	}
}

// TestEpochRoundFailures: a round of the epoch that cannot read etcd fails at its
// first step, counted in allocd_allocator_epoch_failures_total{step="count"} and logged
// at warning (it was logged at debug only), and returns the error.
func TestEpochRoundFailures(t *testing.T) {
	e := etcdtest.New(t)
	cli := e.NewClient()
	reg := prometheus.NewRegistry()
	h := &recordHandler{}
	cfg := testConfig("10.0.0.0/24")
	cfg.Registerer, cfg.Logger = reg, slog.New(h)
	a, err := New(etcdtest.Context(t), cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cli.Close()
	h.take()
	if err := a.epochs.round(context.Background()); err == nil {
		t.Fatal("epoch round with a closed client = nil; want its error")
	}
	if n := counter(t, reg, "allocd_allocator_epoch_failures_total", stepCount); n != 1 {
		t.Errorf("epoch failures of step count = %v; want 1", n)
	}
	for _, step := range []string{stepRecreate, stepBump, stepCollect} {
		if n := counter(t, reg, "allocd_allocator_epoch_failures_total", step); n != 0 {
			t.Errorf("epoch failures of step %s = %v; want 0", step, n)
		}
	}
	if got := h.take(); len(got) != 1 || got[0]["step"] != stepCount {
		t.Errorf("epoch round with a closed client logged %v; want one warning of step count", got)
	}
}
