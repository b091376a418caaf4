package repair

import (
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

	"github.com/allocd/allocd/allocator"
	"github.com/allocd/allocd/leader"
)

// Store is what repair needs of the allocator; *allocator.Allocator implements it.
// Every write is conditional in etcd: Assign creates only a free item, Reassign and
// ReleaseIf act only if the allocation's ModRevision is unchanged.
type Store interface {
	// RangeSet returns the ranges: which range an item is in, which are reserved.
	RangeSet() allocator.RangeSet
	// ListExcept reads the allocations a pass must judge at one etcd revision: every
	// allocation but those of the items it marks held by their claimant.
	ListExcept(ctx context.Context, claims []allocator.Claim, held []bool) (
		rev int64, all []allocator.Allocation, err error)
	// HeldAt reads who held items at etcd revision rev (their allocations then, the
	// free ones left out), or at the oldest revision etcd keeps if it compacted rev
	// away; it returns the revision read.
	HeldAt(ctx context.Context, items []allocator.Item, rev int64) (int64, []allocator.Allocation, error)
	// Assign allocates a specific item to o (no write if o holds it already).
	Assign(ctx context.Context, o allocator.Owner, it allocator.Item) (allocator.Allocation, error)
	// Reassign moves al to another owner if it did not change since it was read.
	Reassign(ctx context.Context, al allocator.Allocation, to allocator.Owner) (allocator.Allocation, error)
	// ReleaseIf deletes al if it did not change since it was read.
	ReleaseIf(ctx context.Context, al allocator.Allocation) (bool, error)
}

var _ Store = (*allocator.Allocator)(nil)

// Reason names a finding, as the events of Kubernetes' repair controllers do.
type Reason string

// The reasons of findings. The first nine are Kubernetes' event reasons (its ClusterIP
// and NodePort repair controllers', pkg/registry/core/service/ipallocator/controller
// and portallocator/controller).
const (
	// ClusterIPNotValid: a Service's ClusterIP does not parse, or no range is of its
	// family; reported.
	ClusterIPNotValid Reason = "ClusterIPNotValid"
	// ClusterIPNotAllocated: a Service uses a ClusterIP that is not allocated;
	// repaired by allocating it to the Service (the Controller's doc says when not).
	ClusterIPNotAllocated Reason = "ClusterIPNotAllocated"
	// ClusterIPAlreadyAllocated: a ClusterIP used by two Services, or the kubernetes
	// Service's reserved address used by another; reported.
	ClusterIPAlreadyAllocated Reason = "ClusterIPAlreadyAllocated"
	// ClusterIPOutOfRange: a Service's ClusterIP is outside the ranges of its family;
	// reported.
	ClusterIPOutOfRange Reason = "ClusterIPOutOfRange"
	// ServiceCIDRFull: a ServiceCIDR answered full when a repair allocated from it
	// (never over *allocator.Allocator: see the package doc); the pass stops.
	ServiceCIDRFull Reason = "ServiceCIDRFull"
	// PortNotAllocated: a Service uses a NodePort that is not allocated; repaired by
	// allocating it to the Service (the Controller's doc says when not).
	PortNotAllocated Reason = "PortNotAllocated"
	// PortAlreadyAllocated: a NodePort used by two Services, or the kubernetes
	// Service's reserved port used by another; reported.
	PortAlreadyAllocated Reason = "PortAlreadyAllocated"
	// PortOutOfRange: a Service's NodePort is outside the node-port range; reported.
	PortOutOfRange Reason = "PortOutOfRange"
	// PortRangeFull: the node-port range answered full when a repair allocated from
	// it (never over *allocator.Allocator: see the package doc); the pass stops.
	PortRangeFull Reason = "PortRangeFull"
	// ClusterIPWrongOwner: a ClusterIP allocated to another owner than the Service
	// that uses it; repaired by a conditional reassign (the Controller's doc says when
	// not).
	ClusterIPWrongOwner Reason = "ClusterIPWrongOwner"
	// PortWrongOwner: a NodePort allocated to another owner than the Service that
	// uses it; repaired by a conditional reassign (the Controller's doc says when not).
	PortWrongOwner Reason = "PortWrongOwner"
	// LeakSuspected: allocated, used by no Service of the snapshot; counting down.
	LeakSuspected Reason = "LeakSuspected"
	// LeakReleased: the countdown ended and the allocation was deleted.
	LeakReleased Reason = "LeakReleased"
	// SnapshotStale: another replica accepted a newer snapshot than the one this
	// replica judges with; the pass repairs nothing from it and judges no leak.
	SnapshotStale Reason = "SnapshotStale"
)

