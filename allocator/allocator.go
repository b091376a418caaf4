package allocator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/allocd/allocd/internal/etcdwatch"

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

	ipRanges  []*rng // primary first
	portRange *rng
	ranges    []*rng // ipRanges then portRange
	kubeIP    netip.Addr
	kubePort  int

	// progress is the revision the index reflects; settle holds the pending bits that
	// clear once it reaches their revision (settleMu guards settle, and orders it
	// with progress); Sync waits at most syncTimeout.
	progress    etcdwatch.Progress
	settleMu    sync.Mutex
	settle      []settleEntry
	syncTimeout time.Duration

	// hints are the owner records last written or read.
	hints ownerHints
	// committer groups Allocate and Assign calls into transactions while Run runs.
	committer *committer
}

// New validates cfg, records the ranges in etcd (refusing ranges that differ from the
// recorded ones with a *RangesMismatchError), loads the allocations into the index
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
		store:       newStore(cli, log, cfg.Prefix),
		log:         log,
		kubePort:    cfg.KubernetesNodePort,
		syncTimeout: defaultSyncTimeout,
	}
	conc := cfg.CommitConcurrency
	if conc <= 0 {
		conc = DefaultCommitConcurrency
	}
	a.committer = newCommitter(conc, a.commit)
	for i, p := range cfg.ClusterIPRanges {
		a.ipRanges = append(a.ipRanges, newIPRange(p, i == 0))
	}
	a.portRange = newPortRange(cfg.NodePortRange)
	a.ranges = append(append(a.ranges, a.ipRanges...), a.portRange)
	a.kubeIP = a.ipRanges[0].span.addr(0)
	a.m = newMetrics(a, cfg.Registerer)

	want := storedRanges{NodePortRange: a.portRange.name}
	for _, r := range a.ipRanges {
		want.ClusterIPRanges = append(want.ClusterIPRanges, r.name)
	}
	if err := a.recordRanges(ctx, want); err != nil {
		return nil, err
	}
	if err := a.reload(ctx); err != nil {
		return nil, err
	}
	if err := a.reserveKubernetes(ctx); err != nil {
		return nil, err
	}
	return a, nil
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
		case err != nil:
			return fmt.Errorf("reserve %s for the kubernetes service: %w", it, err)
		}
	}
	return nil
}

// Run keeps the index current with a watch (re-listing after a compaction) and runs
// the group committer, until ctx ends. Allocate calls made while Run is not running
// commit one by one instead of in groups.
func (a *Allocator) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.watchLoop(ctx) })
	g.Go(func() error { return a.committer.run(ctx) })
	return g.Wait()
}

// ipRange returns the ClusterIP range of a's family, or nil.
func (a *Allocator) ipRange(is4 bool) *rng {
	for _, r := range a.ipRanges {
		if r.span.is4 == is4 {
			return r
		}
	}
	return nil
}

// locate returns the range and offset of it.
func (a *Allocator) locate(it Item) (*rng, uint64, error) {
	switch it.Kind {
	case KindClusterIP:
		if !it.Addr.IsValid() {
			return nil, 0, badrequest.New("cluster_ip", "not an IP address")
		}
		r := a.ipRange(it.Addr.Is4())
		if r == nil {
			return nil, 0, fmt.Errorf("%s: %w", it, ErrNoRange)
		}
		off, ok := r.offset(it)
		if !ok {
			return nil, 0, &NotInRangeError{Item: it, Range: r.name}
		}
		return r, off, nil
	case KindNodePort:
		off, ok := a.portRange.offset(it)
		if !ok {
			return nil, 0, &NotInRangeError{Item: it, Range: a.portRange.name}
		}
		return a.portRange, off, nil
	}
	return nil, 0, badrequest.New("kind", "unknown item kind")
}

// RangeOf returns the name of it's range: ErrNoRange when no range has its IP
// family, a *NotInRangeError when it lies outside (or is the network or broadcast
// address of) its range.
func (a *Allocator) RangeOf(it Item) (string, error) {
	r, _, err := a.locate(it)
	if err != nil {
		return "", err
	}
	return r.name, nil
}

// RangeNames returns the ClusterIP ranges (primary first), then the NodePort range.
func (a *Allocator) RangeNames() []string {
	names := make([]string, len(a.ranges))
	for i, r := range a.ranges {
		names[i] = r.name
	}
	return names
}

// Free returns how many items of the named range the index sees free; 0 for an
// unknown name.
func (a *Allocator) Free(rangeName string) uint64 {
	for _, r := range a.ranges {
		if r.name == rangeName {
			used, _ := r.Counts()
			return r.Size() - used
		}
	}
	return 0
}

// RangeSet returns the ranges as a value.
func (a *Allocator) RangeSet() RangeSet {
	s := RangeSet{NodePort: a.portRange.ports, KubernetesIP: a.kubeIP, KubernetesNodePort: a.kubePort}
	for _, r := range a.ipRanges {
		s.ClusterIP = append(s.ClusterIP, r.span.prefix)
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

// KubernetesIP returns the address reserved for the kubernetes service.
func (a *Allocator) KubernetesIP() netip.Addr { return a.kubeIP }
