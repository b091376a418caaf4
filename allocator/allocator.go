package allocator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/internal/etcd/call"
	"github.com/allocd/allocd/internal/etcd/watch"

	"github.com/allocd/allocd/internal/badrequest"
)

// Allocator allocates ClusterIPs and NodePorts in etcd. See the package doc. It
// composes the layers: each range a bitmap of offsets (package bitmap) and a mapper
// (mapper.go); the etcd store (store.go, codec.go); the index that a watch keeps
// current (index.go); the group committer (committer.go) and the transaction of one
// batch (batch.go).
type Allocator struct {
	*store
	log *slog.Logger
	m   *metrics

	// tab is the ranges: the ServiceCIDRs' ClusterIP ranges and the node port range
	// (table.go), replaced whole when the watch sees a ServiceCIDR change.
	tab       atomic.Pointer[table]
	portRange *rng
	flagCIDRs []netip.Prefix // --service-cluster-ip-range, which seeds kubernetes
	kubeIP    netip.Addr
	kubePort  int

	// progress is the revision the index reflects; settle holds the pending bits that
	// clear once it reaches their revision (settleMu guards settle, and orders it
	// with progress); Sync waits at most syncTimeout.
	progress    watch.Progress
	settleMu    sync.Mutex
	settle      []settleEntry
	syncTimeout time.Duration

	// cpCh hands the watch's snapshots of the index to the checkpoint writer;
	// cpChanges counts the item changes applied since the last one, taken at cpLast
	// (both the watch goroutine's alone).
	cpCh      chan *indexSnapshot
	cpChanges int
	// cpCarry holds the changes of snapshots the writer left for a younger head; the
	// watch adds them back to cpChanges.
	cpCarry atomic.Int64
	cpLast  time.Time
	cpRev   int64 // of the last snapshot handed over
	// cpEvery, cpMaxAge and cpMinGap are checkpointEvery, checkpointMaxAge and
	// checkpointMinGap (smaller in tests); loadedFrom says how New loaded the index
	// ("checkpoint" or "list").
	cpEvery            int
	cpMaxAge, cpMinGap time.Duration
	loadedFrom         string

	// epoch is the epoch key's version and CreateRevision as last seen, at epochAt
	// (monotonicNow, when the version last moved): see fence.go.
	epoch   atomic.Pointer[fence]
	epochAt atomic.Int64
	// epochGone is set when the watch sees the epoch key deleted.
	epochGone atomic.Bool
	// earlierSwept is the CreateRevision of the epoch key under which this replica
	// found no index key written under an earlier one (collectTombstones).
	earlierSwept atomic.Int64
	// collectBudget is collectBudget, longer in tests.
	collectBudget time.Duration

	// hints are the owner records last written or read.
	hints ownerHints
	// hold is who holds every item, kept once a repair pass asked, or from the start
	// with keepHolders (holders.go); holdersWait is holdersDelay, shorter in tests.
	hold        holders
	keepHolders bool
	holdersWait time.Duration
	// committer groups Allocate and Assign calls into transactions while Run runs.
	committer *committer
}

// New validates cfg, records the ranges in etcd (refusing ranges that differ from the
// recorded ones with a *RangesMismatchError), loads the index (from a checkpoint and
// the events since, else by listing every allocation: checkpoint.go)
// and reserves the first address of the primary range (and KubernetesNodePort) for
// KubernetesOwner. The Allocator serves when New returns; Run keeps it current.
func New(ctx context.Context, cli *clientv3.Client, cfg Config) (*Allocator, error) {
	if err := ValidateConfig(cfg); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Allocator{
		store:         newStore(cli, log, cfg.Prefix),
		log:           log,
		kubePort:      cfg.KubernetesNodePort,
		syncTimeout:   defaultSyncTimeout,
		cpCh:          make(chan *indexSnapshot, 1),
		cpLast:        time.Now(),
		cpEvery:       checkpointEvery,
		cpMaxAge:      checkpointMaxAge,
		cpMinGap:      checkpointMinGap,
		keepHolders:   cfg.KeepHolders,
		collectBudget: collectBudget,
		holdersWait:   holdersDelay,
	}
	conc := cfg.CommitConcurrency
	if conc <= 0 {
		conc = DefaultCommitConcurrency
	}
	a.committer = newCommitter(conc, a.commit)
	a.portRange = newPortRange(cfg.NodePortRange)
	a.tab.Store(&table{byPrefix: map[netip.Prefix]*rng{}, port: a.portRange, all: []*rng{a.portRange}})
	a.flagCIDRs = cfg.ClusterIPRanges
	a.m = newMetrics(a, cfg.Registerer)
	a.m.counters(a.portRange)

	// etcd may fail a call for a passing reason while a replica starts (an election,
	// a member restarting): each step is idempotent, so the start is tried again.
	for {
		err := a.start(ctx)
		if err == nil {
			return a, nil
		}
		if !startTransient(err) || ctx.Err() != nil {
			return nil, err
		}
		a.log.Warn("allocator start failed; trying again", "err", err)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(time.Second):
		}
	}
}

