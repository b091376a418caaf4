package masterlease

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the allocd_masterlease_* metrics. A nil *metrics records nothing.
type metrics struct {
	renews   *prometheus.CounterVec
	removes  *prometheus.CounterVec
	restores *prometheus.CounterVec
}

var (
	leasesDesc = prometheus.NewDesc("allocd_masterlease_leases",
		"Live master leases, as this replica's watch sees them.", nil, nil)
	sinceRenewDesc = prometheus.NewDesc("allocd_masterlease_seconds_since_renew",
		"Seconds since each live master lease was last renewed; a value near the TTL is a "+
			"replica about to drop out.",
		[]string{"ip"}, nil)
	ttlDesc = prometheus.NewDesc("allocd_masterlease_ttl_seconds",
		"TTL granted to each live master lease.", []string{"ip"}, nil)
	addressesDesc = prometheus.NewDesc("allocd_masterlease_endpoints_addresses",
		"Addresses in the published endpoints of the kubernetes service.", nil, nil)
	guardedDesc = prometheus.NewDesc("allocd_masterlease_endpoints_guarded",
		"1 while storage lists no lease and the last non-empty endpoints are kept by the guard.", nil, nil)
)

func newMetrics(reg prometheus.Registerer, m *Manager) (*metrics, error) {
	mt := &metrics{
		renews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allocd_masterlease_renews_total",
			Help: "Renew calls by result: created, renewed (same etcd lease kept alive), replaced (new " +
				"TTL, new lease), invalid, error.",
		}, []string{"result"}),
		removes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allocd_masterlease_removes_total",
			Help: "RemoveLease calls by result: removed, absent, invalid, error.",
		}, []string{"result"}),
		restores: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allocd_masterlease_restores_total",
			Help: "Master lease keys etcd deleted while their lease was renewed in time (a stale etcd " +
				"leader's revocation), by how their restore ended: restored, superseded (written " +
				"meanwhile, or removed), expired, nospace (etcd out of space), deleted (by a write, its " +
				"etcd lease alive), canceled.",
		}, []string{"result"}),
	}
	for _, r := range []string{"created", "renewed", "replaced", "invalid", "error"} {
		mt.renews.WithLabelValues(r)
	}
	for _, r := range []string{"removed", "absent", "invalid", "error"} {
		mt.removes.WithLabelValues(r)
	}
	for _, r := range []string{"restored", "superseded", "expired", "nospace", "deleted", "canceled"} {
		mt.restores.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{mt.renews, mt.removes, mt.restores, collector{m}} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("masterlease: register metrics: %w", err)
		}
	}
	return mt, nil
}

func (mt *metrics) renewed(result string) {
	if mt != nil {
		mt.renews.WithLabelValues(result).Inc()
	}
}

func (mt *metrics) removed(result string) {
	if mt != nil {
		mt.removes.WithLabelValues(result).Inc()
	}
}

func (mt *metrics) restoredOne(result string) {
	if mt != nil {
		mt.restores.WithLabelValues(result).Inc()
	}
}

// collector reads the gauges from the Manager's state at scrape time, so that the
// seconds since a renew keep counting between events and a lease's series goes away
// with the lease.
type collector struct{ m *Manager }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- leasesDesc
	ch <- sinceRenewDesc
	ch <- ttlDesc
	ch <- addressesDesc
	ch <- guardedDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.m.snapshot()
	now := time.Now()
	ch <- prometheus.MustNewConstMetric(leasesDesc, prometheus.GaugeValue, float64(len(s.leases)))
	for a, st := range s.leases {
		ip := a.String()
		ch <- prometheus.MustNewConstMetric(sinceRenewDesc, prometheus.GaugeValue,
			now.Sub(st.renewed).Seconds(), ip)
		ch <- prometheus.MustNewConstMetric(ttlDesc, prometheus.GaugeValue, float64(st.ttl), ip)
	}
	ch <- prometheus.MustNewConstMetric(addressesDesc, prometheus.GaugeValue, float64(s.eps))
	guarded := 0.0
	if s.guarded {
		guarded = 1
	}
	ch <- prometheus.MustNewConstMetric(guardedDesc, prometheus.GaugeValue, guarded)
}
