package compactor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// KeyName is the name of the compaction key under allocd's etcd prefix, as
// kube-apiserver names its own.
const KeyName = "/compact_rev_key"

// compactTimeout bounds one step: the transaction and the compaction, which waits
// until etcd has deleted the old revisions from its database (physical).
const compactTimeout = time.Minute

// Config says what a Compactor compacts and how often.
type Config struct {
	// Key is the compaction key, <prefix>/compact_rev_key.
	Key string
	// Interval is the time between compactions (kube-apiserver's
	// --etcd-compaction-interval); it must be > 0.
	Interval time.Duration
	// Logger; slog.Default() when nil.
	Logger *slog.Logger
	// Registerer gets the metrics; nil: none.
	Registerer prometheus.Registerer
	// Clock times the interval; nil: the real clock. Tests advance a fake one.
	Clock clockwork.Clock
}

// Compactor compacts etcd's history older than one interval, coordinated with every
// other replica through the compaction key (see the package comment). Run it once.
type Compactor struct {
	cli      *clientv3.Client
	key      string
	interval time.Duration
	clock    clockwork.Clock
	log      *slog.Logger
	m        *metrics
	hurry    chan int64 // revisions Hurry asks to compact now
	// hurryFailures counts the hurried steps that failed (HurryFailures).
	hurryFailures atomic.Int64

	// Only the goroutine that runs Run (or RunOnce) uses these.
	version   int64 // the compaction key's version as last seen (kube's compact time)
	rev       int64 // etcd's revision at the last step: the next compaction's target
	compacted int64 // the highest revision known compacted: the gauge's value
}

// New returns a Compactor of cfg on cli.
func New(cli *clientv3.Client, cfg Config) (*Compactor, error) {
	if cfg.Interval <= 0 {
		return nil, fmt.Errorf("compactor: interval %v: want > 0", cfg.Interval)
	}
	if cfg.Key == "" {
		return nil, errors.New("compactor: empty key")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	clock := cfg.Clock
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	return &Compactor{cli: cli, key: cfg.Key, interval: cfg.Interval, clock: clock,
		log: log.With("component", "compactor"),
		m:   m, hurry: make(chan int64, 1)}, nil
}

// Run runs a step every interval, and one at once for every Hurry, until ctx ends; it
// then returns nil. A step that fails is logged and counted, and the next one comes an
// interval later, as kube-apiserver's, or with the next Hurry (a Member hurries again
// after a hurried step failed: HurryFailures).
func (c *Compactor) Run(ctx context.Context) error {
	t := c.clock.NewTimer(c.interval)
	defer t.Stop()
	for {
		hurried := int64(0)
		select {
		case <-ctx.Done():
			return nil
		case <-t.Chan():
		case hurried = <-c.hurry:
		}
		if _, err := c.step(ctx, hurried); err != nil && ctx.Err() == nil {
			c.log.Warn("etcd compaction failed; trying again next interval, or at the next hurry",
				"err", err, "interval", c.interval, "hurried", hurried > 0)
		}
		t.Reset(c.interval)
	}
}

// RunOnce runs one step now: it compacts the revision of the previous step if the
// compaction key shows no other replica compacted since, and returns the revision it
// compacted (0 when it compacted nothing). Not safe to call while Run runs.
func (c *Compactor) RunOnce(ctx context.Context) (int64, error) { return c.step(ctx, 0) }

// Hurry asks Run for a step now that compacts rev (a revision the caller read a while
// ago: the history since is kept) rather than the previous step's: the history outgrew
// its budget. It never blocks; a newer request replaces one Run has not taken yet.
//
// Hurry is for the Member of an etcd that allocd runs itself (the embedded one): when
// that etcd is out of space (NOSPACE) and refuses the compaction key's write, a hurried
// step compacts rev all the same, without the key, as only Compact frees its space. A
// step that is not hurried (every interval, on any etcd) then fails, as
// kube-apiserver's does: an external etcd's space is its operator's.
func (c *Compactor) Hurry(rev int64) {
	for {
		select {
		case c.hurry <- rev:
			return
		default:
		}
		select {
		case old := <-c.hurry:
			rev = max(rev, old)
		default:
		}
	}
}

// HurryFailures is the number of hurried steps that failed so far: a Member that
// hurried sees that its hurry freed nothing, and hurries again (its history budget
// still counted from before the hurry) instead of waiting for the next interval.
func (c *Compactor) HurryFailures() int64 { return c.hurryFailures.Load() }

// step is one step of kube-apiserver's algorithm. hurried > 0 compacts that revision
// instead of the previous step's, even on this replica's first step (which otherwise
// only records: it knows no revision one interval old), and tries the compare again at
// once if another replica stepped since this one last looked. A hurried step also
// compacts when etcd refuses the compaction key's write for lack of space (see Hurry).
func (c *Compactor) step(ctx context.Context, hurried int64) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, compactTimeout)
	defer cancel()
	compacted, err := c.stepOnce(ctx, hurried)
	if err != nil && hurried > 0 {
		c.hurryFailures.Add(1)
	}
	return compacted, err
}

