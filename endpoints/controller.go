package endpoints

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/endpoints/kube"
	"github.com/allocd/allocd/leader"
)

// Config configures a Controller.
type Config struct {
	// Prefix is allocd's etcd prefix, e.g. "/allocd". Endpoints are stored under
	// <Prefix>/endpoints/<namespace>/<name>.
	Prefix string
	// Workers is the number of Services synced at once (--concurrent-endpoint-syncs);
	// 0 means DefaultWorkers.
	Workers int
	// BatchPeriod delays the sync after a Pod event so that the events of one period
	// make one write (--endpoint-updates-batch-period); 0 syncs at once.
	BatchPeriod time.Duration
	// MasterResync is how often the leader checks the stored Endpoints of
	// default/kubernetes against the master leases and rewrites them when they differ
	// (kube-apiserver's endpoint reconcile interval, --endpoint-reconciler-interval);
	// 0 means DefaultMasterResync.
	MasterResync time.Duration
	// DisableEndpoints and DisableEndpointSlices turn a controller off
	// (--controllers without endpoint, or without endpointslice). The Endpoints and
	// the EndpointSlice of default/kubernetes are kept either way, as kube-apiserver
	// keeps them.
	DisableEndpoints, DisableEndpointSlices bool
	// SliceWorkers is the number of Services whose slices are synced at once
	// (--concurrent-service-endpoint-syncs); 0 means DefaultWorkers.
	SliceWorkers int
	// SliceBatchPeriod delays the slices' sync after a Pod or Node event
	// (--endpointslice-updates-batch-period); 0 syncs at once.
	SliceBatchPeriod time.Duration
	// MaxEndpointsPerSlice (--max-endpoints-per-slice): 0 means
	// DefaultMaxEndpointsPerSlice; 1 to MaxMaxEndpointsPerSlice.
	MaxEndpointsPerSlice int
	// MaxTxnOps is the most compares (and ops) etcd takes in one transaction (its
	// --max-txn-ops); 0 means etcd's default, 128. A sync of one Service writes its
	// objects in one transaction while they fit.
	MaxTxnOps int
	// Logger receives one line per write and the term's changes; nil discards.
	Logger *slog.Logger
	// Registerer receives the metrics; nil means none.
	Registerer prometheus.Registerer
	// Clock times BatchPeriod, the retries' backoff and MasterResync; nil means the
	// real clock. Tests advance a fake one.
	Clock clockwork.Clock
}

// Controller is kube-controller-manager's endpoint and endpointslice controllers over
// etcd. For every Service with a selector it keeps the Endpoints object and the
// EndpointSlices Kubernetes would write (see the package doc for the rules and
// allocd's deliberate deviations); either controller may be off (Config).
//
// Only the leader writes: Lead runs one term of leadership, fenced by the election key
// (every write compares its CreateRevision), and the feeds (ApplyServiceSnapshot,
// ApplyPodSnapshot, ApplyNodeSnapshot, ApplyEvents) are taken only during a term. Each
// controller of a term writes nothing before it has the snapshots it reads (Services
// and Pods; the EndpointSlice controller Nodes too); then it syncs every Service and
// every stored object (the start-up sweep), and after that the keys the events touch.
// Reads (Get, List, Watch, ListSlices, WatchSlices) go to etcd and work on every
// replica.
//
// The feeds keep the Services, Pods and Nodes they are given, and Pods of one template
// share their labels and containers with each other: a caller must not change an
// object (or its maps and slices) after handing it over, but send a new one.
type Controller struct {
	cli     *clientv3.Client
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	prefix  string // <Prefix>/endpoints/
	// slicePrefix is <Prefix>/endpointslices/: slices are stored under
	// <slicePrefix><namespace>/<service>/<name>.
	slicePrefix string

	mu     sync.Mutex
	term   *term           // the current term, nil when not leading
	master *kube.Endpoints // default/kubernetes from the master leases, nil when none yet
}

// New returns a Controller. Call Lead for every term of leadership.
func New(cli *clientv3.Client, cfg Config) (*Controller, error) {
	if cli == nil {
		return nil, errors.New("endpoints: nil etcd client")
	}
	if cfg.Workers < 0 || cfg.BatchPeriod < 0 || cfg.MasterResync < 0 || cfg.SliceWorkers < 0 ||
		cfg.SliceBatchPeriod < 0 {
		return nil, fmt.Errorf("endpoints: negative workers %d/%d, batch period %v/%v or master resync %v",
			cfg.Workers, cfg.SliceWorkers, cfg.BatchPeriod, cfg.SliceBatchPeriod, cfg.MasterResync)
	}
	if cfg.MaxEndpointsPerSlice < 0 || cfg.MaxEndpointsPerSlice > MaxMaxEndpointsPerSlice {
		return nil, fmt.Errorf("endpoints: max endpoints per slice %d: want 1 to %d",
			cfg.MaxEndpointsPerSlice, MaxMaxEndpointsPerSlice)
	}
	if cfg.MaxTxnOps != 0 && cfg.MaxTxnOps < 2 {
		return nil, fmt.Errorf("endpoints: max txn ops %d: want at least 2", cfg.MaxTxnOps)
	}
	cfg.SliceWorkers = cmp.Or(cfg.SliceWorkers, DefaultWorkers)
	cfg.MaxEndpointsPerSlice = cmp.Or(cfg.MaxEndpointsPerSlice, DefaultMaxEndpointsPerSlice)
	cfg.MaxTxnOps = cmp.Or(cfg.MaxTxnOps, 128)
	if cfg.MasterResync == 0 {
		cfg.MasterResync = DefaultMasterResync
	}
	if cfg.Workers == 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Controller{
		cli:         cli,
		cfg:         cfg,
		log:         log.With("component", "endpoints"),
		prefix:      strings.TrimSuffix(cfg.Prefix, "/") + "/endpoints/",
		slicePrefix: strings.TrimSuffix(cfg.Prefix, "/") + "/endpointslices/",
	}
	m, err := newMetrics(cfg.Registerer, c.storedCounts)
	if err != nil {
		return nil, fmt.Errorf("endpoints metrics: %w", err)
	}
	c.metrics = m
	return c, nil
}

