package allocator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/internal/etcd/call"
)

// The wiring: New builds an Allocator from its parts (newAllocator), records the
// ranges and loads the index (start); Run runs the parts' loops.

// New validates cfg, records the ranges in etcd (refusing ranges that differ from the
// recorded ones with a *RangesMismatchError), loads the index (from a checkpoint and
// the events since, else by listing every allocation: checkpoint.go)
// and reserves the first address of the primary range (and KubernetesNodePort) for
// KubernetesOwner. The Allocator serves when New returns; Run keeps it current.
func New(ctx context.Context, cli *clientv3.Client, cfg Config) (*Allocator, error) {
	if err := ValidateConfig(cfg); err != nil {
		return nil, err
	}
	a := newAllocator(cli, cfg)
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

// newAllocator wires the parts of an Allocator of cfg (checked), before its start.
func newAllocator(cli *clientv3.Client, cfg Config) *Allocator {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	st := newStore(cli, log, cfg.Prefix)
	a := &Allocator{store: st, log: log, flagCIDRs: cfg.ClusterIPRanges, kubePort: cfg.KubernetesNodePort,
		keepHolders: cfg.KeepHolders, holdersWait: holdersDelay}
	a.m = newMetrics(a.Ranges, cfg.Registerer)
	a.bg = newFailures(log, a.m.backgroundCounter())
	a.hold.log, a.hold.fails = log, a.bg
	a.epochs = newEpochs(st, log, newFailures(log, a.m.epochCounter()))
	a.cp = newCheckpointer(st, log, a.bg)
	a.idx = newIndex(st, log, a.m, a.bg, cfg.NodePortRange, a.epochs, &a.hold, a.cp)
	conc := cfg.CommitConcurrency
	if conc <= 0 {
		conc = DefaultCommitConcurrency
	}
	a.committer = newCommitter(conc, a.commit)
	if a.m != nil {
		a.m.register()
	}
	return a
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
	want := storedRanges{NodePortRange: a.idx.portRange.name}
	for _, p := range a.flagCIDRs {
		want.ClusterIPRanges = append(want.ClusterIPRanges, p.String())
	}
	stored, err := a.recordRanges(ctx, want)
	if err != nil {
		return err
	}
	if err := a.epochs.ensure(ctx); err != nil {
		return err
	}
	kube, err := a.seedKubernetes(ctx, stored)
	if err != nil {
		return err
	}
	a.kubeIP = newIPSpan(kube.CIDRs[0]).addr(0)
	if err := a.idx.load(ctx); err != nil {
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
// group committer, the checkpoints, the epoch and its tombstone collection, and
// removes drained ServiceCIDRs, until ctx ends. Allocate calls made while Run is not
// running commit one by one instead of in groups.
func (a *Allocator) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.idx.run(ctx) })
	g.Go(func() error { return a.committer.run(ctx) })
	g.Go(func() error { a.drainLoop(ctx); return nil })
	g.Go(func() error { a.cp.run(ctx); return nil })
	g.Go(func() error { a.epochs.run(ctx); return nil })
	if a.keepHolders {
		g.Go(func() error { a.hold.run(ctx, a.holdersWait, a.streamHolders); return nil })
	}
	return g.Wait()
}
