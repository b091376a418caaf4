package admit

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Results of an admission request, the result label of allocd_webhook_requests_total.
const (
	// ResultAllowed is a request let through unchanged: nothing to allocate (or left
	// to kube-apiserver, which refuses it in its own words), a dry run, the kubernetes
	// Service, a headless or ExternalName Service.
	ResultAllowed = "allowed"
	// ResultPatched is a request let through with allocd's addresses and ports.
	ResultPatched = "patched"
	// ResultDenied is a request refused as kube-apiserver would refuse it (a taken or
	// foreign address or port asked for, a full range).
	ResultDenied = "denied"
	// ResultError is a request the webhook could not serve (allocd unreachable, an
	// undecodable review): its failurePolicy decides.
	ResultError = "error"
)

// metrics are the webhook's.
type metrics struct {
	requests  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	disagreed prometheus.Counter
	allocdUp  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allocd_webhook_requests_total",
			Help: "Admission requests, by operation (CREATE, UPDATE, other) and result " +
				"(allowed, patched, denied, error).",
		}, []string{"operation", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "allocd_webhook_request_duration_seconds",
			Help: "Time to answer an admission request, from its arrival to the answer written, " +
				"by operation.",
			Buckets: []float64{0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1,
				0.25, 0.5, 1, 2.5, 5, 10},
		}, []string{"operation"}),
		disagreed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "allocd_webhook_cluster_held_total",
			Help: "Addresses and ports allocd handed out that the cluster uses (not adopted yet), " +
				"moved to their holder.",
		}),
		allocdUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "allocd_webhook_allocd_reachable",
			Help: "1 when allocd answered the webhook's last health check, 0 when it did not.",
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.disagreed, m.allocdUp} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
