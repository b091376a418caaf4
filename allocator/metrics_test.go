package allocator

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// scrapeOnRegister is a registry scraped as soon as anything is registered on it: the
// daemon serves /metrics before allocator.New, so a scrape may come at any point of New.
type scrapeOnRegister struct {
	*prometheus.Registry
	t *testing.T
}

// MustRegister registers cs, then scrapes the registry.
func (r scrapeOnRegister) MustRegister(cs ...prometheus.Collector) {
	r.Registry.MustRegister(cs...)
	if _, err := r.Gather(); err != nil {
		r.t.Errorf("scrape right after registration: %v", err)
	}
}

// Register registers c, then scrapes the registry.
func (r scrapeOnRegister) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	if _, err := r.Gather(); err != nil {
		r.t.Errorf("scrape right after registration: %v", err)
	}
	return nil
}

// TestScrapeDuringNew: a scrape of the metrics at any point of New succeeds: they are
// registered once the parts their collector reads (the index's ranges) exist.
func TestScrapeDuringNew(t *testing.T) {
	e := etcdtest.New(t)
	cfg := testConfig("10.0.0.0/24")
	reg := scrapeOnRegister{prometheus.NewRegistry(), t}
	cfg.Registerer = reg
	if _, err := New(etcdtest.Context(t), e.Client, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Errorf("scrape after New: %v", err)
	}
}
