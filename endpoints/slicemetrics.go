package endpoints

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allocd/allocd/endpoints/endpointslice"
	"github.com/allocd/allocd/endpoints/kube"
)

// sliceMetrics are the EndpointSlice controller's metrics, one for one those of
// kube-controller-manager's endpoint_slice_controller subsystem under the name
// allocd_endpointslice_* (counters with _total), plus the latency from an event's
// acknowledgement to the commit of the write it caused. The zero value records
// nothing.
type sliceMetrics struct {
	added, removed, changedPerSync *prometheus.HistogramVec
	desired, slices, desiredSlices prometheus.Gauge
	changes, syncs                 *prometheus.CounterVec
	byTraffic                      *prometheus.GaugeVec
	latency                        prometheus.Histogram

	mu       sync.Mutex
	services map[string]serviceEfficiency // by Service key
	total    serviceEfficiency
}

// serviceEfficiency is what one Service counts in the gauges.
type serviceEfficiency struct {
	endpoints, slices, desiredSlices int
	traffic                          string // its trafficDistribution, "" when none is used
}

func newSliceMetrics() *sliceMetrics {
	const sub = "allocd_endpointslice_"
	m := &sliceMetrics{services: map[string]serviceEfficiency{}}
	perSync := prometheus.ExponentialBuckets(2, 2, 15)
	m.added = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: sub + "endpoints_added_per_sync",
		Help: "Endpoints added by each sync of a Service's slices.", Buckets: perSync}, nil)
	m.removed = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: sub + "endpoints_removed_per_sync",
		Help: "Endpoints removed by each sync of a Service's slices.", Buckets: perSync}, nil)
	m.desired = prometheus.NewGauge(prometheus.GaugeOpts{Name: sub + "endpoints_desired",
		Help: "Endpoints the slices of every Service should hold."})
	m.slices = prometheus.NewGauge(prometheus.GaugeOpts{Name: sub + "num_endpoint_slices",
		Help: "EndpointSlices the controller keeps."})
	m.desiredSlices = prometheus.NewGauge(prometheus.GaugeOpts{Name: sub + "desired_endpoint_slices",
		Help: "EndpointSlices that would be needed with perfect packing: " +
			"per group ceil(endpoints/max), at least one per Service."})
	m.changes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: sub + "changes_total",
		Help: "EndpointSlices written by the controller, by operation: create, update, delete."},
		[]string{"operation"})
	m.changedPerSync = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: sub + "endpointslices_changed_per_sync",
		Help: "EndpointSlices written by one sync, by topology (Auto or Disabled) and " +
			"traffic_distribution.",
		Buckets: prometheus.DefBuckets}, []string{"topology", "traffic_distribution"})
	m.syncs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: sub + "syncs_total",
		Help: "Syncs of one Service's slices by result: success or error (retried with backoff)."},
		[]string{"result"})
	m.byTraffic = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: sub + "services_count_by_traffic_distribution",
		Help: "Services whose slices follow a trafficDistribution, by its value."},
		[]string{"traffic_distribution"})
	m.latency = prometheus.NewHistogram(prometheus.HistogramOpts{Name: sub + "event_to_commit_seconds",
		Help: "From the acknowledgement of the earliest event behind a slice write to the write's " +
			"commit in etcd.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)})
	// Zero-valued series, so that /metrics shows them before the first sync.
	for _, r := range []string{"success", "error"} {
		m.syncs.WithLabelValues(r)
	}
	for _, op := range []string{"create", "update", "delete"} {
		m.changes.WithLabelValues(op)
	}
	for _, td := range []string{kube.TrafficPreferClose, kube.TrafficPreferSameZone,
		kube.TrafficPreferSameNode} {
		m.byTraffic.WithLabelValues(td)
	}
	m.changedPerSync.WithLabelValues("Disabled", "")
	return m
}

func (m *sliceMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.added, m.removed, m.desired, m.slices, m.desiredSlices, m.changes,
		m.changedPerSync, m.syncs, m.byTraffic, m.latency}
}

// synced counts a sync's result.
func (m *sliceMetrics) synced(_ time.Duration, err error) {
	if m == nil {
		return
	}
	result := "success"
	if err != nil {
		result = "error"
	}
	m.syncs.WithLabelValues(result).Inc()
}

// sync records what a sync of svc's slices planned.
func (m *sliceMetrics) sync(key string, svc *kube.Service, plan *endpointslice.Plan, perSlice int) {
	if m == nil {
		return
	}
	m.added.WithLabelValues().Observe(float64(plan.Added))
	m.removed.WithLabelValues().Observe(float64(plan.Removed))
	topology, traffic := "Disabled", ""
	switch {
	case endpointslice.HintsEnabled(svc.Annotations):
		topology = "Auto"
	case endpointslice.ValidTrafficDistribution(svc.TrafficDistribution):
		traffic = svc.TrafficDistribution
	}
	m.changedPerSync.WithLabelValues(topology, traffic).Observe(float64(plan.Writes()))
	e := serviceEfficiency{traffic: traffic}
	for _, g := range plan.Efficiency {
		e.endpoints += g.Endpoints
		e.slices += g.Slices
		if g.Endpoints > 0 {
			e.desiredSlices += (g.Endpoints + perSlice - 1) / perSlice
		}
	}
	e.desiredSlices = max(e.desiredSlices, 1)
	m.set(key, &e)
}

// serviceGone forgets a Service that is gone (or has no slices any more).
func (m *sliceMetrics) serviceGone(key string) {
	if m != nil {
		m.set(key, nil)
	}
}

// set replaces what key counts (nil: nothing) and updates the gauges.
func (m *sliceMetrics) set(key string, e *serviceEfficiency) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.services[key]; ok {
		m.total.endpoints -= old.endpoints
		m.total.slices -= old.slices
		m.total.desiredSlices -= old.desiredSlices
		if old.traffic != "" {
			m.byTraffic.WithLabelValues(old.traffic).Dec()
		}
		delete(m.services, key)
	}
	if e != nil {
		m.services[key] = *e
		m.total.endpoints += e.endpoints
		m.total.slices += e.slices
		m.total.desiredSlices += e.desiredSlices
		if e.traffic != "" {
			m.byTraffic.WithLabelValues(e.traffic).Inc()
		}
	}
	m.desired.Set(float64(m.total.endpoints))
	m.slices.Set(float64(m.total.slices))
	m.desiredSlices.Set(float64(m.total.desiredSlices))
}

// wrote counts the slices a committed write created, updated and deleted.
func (m *sliceMetrics) wrote(creates, updates, deletes int) {
	if m == nil {
		return
	}
	m.changes.WithLabelValues("create").Add(float64(creates))
	m.changes.WithLabelValues("update").Add(float64(updates))
	m.changes.WithLabelValues("delete").Add(float64(deletes))
}

// eventToCommit observes the latency from an event to the commit of its write.
func (m *sliceMetrics) eventToCommit(d time.Duration) {
	if m != nil {
		m.latency.Observe(d.Seconds())
	}
}
