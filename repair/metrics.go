package repair

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the repair metrics; the zero value (no Registerer) records nothing.
type metrics struct {
	findings   *prometheus.CounterVec
	candidates *prometheus.GaugeVec
	duration   prometheus.Histogram
	passes     *prometheus.CounterVec
	leader     prometheus.Gauge
	snapRev    prometheus.Gauge
	snapSvcs   prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{}
	if reg == nil {
		return m, nil
	}
	m.findings = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allocd_repair_findings_total",
		Help: "Findings of repair passes (dry runs excluded), by range and reason.",
	}, []string{"range", "reason"})
	m.candidates = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "allocd_repair_leak_candidates",
		Help: "Allocations that no Service of the snapshot uses, counting down to release, by range.",
	}, []string{"range"})
	m.duration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "allocd_repair_pass_duration_seconds",
		Help:    "Duration of repair passes (dry runs included).",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	})
	m.passes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allocd_repair_passes_total",
		Help: "Repair passes by result: ok, stopped (a range is full) or error.",
	}, []string{"result"})
	m.leader = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "allocd_repair_leader",
		Help: "1 while this replica is the elected repair leader.",
	})
	m.snapRev = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "allocd_repair_snapshot_revision",
		Help: "Revision of the Service snapshot accepted last.",
	})
	m.snapSvcs = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "allocd_repair_snapshot_services",
		Help: "Services in the Service snapshot accepted last.",
	})
	for _, c := range []prometheus.Collector{m.findings, m.candidates, m.duration, m.passes, m.leader,
		m.snapRev, m.snapSvcs} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) finding(rng string, r Reason) {
	if m.findings != nil {
		m.findings.WithLabelValues(rng, string(r)).Inc()
	}
}

func (m *metrics) pass(seconds float64, result string) {
	if m.duration != nil {
		m.duration.Observe(seconds)
		m.passes.WithLabelValues(result).Inc()
	}
}

// leakCandidates sets the gauge of every range (ranges without candidates read 0).
func (m *metrics) leakCandidates(ranges []string, byRange map[string]int) {
	if m.candidates == nil {
		return
	}
	m.candidates.Reset()
	for _, r := range ranges {
		m.candidates.WithLabelValues(r).Set(float64(byRange[r]))
	}
	for r, n := range byRange {
		m.candidates.WithLabelValues(r).Set(float64(n))
	}
}

func (m *metrics) setLeader(on bool) {
	if m.leader != nil {
		v := 0.0
		if on {
			v = 1
		}
		m.leader.Set(v)
	}
}

func (m *metrics) snapshot(rev int64, services int) {
	if m.snapRev != nil {
		m.snapRev.Set(float64(rev))
		m.snapSvcs.Set(float64(services))
	}
}