// DefaultInterval is the pause between passes when Config.Interval is 0.
const DefaultInterval = 3 * time.Minute

// DefaultLeakStrikes is the number of passes in a row that judge an allocation a leak
// before it is released, when Config.LeakStrikes is 0.
const DefaultLeakStrikes = 3

// Config configures a Controller.
type Config struct {
	// Prefix is the etcd prefix of allocd, e.g. "/allocd". Repair keeps the last accepted
	// snapshot revision under <Prefix>/repair/ (beside the election's key, leader/).
	Prefix string
	// Interval between passes (--repair-interval); 0 means DefaultInterval.
	Interval time.Duration
	// LeakStrikes is the number of consecutive passes an allocation must be a leak
	// candidate in before it is released (--repair-leak-strikes); 0 means
	// DefaultLeakStrikes.
	LeakStrikes int
	// LeakGrace is how old an allocation must have been when the judging snapshot was
	// received before it can be released (--repair-leak-grace). 0 means no grace.
	LeakGrace time.Duration
	// SnapshotFile is a file re-read at each pass (--service-snapshot-file); "" means
	// none. ParseSnapshotFile reads its content (the daemon's: the protojson form of
	// allocd.v1.ServiceSnapshot, which the server converts); required with a file.
	SnapshotFile      string
	ParseSnapshotFile func([]byte) (Snapshot, error)
	// Leadership tells who leads (the replica's leader.Elector): Status names the
	// leader, and a call that only the leader serves names it in its
	// *leader.NotLeaderError. Required.
	Leadership Leadership
	// Logger receives one line per finding and the leadership changes; nil discards.
	Logger *slog.Logger
	// Registerer receives the repair metrics; nil means no metrics.
	Registerer prometheus.Registerer
	// Clock times the passes (Interval) and stamps snapshot receipts (LeakGrace is
	// measured to them); nil means the real clock. Tests advance a fake one.
	Clock clockwork.Clock
}

// Leadership is what repair needs of the election: who leads.
type Leadership interface {
	Leader(ctx context.Context) (identity string, self bool, err error)
}

