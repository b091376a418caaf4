package compactor

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics of a Compactor.
type metrics struct {
	steps     *prometheus.CounterVec
	compacted prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allocd_etcd_compaction_steps_total",
			Help: "Compaction steps by result: compacted (this replica compacted), other_replica (another " +
				"replica compacted since this one last looked: standing by), recorded (first step: nothing " +
				"old enough yet), failed.",
		}, []string{"result"}),
		compacted: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "allocd_etcd_compacted_revision",
			Help: "The etcd revision compacted last, by this replica or (as the " +
				"compaction key says) another.",
		}),
	}
	for _, r := range []string{"compacted", "other_replica", "recorded", "failed"} {
		m.steps.WithLabelValues(r)
	}
	if err := register(reg, "metrics", m.steps, m.compacted); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers cs with reg (none when reg is nil); what names them in the error.
func register(reg prometheus.Registerer, what string, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("compactor: register %s: %w", what, err)
		}
	}
	return nil
}

func (m *metrics) step(result string) { m.steps.WithLabelValues(result).Inc() }

// memberMetrics of a Member.
type memberMetrics struct {
	size, inUse, quota prometheus.Gauge
	budget             prometheus.Gauge
	defrags            *prometheus.CounterVec
	defragSeconds      prometheus.Histogram
}

func newMemberMetrics(reg prometheus.Registerer) (*memberMetrics, error) {
	m := &memberMetrics{
		size: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "allocd_etcd_db_size_bytes",
			Help: "Size of the embedded etcd's database file: what its quota (--quota-backend-bytes) is " +
				"checked against.",
		}),
		inUse: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "allocd_etcd_db_size_in_use_bytes",
			Help: "Part of the embedded etcd's database file in use; the rest is free pages that " +
				"compaction left and defragmentation gives back.",
		}),
		quota: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "allocd_etcd_quota_backend_bytes",
			Help: "The embedded etcd's quota: when its database file reaches it, etcd raises the NOSPACE " +
				"alarm and refuses writes.",
		}),
		budget: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "allocd_etcd_history_budget_bytes",
			Help: "How much the embedded etcd's database in use may grow with history before allocd " +
				"compacts it: it grows with the store (a compaction's cost does).",
		}),
		defrags: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allocd_etcd_defrags_total",
			Help: "Defragmentations of the embedded etcd by result: done, failed.",
		}, []string{"result"}),
		defragSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "allocd_etcd_defrag_duration_seconds",
			Help:    "How long defragmentations of the embedded etcd took: etcd serves nothing meanwhile.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
	}
	for _, r := range []string{"done", "failed"} {
		m.defrags.WithLabelValues(r)
	}
	if err := register(reg, "member metrics", m.size, m.inUse, m.quota, m.budget, m.defrags,
		m.defragSeconds); err != nil {
		return nil, err
	}
	return m, nil
}