// Leading reports whether a term of leadership is running here.
func (c *Controller) Leading() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.term != nil
}

// currentTerm returns the running term or a *NotLeaderError.
func (c *Controller) currentTerm() (*term, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.term == nil {
		return nil, &leader.NotLeaderError{Controller: "endpoints"}
	}
	return c.term, nil
}

// Lead runs one term of leadership until ctx ends (the caller ends it when its election
// session is lost or at shutdown) or a write finds the fence gone. It returns nil when
// ctx ended, else why the term ended. Terms do not overlap: Lead waits for every
// goroutine of its term before it returns.
func (c *Controller) Lead(ctx context.Context, f leader.Fence) error {
	if !f.Valid() {
		return fmt.Errorf("endpoints: bad fence %+v", f)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	t := newTerm(c, f, cancel)
	c.mu.Lock()
	if c.term != nil {
		c.mu.Unlock()
		return errors.New("endpoints: Lead called while a term runs")
	}
	c.term = t
	master := c.master
	c.mu.Unlock()
	c.metrics.setLeader(true)
	c.log.InfoContext(ctx, "endpoints controller leading; waiting for Service and Pod snapshots",
		"fence_key", f.Key, "fence_rev", f.Rev)
	defer func() {
		c.mu.Lock()
		c.term = nil
		c.mu.Unlock()
		c.metrics.setLeader(false)
	}()
	if master != nil {
		t.masterc <- struct{}{}
	}
	err := t.run(ctx)
	if ctx.Err() != nil && context.Cause(ctx) == context.Canceled {
		return nil
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	c.log.WarnContext(ctx, "endpoints controller term ended", "error", err)
	return err
}

// ApplyServiceSnapshot replaces the Services of the term's inputs. Every Service is
// synced again, and every stored object (so that the Endpoints of a Service that is
// gone are deleted).
func (c *Controller) ApplyServiceSnapshot(ctx context.Context, rev int64, svcs []*kube.Service) error {
	t, err := c.currentTerm()
	if err != nil {
		return err
	}
	return t.applySnapshot(KindService, rev, func(in *inputs) { in.setServices(rev, svcs) })
}

// ApplyPodSnapshot replaces the Pods of the term's inputs, and syncs every Service.
func (c *Controller) ApplyPodSnapshot(ctx context.Context, rev int64, pods []*kube.Pod) error {
	t, err := c.currentTerm()
	if err != nil {
		return err
	}
	return t.applySnapshot(KindPod, rev, func(in *inputs) { in.setPods(rev, pods) })
}

// ApplyNodeSnapshot replaces the Nodes of the term's inputs (the EndpointSlice
// controller's zones and topology hints), and syncs every Service's slices.
func (c *Controller) ApplyNodeSnapshot(ctx context.Context, rev int64, nodes []*kube.Node) error {
	t, err := c.currentTerm()
	if err != nil {
		return err
	}
	return t.applySnapshot(KindNode, rev, func(in *inputs) { in.setNodes(rev, nodes) })
}

// ApplyEvents applies events in order on top of the snapshots of the term. An event of
// a kind with no snapshot in this term refuses the whole batch (*SnapshotRequiredError)
// before anything is applied. An event not newer than the revision applied for its
// kind is ignored. No event at all is a heartbeat: *SnapshotRequiredError while a
// controller of the term that is on lacks a snapshot of a feed it reads, so that a
// feeder learns of a new term.
func (c *Controller) ApplyEvents(ctx context.Context, evs []Event) (EventsResult, error) {
	t, err := c.currentTerm()
	if err != nil {
		return EventsResult{}, err
	}
	return t.applyEvents(evs)
}

// SetMasterEndpoints sets the Endpoints of default/kubernetes that the master leases
// produce; the leader stores them (and keeps them stored) under the same prefix as the
// others. e carries addresses and ports; its name, labels and bookkeeping are set here.
func (c *Controller) SetMasterEndpoints(e *kube.Endpoints) {
	e.ManagedBy = kube.ManagedByMasterLease
	c.mu.Lock()
	c.master = e
	t := c.term
	c.mu.Unlock()
	if t != nil {
		select {
		case t.masterc <- struct{}{}:
		default:
		}
	}
}

func (c *Controller) masterEndpoints() *kube.Endpoints {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.master
}

// masterKey is the Service whose Endpoints the master leases produce
// (SetMasterEndpoints): the term keeps them stored (master.go), the Endpoints
// controller leaves them alone.
const masterKey = "default/kubernetes"

// etcdKey is where the Endpoints of "ns/name" are stored.
func (c *Controller) etcdKey(key string) string { return c.prefix + key }

// storedCounts counts the stored Endpoints objects and the truncated ones, as the
// running term sees them (none when this replica does not lead).
func (c *Controller) storedCounts() (objects, truncated int) {
	c.mu.Lock()
	t := c.term
	c.mu.Unlock()
	if t == nil {
		return 0, 0
	}
	t.storedEndpoints.each(func(e *kube.Endpoints) {
		objects++
		if e.Annotations[kube.AnnotationOverCapacity] != "" {
			truncated++
		}
	})
	return objects, truncated
}