// startTransient reports whether err, from New's start, is etcd's and passing (an
// election, a lost connection, a timeout); allocd's own verdicts (ranges that differ
// from the recorded ones) are not.
func startTransient(err error) bool {
	var se interface{ GRPCStatus() *status.Status }
	var ee rpctypes.EtcdError
	if !errors.As(err, &se) && !errors.As(err, &ee) && !errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	return call.Transient(err)
}

// start records the ranges, seeds the kubernetes ServiceCIDR, loads the index and
// reserves the kubernetes address and node port (New).
func (a *Allocator) start(ctx context.Context) error {
	want := storedRanges{NodePortRange: a.portRange.name}
	for _, p := range a.flagCIDRs {
		want.ClusterIPRanges = append(want.ClusterIPRanges, p.String())
	}
	stored, err := a.recordRanges(ctx, want)
	if err != nil {
		return err
	}
	if err := a.ensureEpoch(ctx); err != nil {
		return err
	}
	kube, err := a.seedKubernetes(ctx, stored)
	if err != nil {
		return err
	}
	a.kubeIP = newIPSpan(kube.CIDRs[0]).addr(0)
	if err := a.load(ctx); err != nil {
		return err
	}
	return a.reserveKubernetes(ctx)
}

// seedKubernetes creates the kubernetes ServiceCIDR unless it exists: from the
// ClusterIP ranges recorded at the first start when no ServiceCIDR exists yet (a
// store written before ServiceCIDRs existed), else from the flags; and returns it.
func (a *Allocator) seedKubernetes(ctx context.Context, stored storedRanges) (ServiceCIDR, error) {
	seed := a.flagCIDRs
	resp, err := a.cli.Get(ctx, a.cidrPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return ServiceCIDR{}, fmt.Errorf("read ServiceCIDRs: %w", err)
	}
	if resp.Count == 0 && len(stored.ClusterIPRanges) > 0 {
		seed = nil
		for _, s := range stored.ClusterIPRanges {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return ServiceCIDR{}, fmt.Errorf("ranges recorded at %s: %w", a.configKey, err)
			}
			seed = append(seed, p)
		}
	}
	return a.seedKubernetesCIDR(ctx, seed)
}

// newIPRange returns a new range of p with its own bitmap and counters.
func (a *Allocator) newIPRange(p netip.Prefix) *rng {
	r := newIPRangeFor(p)
	a.m.counters(r)
	return r
}

// reserveKubernetes assigns the first address of the primary range (and the
// kubernetes node port) to KubernetesOwner; an item another owner holds is logged.
func (a *Allocator) reserveKubernetes(ctx context.Context) error {
	reserve := []Item{IP(a.kubeIP)}
	if a.kubePort != 0 {
		reserve = append(reserve, Port(a.kubePort))
	}
	for _, it := range reserve {
		_, err := a.Assign(ctx, KubernetesOwner, it)
		var ae *AllocatedError
		switch {
		case errors.As(err, &ae):
			a.log.Error("cannot reserve for the kubernetes service: held by another owner",
				"item", it.String(), "holder", ae.Holder.String())
		case errors.Is(err, ErrTerminating), errors.Is(err, ErrNotInRange):
			a.log.Warn("cannot reserve for the kubernetes service", "item", it.String(), "err", err)
		case err != nil:
			return fmt.Errorf("reserve %s for the kubernetes service: %w", it, err)
		}
	}
	return nil
}

