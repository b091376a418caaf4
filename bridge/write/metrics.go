package write

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics counts a Writer's work; one Metrics serves every kind (label kind).
type Metrics struct {
	syncs    *prometheus.CounterVec
	duration *prometheus.HistogramVec
	writes   *prometheus.CounterVec
	sweeps   *prometheus.CounterVec
}

// NewMetrics registers the writers' metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allocd_bridge_syncs_total",
			Help: "Syncs of one object into the cluster, by kind and result (success, error).",
		}, []string{"kind", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "allocd_bridge_sync_duration_seconds",
			Help:    "Time one sync of an object into the cluster took, by kind.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"kind"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allocd_bridge_writes_total",
			Help: "Writes to the API server, by kind and verb (create, update, delete); a sync that found the object as wanted writes nothing.",
		}, []string{"kind", "verb"}),
		sweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allocd_bridge_sweeps_total",
			Help: "Sweeps of what allocd deleted while no bridge ran, by kind and result " +
				"(done; held: allocd looked reset).",
		}, []string{"kind", "result"}),
	}
	reg.MustRegister(m.syncs, m.duration, m.writes, m.sweeps)
	return m
}

func (m *Metrics) observeSync(kind string, d time.Duration, err error) {
	if m == nil {
		return
	}
	result := "success"
	if err != nil {
		result = "error"
	}
	m.syncs.WithLabelValues(kind, result).Inc()
	m.duration.WithLabelValues(kind).Observe(d.Seconds())
}

// Wrote counts one write of verb for kind.
func (m *Metrics) Wrote(kind, verb string) {
	if m == nil {
		return
	}
	m.writes.WithLabelValues(kind, verb).Inc()
}

func (m *Metrics) swept(kind, result string) {
	if m == nil {
		return
	}
	m.sweeps.WithLabelValues(kind, result).Inc()
}
