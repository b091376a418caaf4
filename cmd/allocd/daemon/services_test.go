package daemon

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/allocd/allocd/endpoints/kube"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	"github.com/allocd/allocd/masterlease"
)

// TestMasterHandoffFailing: while the master leases' endpoints cannot be watched (here a
// lease manager whose Run has ended: every watch fails at once), every failure is counted
// in allocd_masterlease_endpoints_handoff_failures_total, and the streak is logged at
// warning once it has lasted handoffPatience, once; before that only at debug.
func TestMasterHandoffFailing(t *testing.T) {
	e := etcdtest.New(t)
	cli := e.NewClient()
	m, err := masterlease.New(etcdtest.Context(t), cli, masterlease.Config{Prefix: "/handoff/masterleases/"})
	if err != nil {
		t.Fatal(err)
	}
	stopped, stop := context.WithCancel(etcdtest.Context(t))
	stop()
	if err := m.Run(stopped); err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	reg := prometheus.NewRegistry()
	h, err := newMasterHandoff(m, nil, slog.New(slog.NewJSONHandler(&logs, nil)), reg) // info and above
	if err != nil {
		t.Fatal(err)
	}
	h.set = func(*kube.Endpoints) { t.Error("endpoints handed over from a stopped lease manager") }
	clock := clockwork.NewFakeClock()
	h.clock = clock
	ctx, cancel := context.WithCancel(etcdtest.Context(t))
	done := make(chan struct{})
	go func() { defer close(done); h.run(ctx) }()
	defer func() { cancel(); <-done }()

	const tries = 15
	for i := 1; i <= tries; i++ {
		if err := clock.BlockUntilContext(ctx, 1); err != nil { // the pause after a failure
			t.Fatal(err)
		}
		if got := counterValue(t, h.failures); got != float64(i) {
			t.Fatalf("after %d failed watches the counter is %v", i, got)
		}
		warned := len(logs.records(map[string]string{"level": "WARN"}))
		if want := min(1, max(0, i-int(handoffPatience/time.Second))); warned != want {
			t.Fatalf("after %d failed watches, a second apart: %d warnings; want %d\n%v", i, warned, want,
				logs.records(nil))
		}
		clock.Advance(time.Second)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
