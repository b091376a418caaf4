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