// Controller is the repair loop of allocd: kube-apiserver's ClusterIP and NodePort
// repair controllers, judged against a snapshot of Services pushed by the API server
// (or read from a file) instead of a list of the Service registry. Exactly one replica
// runs passes at a time: the leader elected by package leader, for which the replica's
// leader.Elector runs Lead.
//
// A pass reads every allocation at one etcd revision and rebuilds what the snapshot
// says should be allocated. For each ClusterIP (each family) and NodePort of each
// Service (the same port under two protocols, or as the health check node port,
// counts once), it handles these cases:
//
//   - an address that does not parse, or whose family has no range: ClusterIPNotValid,
//     reported;
//   - outside its range: ClusterIPOutOfRange / PortOutOfRange, reported;
//   - used by two Services of the snapshot: ClusterIPAlreadyAllocated /
//     PortAlreadyAllocated, reported for every Service but the one that holds it,
//     never reassigned;
//   - used by a Service but not allocated: ClusterIPNotAllocated / PortNotAllocated,
//     repaired by allocating it to that Service, unless it was held when the snapshot
//     was received (released since: see below);
//   - allocated to another owner than the Service that uses it: ClusterIPWrongOwner /
//     PortWrongOwner, repaired by a conditional reassign, unless the allocation was
//     committed after the snapshot was received (the snapshot cannot know of it) or
//     the item is shared by two Services;
//   - the address or port reserved for the kubernetes Service, used by another
//     Service: ClusterIPAlreadyAllocated / PortAlreadyAllocated, reported;
//   - the reserved address or port not allocated: ClusterIPNotAllocated /
//     PortNotAllocated, repaired by allocating it to allocator.KubernetesOwner; held
//     by an owner that no Service of the snapshot is: ClusterIPWrongOwner /
//     PortWrongOwner, given back to allocator.KubernetesOwner (same fence as above);
//   - a repair that fails for any other reason (the owner would hold more than
//     allocator.MaxItems items, contention outlasting the allocator's retries, an
//     etcd error): the finding is reported not repaired, with the error in its
//     message, and the pass goes on, so that one Service cannot keep every leak
//     from being released;
//   - a full range while repairing: ServiceCIDRFull / PortRangeFull, and the pass
//     stops (no leak is judged). See the package doc for when that happens.
//
// An item not allocated is repaired only if nobody held it when the snapshot was
// received. Kubernetes' runOnce (pkg/registry/core/service/ipallocator/controller/
// repair.go) reads the allocator's snapshot first and lists the Services after, so a
// Service it repairs for existed after its allocations were read. A pass gets its
// Services first (the snapshot, received at etcd revision R, and the events since) and
// reads the allocations later, at revision L: an item released between R and L, most
// often by the deletion of its Service, whose event has not reached this replica yet,
// would be allocated again to a Service that is gone, held until its leak countdown
// ends, and refused meanwhile to the Service the cluster gives it next. So a pass reads
// the items it would allocate at R too (one read, a transaction per 128 items): one
// held then is reported (ClusterIPNotAllocated / PortNotAllocated) and not repaired;
// the next snapshot, or the Service's own event, decides. The mechanism differs (a read
// of etcd's history instead of the order of two reads), the outcome is Kubernetes': no
// repair from a list of Services older than the release. When etcd has compacted R
// away, the pass reads at the oldest revision etcd keeps instead and says so in the
// finding: a release since then is seen, an older one is not (with allocd's
// compactor, usually one --etcd-compaction-interval old, long enough for the Service's
// deletion event to have arrived), and the item is repaired as a genuinely missing
// allocation. Snapshots come seldom (a shim's feed sends events after its first one),
// so refusing every repair once R is compacted would leave missing allocations missing
// for days. A release between the shim's list and R is not seen either: the deletion
// event that follows the snapshot removes the Service, and the leak countdown frees
// what was allocated again.
//
// Before repairing and again before judging leaks, a pass reads the last snapshot
// revision accepted by any replica (<Prefix>/repair/snapshot-revision, linearizable).
// If it is newer than the snapshot in hand (another replica took a push while this
// one did not lead), the pass reports SnapshotStale, makes no repair judged from its
// snapshot (the kubernetes reservation is still made), judges no leak and leaves the
// strikes as they are, until the newer snapshot is pushed here.
//
// Then every allocation that no Service uses is a leak candidate (LeakSuspected),
// except the kubernetes reservation, and except allocations committed after the
// snapshot was received, which that snapshot never judges. A candidate is released
// (LeakReleased) when all of these hold:
//
//   - it was a candidate, with the same owner and revision, in LeakStrikes
//     consecutive passes (Kubernetes' numRepairsBeforeLeakCleanup);
//   - it was at least LeakGrace old when the judging snapshot was received, so that
//     re-judging an old snapshot pass after pass never frees a young allocation;
//   - the release is etcd's conditional delete on its ModRevision: an allocation
//     re-made since the pass read it is never freed.
//
// A candidate that reappears in a Service, changes owner or revision, or disappears
// loses its strikes. Strikes live in the leader's memory, for one term of leadership:
// every term, including a second term of the same replica, starts counting from zero,
// which only delays releases. A pass runs on behalf of a term, and ends with it. A dry
// run reports what a pass would do and changes nothing, strikes included.
type Controller struct {
	cli     *clientv3.Client
	store   Store
	cfg     Config
	log     *slog.Logger
	metrics *metrics

	revisionKey string

	acceptMu sync.Mutex // serializes Accept
	passMu   sync.Mutex // serializes passes

	mu         sync.Mutex // guards the fields below
	snap       *accepted
	term       *term // the current term of leadership, nil when not leading
	candidates map[allocator.Item]*candidate
	last       *Report
}

// term is one term of repair leadership. Passes run on behalf of a term: they end when
// it ends, and their strikes and report are kept only while it is still the current
// term, so that a replica that leads again never resumes the streaks of an earlier
// term.
type term struct {
	// done is closed when the term ends (lead's context is canceled or the election
	// session is lost).
	done <-chan struct{}
}

