package endpoints

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the controller's metrics; the zero value (no Registerer) records nothing.
// Their Kubernetes counterparts: endpoint_controller's sync duration and the
// network-programming latency SLI (here: from an event's acknowledgement to its commit).
type metrics struct {
	writes   *prometheus.CounterVec
	syncs    *prometheus.CounterVec
	duration prometheus.Histogram
	latency  prometheus.Histogram
	feed     *prometheus.CounterVec
	leader   prometheus.Gauge
	snapRev  *prometheus.GaugeVec
	// unreadable, restarts and masterErrors count what a term survives without a
	// sync's result to show it (each is logged at warning too).
	unreadable, restarts *prometheus.CounterVec
	masterErrors         prometheus.Counter
	// slice are the EndpointSlice controller's.
	slice *sliceMetrics
}

// newMetrics registers the metrics on reg; stored counts the stored Endpoints objects and
// the truncated ones when the metrics are scraped.
func newMetrics(reg prometheus.Registerer, stored func() (objects, truncated int)) (*metrics, error) {
	m := &metrics{}
	if reg == nil {
		return m, nil
	}
	m.writes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allocd_endpoints_writes_total",
		Help: "Endpoints objects written to etcd by the leader, by kind: create, update, delete.",
	}, []string{"kind"})
	m.syncs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allocd_endpoints_syncs_total",
		Help: "Syncs of one Service's Endpoints by result: ok or error (retried with backoff).",
	}, []string{"result"})
	m.duration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "allocd_endpoints_sync_duration_seconds",
		Help:    "Duration of one Service's sync (compute, compare and, when needed, the etcd write).",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14),
	})
	m.latency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "allocd_endpoints_event_to_commit_seconds",
		Help: "From the acknowledgement of the earliest event behind a write " +
			"to the write's commit in etcd.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	})
	m.feed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allocd_endpoints_feed_events_total",
		Help: "Service, Pod and Node events taken by the leader, by result: applied or ignored.",
	}, []string{"result"})
	m.leader = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "allocd_endpoints_leader",
		Help: "1 while this replica runs the Endpoints controller's term of leadership.",
	})
	m.snapRev = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "allocd_endpoints_snapshot_revision",
		Help: "Source revision of the last snapshot applied in this term, by kind (Service, Pod, Node).",
	}, []string{"kind"})
	m.unreadable = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allocd_endpoints_unreadable_objects_total",
		Help: "Stored objects that did not decode when the leader read them, by kind (Endpoints: " +
			"kept as an object nobody wrote, which a sync writes over; EndpointSlice: kept as a slice " +
			"nobody manages).",
	}, []string{"kind"})
	m.restarts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allocd_endpoints_watch_restarts_total",
		Help: "The leader's list-and-watch sessions of the stored objects that ended with an error " +
			"(each followed by a listing again), by kind.",
	}, []string{"kind"})
	m.masterErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "allocd_endpoints_master_write_errors_total",
		Help: "Failed writes of the Endpoints and EndpointSlice of default/kubernetes " +
			"(retried after a second).",
	})
	objects := prometheus.NewDesc("allocd_endpoints_objects",
		"Endpoints objects stored in etcd, as the leader sees them (0 on other replicas).", nil, nil)
	truncated := prometheus.NewDesc("allocd_endpoints_truncated_objects",
		"Stored Endpoints objects truncated to 1000 addresses (over-capacity annotation set).", nil, nil)
	col := collector{stored: stored, objects: objects, truncated: truncated}
	m.slice = newSliceMetrics()
	for _, x := range append([]prometheus.Collector{m.writes, m.syncs, m.duration, m.latency, m.feed,
		m.leader, m.snapRev, m.unreadable, m.restarts, m.masterErrors, col},
		m.slice.collectors()...) {
		if err := reg.Register(x); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) setLeader(on bool) {
	if m.leader == nil {
		return
	}
	v := 0.0
	if on {
		v = 1
	}
	m.leader.Set(v)
}

func (m *metrics) snapshot(k Kind, rev int64) {
	if m.snapRev != nil {
		m.snapRev.WithLabelValues(string(k)).Set(float64(rev))
	}
}

func (m *metrics) events(applied, ignored int) {
	if m.feed != nil {
		m.feed.WithLabelValues("applied").Add(float64(applied))
		m.feed.WithLabelValues("ignored").Add(float64(ignored))
	}
}

func (m *metrics) synced(d time.Duration, err error) {
	if m.duration == nil {
		return
	}
	m.duration.Observe(d.Seconds())
	if err != nil {
		m.syncs.WithLabelValues("error").Inc()
	} else {
		m.syncs.WithLabelValues("ok").Inc()
	}
}

func (m *metrics) wrote(kind string) {
	if m.writes != nil {
		m.writes.WithLabelValues(kind).Inc()
	}
}

func (m *metrics) eventToCommit(d time.Duration) {
	if m.latency != nil {
		m.latency.Observe(d.Seconds())
	}
}

// viewMetrics count what a view of one kind of stored object survives (nil: none).
type viewMetrics struct{ unreadable, restarts prometheus.Counter }

// viewCounters returns the counters of the view of kind (their series exist from then on).
func (m *metrics) viewCounters(kind string) viewMetrics {
	if m.unreadable == nil {
		return viewMetrics{}
	}
	return viewMetrics{unreadable: m.unreadable.WithLabelValues(kind),
		restarts: m.restarts.WithLabelValues(kind)}
}

// masterWriteFailed counts a failed write of default/kubernetes' objects.
func (m *metrics) masterWriteFailed() {
	if m.masterErrors != nil {
		m.masterErrors.Inc()
	}
}

// collector reads the object counts when scraped.
type collector struct {
	stored             func() (objects, truncated int)
	objects, truncated *prometheus.Desc
}

func (col collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- col.objects
	ch <- col.truncated
}

func (col collector) Collect(ch chan<- prometheus.Metric) {
	n, trunc := col.stored()
	ch <- prometheus.MustNewConstMetric(col.objects, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(col.truncated, prometheus.GaugeValue, float64(trunc))
}
