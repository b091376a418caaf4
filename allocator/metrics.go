package allocator

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the allocator's Prometheus metrics; a nil *metrics records nothing.
type metrics struct {
	// ranges reports the ranges for the gauges, when scraped (the index's).
	ranges   func() []RangeInfo
	errs     *prometheus.CounterVec
	duration prometheus.Histogram
	batchReq prometheus.Histogram
	txns     *prometheus.CounterVec
	allocs   *prometheus.CounterVec
	// epochFails and bgFails count what a background step failed to do (failures).
	epochFails, bgFails *prometheus.CounterVec
	// register registers the metrics on the registerer newMetrics was given: once the
	// parts that ranges reads exist, so that no scrape comes before them.
	register func()

	allocatedDesc, availableDesc *prometheus.Desc
}

func newMetrics(ranges func() []RangeInfo, reg prometheus.Registerer) *metrics {
	if reg == nil {
		return nil
	}
	m := &metrics{
		ranges: ranges,
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allocd_allocator_allocation_errors_total",
			Help: "Allocate calls that failed, by reason.",
		}, []string{"reason"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "allocd_allocator_allocate_duration_seconds",
			Help:    "Latency of Allocate, from validation to the etcd commit.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		batchReq: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "allocd_allocator_commit_batch_requests",
			Help:    "Requests packed into one group-commit transaction.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
		}),
		txns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allocd_allocator_commit_transactions_total",
			Help: "Group-commit transactions, by result (committed, conflict, error).",
		}, []string{"result"}),
		allocatedDesc: prometheus.NewDesc("allocd_allocator_allocated",
			"Allocated items per range and band, as the index sees them.", []string{"range", "band"}, nil),
		availableDesc: prometheus.NewDesc("allocd_allocator_available",
			"Free items per range and band, as the index sees them.", []string{"range", "band"}, nil),
	}
	allocs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allocd_allocator_allocations_total",
		Help: "Items allocated by this replica, by range and scope (specific: the item was named in the " +
			"request; dynamic: picked).",
	}, []string{"range", "scope"})
	m.allocs = allocs
	for _, reason := range []string{"full", "allocated", "not_in_range", "no_range", "conflict", "invalid",
		"canceled", "other"} {
		m.errs.WithLabelValues(reason)
	}
	m.epochFails = stepCounter("allocd_allocator_epoch_failures_total",
		"Failed steps of the epoch's loop (recreate the epoch key, count the waiting tombstones, "+
			"move the epoch on, collect tombstones), by step: while they fail, tombstones pile up.",
		epochSteps)
	m.bgFails = stepCounter("allocd_allocator_background_failures_total",
		"Failed background steps of the allocator (its index's watch and waits, checkpoints, the "+
			"removal of drained ServiceCIDRs, the holders), by step.", backgroundSteps)
	m.register = func() {
		reg.MustRegister(m.errs, m.duration, m.batchReq, m.txns, allocs, m.epochFails, m.bgFails, m)
	}
	return m
}

// stepCounter is a counter of failures by step, each step's at 0 from the start (so
// that an alert on its increase sees the first one).
func stepCounter(name, help string, steps []string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"step"})
	for _, step := range steps {
		c.WithLabelValues(step)
	}
	return c
}

// Describe implements prometheus.Collector for the per-range gauges.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.allocatedDesc
	ch <- m.availableDesc
}

// Collect implements prometheus.Collector: the gauges are computed from the index
// when scraped.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, ri := range m.ranges() {
		for _, b := range []struct {
			name string
			band Band
		}{{"static", ri.Static}, {"dynamic", ri.Dynamic}} {
			ch <- prometheus.MustNewConstMetric(m.allocatedDesc, prometheus.GaugeValue, float64(b.band.Used),
				ri.Name, b.name)
			ch <- prometheus.MustNewConstMetric(m.availableDesc, prometheus.GaugeValue,
				float64(b.band.Size-b.band.Used), ri.Name, b.name)
		}
	}
}

// epochCounter is allocd_allocator_epoch_failures_total, nil without metrics.
func (m *metrics) epochCounter() *prometheus.CounterVec {
	if m == nil {
		return nil
	}
	return m.epochFails
}

// backgroundCounter is allocd_allocator_background_failures_total, nil without
// metrics.
func (m *metrics) backgroundCounter() *prometheus.CounterVec {
	if m == nil {
		return nil
	}
	return m.bgFails
}

// counters gives r its allocation counters, labelled with its name (a ServiceCIDR's
// range gets them when the index first sees it).
func (m *metrics) counters(r *rng) {
	if m == nil {
		return
	}
	r.allocSpecific = m.allocs.WithLabelValues(r.name, "specific")
	r.allocDynamic = m.allocs.WithLabelValues(r.name, "dynamic")
}

func (m *metrics) allocated(r *rng, specific bool) {
	if m == nil {
		return
	}
	if specific {
		r.allocSpecific.Inc()
	} else {
		r.allocDynamic.Inc()
	}
}

func (m *metrics) failed(reason string) {
	if m != nil {
		m.errs.WithLabelValues(reason).Inc()
	}
}

func (m *metrics) batch(n int) {
	if m != nil {
		m.batchReq.Observe(float64(n))
	}
}

func (m *metrics) txn(result string) {
	if m != nil {
		m.txns.WithLabelValues(result).Inc()
	}
}

// observe records an Allocate's latency and, when it failed, the reason.
func (m *metrics) observe(d time.Duration, err error) {
	if m == nil {
		return
	}
	m.duration.Observe(d.Seconds())
	if err != nil {
		m.failed(reason(err))
	}
}

// reason is the errors_total label of err.
func reason(err error) string {
	var ie *InvalidError
	switch {
	case errors.As(err, &ie):
		return "invalid"
	case errors.Is(err, ErrNotInRange):
		return "not_in_range"
	case errors.Is(err, ErrNoRange):
		return "no_range"
	case errors.Is(err, ErrFull):
		return "full"
	case errors.Is(err, ErrAllocated):
		return "allocated"
	case errors.Is(err, ErrConflict):
		return "conflict"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	}
	return "other"
}