// ended reports whether the term is over.
func (t *term) ended() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// candidate is a leak candidate between passes.
type candidate struct {
	al        allocator.Allocation
	strikes   int
	firstSeen time.Time
}

// New returns a Controller; call Run to take part in the election and run passes.
func New(cli *clientv3.Client, store Store, cfg Config) (*Controller, error) {
	if cli == nil || store == nil {
		return nil, errors.New("repair: nil etcd client or store")
	}
	if cfg.Leadership == nil {
		return nil, errors.New("repair: Leadership (the replica's leader.Elector) is required")
	}
	if cfg.SnapshotFile != "" && cfg.ParseSnapshotFile == nil {
		return nil, errors.New("repair: a SnapshotFile needs ParseSnapshotFile")
	}
	if cfg.Interval < 0 || cfg.LeakStrikes < 0 || cfg.LeakGrace < 0 {
		return nil, fmt.Errorf("repair: negative interval %v, strikes %d or grace %v",
			cfg.Interval, cfg.LeakStrikes, cfg.LeakGrace)
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.LeakStrikes == 0 {
		cfg.LeakStrikes = DefaultLeakStrikes
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("repair metrics: %w", err)
	}
	p := strings.TrimSuffix(cfg.Prefix, "/") + "/repair/"
	return &Controller{
		cli:         cli,
		store:       store,
		cfg:         cfg,
		log:         log.With("component", "repair"),
		metrics:     m,
		revisionKey: p + "snapshot-revision",
		candidates:  map[allocator.Item]*candidate{},
	}, nil
}

// Lead runs passes for one term of leadership (see package leader): a first pass at
// once if there is a snapshot or a snapshot file, then one every Interval, until ctx
// ends. It returns nil then. Repair's writes are the allocator's conditional ones: the
// fence is not needed to keep a deposed leader from harm, only its term.
func (c *Controller) Lead(ctx context.Context, _ leader.Fence) error {
	t := c.beginTerm(ctx)
	defer c.endTerm()
	c.log.InfoContext(ctx, "repair leading")
	c.passes(ctx, t)
	return nil
}

// beginTerm starts a term of leadership that ends with lctx. A new term counts
// strikes from zero: while another replica led, the allocations and the Services may
// have changed in ways this replica's old candidates know nothing of.
func (c *Controller) beginTerm(lctx context.Context) *term {
	t := &term{done: lctx.Done()}
	c.mu.Lock()
	c.term = t
	c.candidates = map[allocator.Item]*candidate{}
	c.mu.Unlock()
	c.metrics.leakCandidates(c.store.RangeSet().Names(), nil)
	c.metrics.setLeader(true)
	return t
}

// endTerm ends the current term.
func (c *Controller) endTerm() {
	c.mu.Lock()
	c.term = nil
	c.mu.Unlock()
	c.metrics.setLeader(false)
}

// passes runs a pass at once when there is something to judge against, then one
// every Interval, until ctx ends.
func (c *Controller) passes(ctx context.Context, t *term) {
	if c.cfg.SnapshotFile != "" || c.snapshot() != nil {
		c.periodicPass(ctx, t)
	}
	tick := c.cfg.Clock.NewTicker(c.cfg.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.Chan():
			c.periodicPass(ctx, t)
		}
	}
}

// periodicPass runs a pass of the loop for term t and logs its outcome.
func (c *Controller) periodicPass(ctx context.Context, t *term) {
	rep, err := c.pass(ctx, t, false)
	switch {
	case errors.Is(err, ErrNoSnapshot):
		c.log.InfoContext(ctx, "repair pass skipped: no service snapshot yet")
	case err != nil:
		c.log.ErrorContext(ctx, "repair pass failed", "error", err)
	default:
		attrs := []any{"snapshot_revision", rep.SnapshotRevision, "duration", rep.Duration,
			"findings", len(rep.Findings)}
		if rep.Err != nil {
			c.log.ErrorContext(ctx, "repair pass stopped", append(attrs, "error", rep.Err)...)
		} else {
			c.log.InfoContext(ctx, "repair pass done", attrs...)
		}
	}
}

