package allocator

import (
	"log/slog"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
)

// The background steps of the allocator, as allocd_allocator_background_failures_total
// labels them.
const (
	stepWatchProgress = "watch_progress" // ask etcd for a progress notification of the index's watch
	stepIndexWait     = "index_wait"     // wait for the index to see a ServiceCIDR written
	stepListFallback  = "list_fallback"  // ListExcept found the index behind: it listed everything
	stepCheckpoint    = "checkpoint"     // write a checkpoint of the index
	stepDrain         = "drain"          // remove a drained ServiceCIDR
	stepHoldersSeed   = "holders_seed"   // seed the holders from a listing
)

var backgroundSteps = []string{stepWatchProgress, stepIndexWait, stepListFallback, stepCheckpoint,
	stepDrain, stepHoldersSeed}

// failures logs and counts the failures of the background steps of one kind (the
// epoch's, or the others'): each counts (by step, when metrics are on) and is logged at
// warning, the first of a run of failures of its step and then at most once every
// failureLogEvery, so that a step that fails at every tick (four times a second while
// etcd is away) neither goes unseen nor floods the log. ok ends a step's run; the line
// after a run says how many failed. A nil *failures records nothing.
type failures struct {
	log     *slog.Logger
	counter *prometheus.CounterVec // nil: not counted
	clock   clockwork.Clock        // of the log's pace
	mu      sync.Mutex
	runs    map[string]*failureRun // the failing steps
}

// failureRun is a step's run of failures: how many, and when it was last logged.
type failureRun struct {
	n      int
	logged time.Time
}

// failureLogEvery is how often a step that keeps failing is logged.
const failureLogEvery = time.Minute

func newFailures(log *slog.Logger, counter *prometheus.CounterVec) *failures {
	return &failures{log: log, counter: counter, clock: clockwork.NewRealClock(),
		runs: map[string]*failureRun{}}
}

// fail records a failure of step: msg and err, logged as failures says.
func (f *failures) fail(step, msg string, err error, attrs ...any) {
	if f == nil {
		return
	}
	if f.counter != nil {
		f.counter.WithLabelValues(step).Inc()
	}
	f.mu.Lock()
	r := f.runs[step]
	if r == nil {
		r = &failureRun{}
		f.runs[step] = r
	}
	r.n++
	n, log := r.n, r.n == 1 || f.clock.Since(r.logged) >= failureLogEvery
	if log {
		r.logged = f.clock.Now()
	}
	f.mu.Unlock()
	if log {
		f.log.Warn(msg, append([]any{"step", step, "err", err, "failures", n}, attrs...)...)
	}
}

// ok ends step's run of failures, if any, and says so at info.
func (f *failures) ok(step string) {
	if f == nil {
		return
	}
	f.mu.Lock()
	r := f.runs[step]
	delete(f.runs, step)
	f.mu.Unlock()
	if r != nil {
		f.log.Info("step works again", "step", step, "failures", r.n)
	}
}