// stepOnce is step without its timeout and its count of failed hurries.
func (c *Compactor) stepOnce(ctx context.Context, hurried int64) (int64, error) {
	target := c.rev
	if hurried > 0 {
		target = hurried
	}
	won, err := c.cas(ctx, target)
	if err == nil && !won && hurried > 0 {
		won, err = c.cas(ctx, target)
	}
	if hurried > 0 && errors.Is(err, rpctypes.ErrNoSpace) {
		// etcd is out of space (NOSPACE) and refuses the key's write, but not a
		// compaction: compact without the key. The replicas' turns are not kept; two
		// compactions of the same history are harmless (the second is ErrCompacted).
		c.log.Warn("etcd out of space: compacting without the compaction key", "revision", target)
		won, err = true, nil
	}
	switch {
	case err != nil:
		c.m.step("failed")
		return 0, err
	case !won:
		c.m.step("other_replica") // another replica compacted since this one last looked: stand by
		return 0, nil
	case target == 0:
		c.m.step("recorded") // the first step: nothing is one interval old yet
		return 0, nil
	}
	start := time.Now()
	if _, err := c.cli.Compact(ctx, target, clientv3.WithCompactPhysical()); err != nil &&
		!errors.Is(err, rpctypes.ErrCompacted) {
		c.m.step("failed")
		return 0, fmt.Errorf("compact revision %d: %w", target, err)
	}
	// ErrCompacted: something else (etcd's own auto-compaction, another compactor)
	// compacted past target already; the history is as short as asked.
	c.m.step("compacted")
	c.raiseCompacted(target)
	c.log.Debug("etcd history compacted", "revision", target, "hurried", hurried > 0,
		"took", time.Since(start).Round(time.Millisecond))
	return target, nil
}

// raiseCompacted sets the compacted revision gauge to rev if that raises it: a
// revision compacted already (ErrCompacted), or one another replica compacted before
// the one this replica last saw in the key, is no news.
func (c *Compactor) raiseCompacted(rev int64) {
	if rev > c.compacted {
		c.compacted = rev
		c.m.compacted.Set(float64(rev))
	}
}

// cas is the compare-and-swap of a step: if the compaction key's version is the one
// this replica saw last, put target in it (the version goes up by one) and report
// true; else learn the version from the answer. Either way, etcd's revision of the
// answer is the next step's target.
func (c *Compactor) cas(ctx context.Context, target int64) (bool, error) {
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Version(c.key), "=", c.version)).
		Then(clientv3.OpPut(c.key, strconv.FormatInt(target, 10))).
		Else(clientv3.OpGet(c.key)).
		Commit()
	if err != nil {
		return false, fmt.Errorf("compaction key %s: %w", c.key, err)
	}
	c.rev = resp.Header.Revision
	if resp.Succeeded {
		c.version++
		return true, nil
	}
	c.version = 0
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
		c.version = kvs[0].Version
		if done, err := strconv.ParseInt(string(kvs[0].Value), 10, 64); err == nil && done > 0 {
			c.raiseCompacted(done)
		}
	}
	return false, nil
}