// IsLeader reports whether a term of repair leadership runs here.
func (c *Controller) IsLeader() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.term != nil
}

// Leader returns the identity of the leader ("" when none is elected) and whether it
// is this replica.
func (c *Controller) Leader(ctx context.Context) (identity string, self bool, err error) {
	return c.cfg.Leadership.Leader(ctx)
}

// RunRepair runs a pass now, if this replica is the leader (else a *NotLeaderError
// naming the leader). dryRun reports without writing and without counting strikes.
// The pass runs on behalf of the current term of leadership: it ends when ctx ends or
// when the term does (a lost election session), whichever comes first; a pass cut
// short by the end of the term returns a *NotLeaderError naming the leader then.
// A pass stopped by a full range returns its report with Err set and a nil error;
// Services that cannot be repaired are findings of the report, not errors. Other
// errors (no snapshot, a bad snapshot file, etcd) are returned.
func (c *Controller) RunRepair(ctx context.Context, dryRun bool) (*Report, error) {
	c.mu.Lock()
	t := c.term
	c.mu.Unlock()
	if t == nil {
		return nil, c.notLeader(ctx)
	}
	pctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-t.done:
			cancel()
		case <-pctx.Done():
		}
	}()
	rep, err := c.pass(pctx, t, dryRun)
	if err != nil && ctx.Err() == nil && t.ended() {
		return nil, c.notLeader(ctx)
	}
	return rep, err
}

// notLeader returns the *NotLeaderError naming the current leader, or the error of
// reading it.
func (c *Controller) notLeader(ctx context.Context) error {
	id, _, err := c.Leader(ctx)
	if err != nil {
		return err
	}
	return &leader.NotLeaderError{Controller: "repair", Leader: id}
}

func isStale(err error) bool { return errors.Is(err, ErrStaleSnapshot) }

// Report is the outcome of one pass.
type Report struct {
	Start            time.Time
	Duration         time.Duration
	SnapshotRevision int64
	DryRun           bool
	Findings         []Finding
	Counts           map[Reason]int64
	// Err is what stopped the pass early, nil when it ran to the end.
	Err error
}

// Finding is one thing a pass found.
type Finding struct {
	Reason Reason
	// Range is the range concerned, "" when none is (ClusterIPNotValid).
	Range string
	// ClusterIP as written in the Service (for leaks: the allocated address).
	ClusterIP string
	NodePort  int
	// Service concerned; for leaks, the owner of the allocation.
	Service  allocator.Owner
	Message  string
	Repaired bool
}

// LeakCandidate is an allocation that no Service of the snapshot uses.
type LeakCandidate struct {
	Allocation allocator.Allocation
	// Strikes counted so far, and StrikesLeft before it can be released.
	Strikes, StrikesLeft int
	// FirstSeen is when the first pass of the streak ran.
	FirstSeen time.Time
	// Age of the allocation.
	Age time.Duration
}

// Status is the repair state of this replica.
type Status struct {
	// LastReport of the last pass that was not a dry run, nil before the first.
	LastReport *Report
	// Candidates, sorted by range and item.
	Candidates []LeakCandidate
	// Leader is the identity of the repair leader, "" when none; Leading is true when
	// it is this replica.
	Leader  string
	Leading bool
	// SnapshotRevision of the snapshot kept, 0 when none.
	SnapshotRevision int64
}

// Status returns the last report, the leak candidates and the leader, as this replica
// knows them (only the leader's are current).
func (c *Controller) Status(ctx context.Context) (Status, error) {
	leader, self, err := c.Leader(ctx)
	if err != nil {
		return Status{}, err
	}
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	st := Status{LastReport: c.last, Leader: leader, Leading: self}
	if c.snap != nil {
		st.SnapshotRevision = c.snap.Revision
	}
	for _, cd := range c.candidates {
		st.Candidates = append(st.Candidates, LeakCandidate{
			Allocation:  cd.al,
			Strikes:     cd.strikes,
			StrikesLeft: max(0, c.cfg.LeakStrikes-cd.strikes),
			FirstSeen:   cd.firstSeen,
			Age:         now.Sub(cd.al.AllocateTime),
		})
	}
	sortCandidates(st.Candidates)
	return st, nil
}