// Run keeps the index current with a watch (re-listing after a compaction), runs the
// group committer and removes drained ServiceCIDRs, until ctx ends. Allocate calls
// made while Run is not running commit one by one instead of in groups.
func (a *Allocator) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.watchLoop(ctx) })
	g.Go(func() error { return a.committer.run(ctx) })
	g.Go(func() error { a.drainLoop(ctx); return nil })
	g.Go(func() error { a.checkpointLoop(ctx); return nil })
	g.Go(func() error { a.epochLoop(ctx); return nil })
	if a.keepHolders {
		g.Go(func() error { a.holdersLoop(ctx); return nil })
	}
	return g.Wait()
}

// locate returns the range an allocation of it draws from and its offset there: for
// an address, the first ready range that holds it, else the first terminating one.
// Errors: ErrNoRange when no range has its IP family, a *NotInRangeError when none
// holds it (or it is a network or broadcast address).
func (a *Allocator) locate(it Item) (*rng, uint64, error) {
	switch it.Kind {
	case KindClusterIP:
		if !it.Addr.IsValid() {
			return nil, 0, badrequest.New("cluster_ip", "not an IP address")
		}
		t := a.tab.Load()
		if r, off := t.home(it.Addr); r != nil {
			return r, off, nil
		}
		var family []string
		for _, r := range t.ip {
			if r.span.is4 == it.Addr.Is4() {
				family = append(family, r.name)
			}
		}
		if len(family) == 0 {
			return nil, 0, fmt.Errorf("%s: %w", it, ErrNoRange)
		}
		return nil, 0, &NotInRangeError{Item: it, Range: strings.Join(family, ", ")}
	case KindNodePort:
		off, ok := a.portRange.offset(it)
		if !ok {
			return nil, 0, &NotInRangeError{Item: it, Range: a.portRange.name}
		}
		return a.portRange, off, nil
	}
	return nil, 0, badrequest.New("kind", "unknown item kind")
}

// rangeOf returns the name of it's range: ErrNoRange when no range has its IP
// family, a *NotInRangeError when it lies outside (or is the network or broadcast
// address of) every range.
func (a *Allocator) rangeOf(it Item) (string, error) {
	r, _, err := a.locate(it)
	if err != nil {
		return "", err
	}
	return r.name, nil
}

// rangeNames returns the ClusterIP ranges (in allocation order), then the NodePort
// range.
func (a *Allocator) rangeNames() []string {
	t := a.tab.Load()
	names := make([]string, len(t.all))
	for i, r := range t.all {
		names[i] = r.name
	}
	return names
}

// Free returns how many items of the named range the index sees free; 0 for an
// unknown name.
func (a *Allocator) Free(rangeName string) uint64 {
	for _, r := range a.tab.Load().all {
		if r.name == rangeName {
			used, _ := r.Counts()
			return r.Size() - used
		}
	}
	return 0
}

// RangeSet returns the ranges as a value.
func (a *Allocator) RangeSet() RangeSet {
	s := RangeSet{NodePort: a.portRange.ports, KubernetesIP: a.kubeIP, KubernetesNodePort: a.kubePort,
		nodePortName: a.portRange.name}
	for _, r := range a.tab.Load().ip {
		s.ClusterIP = append(s.ClusterIP, r.span.prefix)
		s.names = append(s.names, r.span.prefix.String())
	}
	return s
}

// IsReserved reports whether it is the kubernetes address or node port.
func (a *Allocator) IsReserved(it Item) bool {
	switch it.Kind {
	case KindClusterIP:
		return it.Addr == a.kubeIP
	case KindNodePort:
		return a.kubePort != 0 && it.Port == a.kubePort
	}
	return false
}

// IsStatic reports whether it lies in the static (lower) band of its range.
func (a *Allocator) IsStatic(it Item) bool {
	r, off, err := a.locate(it)
	return err == nil && r.Static(off)
}

// kubernetesIP returns the address reserved for the kubernetes service.
func (a *Allocator) kubernetesIP() netip.Addr { return a.kubeIP }
