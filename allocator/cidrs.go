package allocator

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The calls on ServiceCIDRs (create, delete, get, list), and the removal of the drained
// ones that every replica runs.

// drainEvery is how often a replica looks for terminating ServiceCIDRs to remove.
const drainEvery = 500 * time.Millisecond

// drainLoop removes terminating ServiceCIDRs that nothing depends on any more, until
// ctx ends. Every replica runs it: a removal is a transaction that proves its
// condition, so two replicas removing the same one at once is harmless.
func (a *Allocator) drainLoop(ctx context.Context) {
	t := time.NewTicker(drainEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.drain(ctx)
	}
}

// drain removes the terminating ServiceCIDRs that nothing depends on any more: one
// look of drainLoop.
func (a *Allocator) drain(ctx context.Context) {
	for _, c := range a.idx.tab.Load().cidrs {
		if c.State != CIDRTerminating || a.indexBlocked(c) {
			continue
		}
		if err := a.removeDrained(ctx, c.Name); err != nil && ctx.Err() == nil {
			a.bg.fail(stepDrain, "removing a drained ServiceCIDR failed; will try again", err, "name", c.Name)
		} else if err == nil {
			a.bg.ok(stepDrain)
		}
	}
}

// indexBlocked reports whether the index sees an allocated address that lies in c and
// in no ready range: then c cannot be removed yet, and etcd need not be asked.
func (a *Allocator) indexBlocked(c ServiceCIDR) bool {
	blocked := false
	a.idx.tab.Load().eachBlocker(c.CIDRs, func(netip.Addr) bool { blocked = true; return false })
	return blocked
}

// removeDrained removes the terminating ServiceCIDR name if, in etcd, no allocated
// address lies in it and in no ready ServiceCIDR. One read gives the ServiceCIDRs and
// every address key at one revision (read in pages); the delete compares that name is still the
// terminating object read and that every ready ServiceCIDR overlapping it is
// unchanged. Nothing can be allocated from name itself once it is terminating (every
// allocation compares the revision of the ready ServiceCIDR it draws from), so an
// address allocated after the read lies in one of those ready ones.
func (a *Allocator) removeDrained(ctx context.Context, name string) error {
	read, err := a.cli.Get(ctx, a.cidrPrefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("read ServiceCIDRs: %w", err)
	}
	var target *ServiceCIDR
	var ready []ServiceCIDR
	for _, c := range a.decodeCIDRs(read.Kvs) {
		switch {
		case c.Name == name:
			target = &c
		case c.State == CIDRReady:
			ready = append(ready, c)
		}
	}
	if target == nil || target.State != CIDRTerminating {
		return nil // removed by another replica, or not terminating
	}
	// The address keys at the same revision, in pages.
	blocked := false
	err = a.listItems(ctx, read.Header.Revision, func(it Item) {
		if !blocked && it.Kind == KindClusterIP && inAny(it.Addr, target.CIDRs) && !inReady(it.Addr, ready) {
			blocked = true
		}
	})
	if err != nil || blocked {
		return err // blocked: the index lagged
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(a.cidrKey(name)), "=", target.Revision)}
	for _, c := range ready {
		if overlapsAny(c.CIDRs, target.CIDRs) {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(a.cidrKey(c.Name)), "=", c.Revision))
		}
	}
	if len(cmps) > maxTxnOps {
		return fmt.Errorf("%d ready ServiceCIDRs overlap %s; at most %d can be compared in one transaction",
			len(cmps)-1, name, maxTxnOps-1)
	}
	del, err := a.cli.Txn(ctx).If(cmps...).Then(clientv3.OpDelete(a.cidrKey(name))).Commit()
	if err != nil {
		return fmt.Errorf("remove ServiceCIDR %s: %w", name, err)
	}
	if del.Succeeded {
		a.log.Info("removed drained ServiceCIDR", "name", name, "cidrs", prefixes(target.CIDRs),
			"revision", del.Header.Revision)
	}
	return nil
}

// inAny reports whether addr is a usable address of one of ps.
func inAny(addr netip.Addr, ps []netip.Prefix) bool {
	for _, p := range ps {
		if _, ok := newIPSpan(p).offset(addr); ok {
			return true
		}
	}
	return false
}

func inReady(addr netip.Addr, ready []ServiceCIDR) bool {
	for _, c := range ready {
		if inAny(addr, c.CIDRs) {
			return true
		}
	}
	return false
}

func overlapsAny(a, b []netip.Prefix) bool {
	for _, x := range a {
		for _, y := range b {
			if x.Overlaps(y) {
				return true
			}
		}
	}
	return false
}

// CreateServiceCIDR creates a ready ServiceCIDR. Errors: *InvalidError,
// *CIDRExistsError, etcd's. Every replica allocates from it once its watch has seen
// it; the Allocator that created it has when CreateServiceCIDR returns.
func (a *Allocator) CreateServiceCIDR(ctx context.Context, name string, cidrs []string) (ServiceCIDR, error) {
	ps, err := validateServiceCIDR(name, cidrs)
	if err != nil {
		return ServiceCIDR{}, err
	}
	key := a.cidrKey(name)
	c := ServiceCIDR{Name: name, CIDRs: ps, State: CIDRReady, Created: time.Now().UTC().Truncate(time.Second)}
	resp, err := a.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, encodeCIDR(c))).Commit()
	if err != nil {
		return ServiceCIDR{}, fmt.Errorf("create ServiceCIDR %s: %w", name, err)
	}
	if !resp.Succeeded {
		return ServiceCIDR{}, &CIDRExistsError{Name: name}
	}
	c.CreateRevision, c.Revision = resp.Header.Revision, resp.Header.Revision
	a.log.Info("created ServiceCIDR", "name", name, "cidrs", prefixes(ps), "revision", c.Revision)
	a.waitIndex(ctx, c.Revision)
	return c, nil
}

// DeleteServiceCIDR marks a ServiceCIDR terminating: once it returns, no replica
// allocates an address from it that no other ready ServiceCIDR holds (every
// allocation compares the state of the ServiceCIDR it draws from, in its
// transaction). It is removed once no allocated address lies in it alone. Deleting a
// terminating ServiceCIDR again is a no-op. Errors: *CIDRNotFoundError, etcd's.
func (a *Allocator) DeleteServiceCIDR(ctx context.Context, name string) (ServiceCIDR, error) {
	key := a.cidrKey(name)
	for range maxConflicts {
		c, err := a.readCIDR(ctx, name)
		if err != nil || c.State == CIDRTerminating {
			return c, err
		}
		c.State, c.Terminating = CIDRTerminating, time.Now().UTC().Truncate(time.Second)
		put, err := a.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", c.Revision)).
			Then(clientv3.OpPut(key, encodeCIDR(c))).Commit()
		if err != nil {
			return ServiceCIDR{}, fmt.Errorf("delete ServiceCIDR %s: %w", name, err)
		}
		if put.Succeeded {
			c.Revision = put.Header.Revision
			a.log.Info("ServiceCIDR terminating", "name", name, "cidrs", prefixes(c.CIDRs),
				"revision", c.Revision)
			a.waitIndex(ctx, c.Revision)
			return c, nil
		}
	}
	return ServiceCIDR{}, fmt.Errorf("delete ServiceCIDR %s: %w", name, ErrConflict)
}

// waitIndex lets the index catch up with rev, so that the caller's next call sees
// its own change. A watch that lags only delays that: the change is made, and the call
// succeeds; the lag is recorded.
func (a *Allocator) waitIndex(ctx context.Context, rev int64) {
	if err := a.idx.progress.Wait(ctx, rev, a.idx.syncTimeout); err != nil {
		if ctx.Err() == nil {
			a.bg.fail(stepIndexWait, "the allocation index has not seen a ServiceCIDR change yet", err,
				"revision", rev)
		}
		return
	}
	a.bg.ok(stepIndexWait)
}

// GetServiceCIDR returns a ServiceCIDR as etcd holds it, with its blockers when
// terminating. Errors: *CIDRNotFoundError, ErrNotSynced, ErrNotRunning, etcd's.
func (a *Allocator) GetServiceCIDR(ctx context.Context, name string) (ServiceCIDR, error) {
	if err := a.Sync(ctx); err != nil {
		return ServiceCIDR{}, err
	}
	c, err := a.readCIDR(ctx, name)
	if err != nil {
		return ServiceCIDR{}, err
	}
	if c.State == CIDRTerminating {
		if err := a.blockers(ctx, &c); err != nil {
			return ServiceCIDR{}, err
		}
	}
	return c, nil
}

// ListServiceCIDRs returns every ServiceCIDR, by name, with the blockers of the
// terminating ones.
func (a *Allocator) ListServiceCIDRs(ctx context.Context) ([]ServiceCIDR, error) {
	if err := a.Sync(ctx); err != nil {
		return nil, err
	}
	resp, err := a.cli.Get(ctx, a.cidrPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list ServiceCIDRs: %w", err)
	}
	out := a.decodeCIDRs(resp.Kvs)
	for i := range out {
		if out[i].State == CIDRTerminating {
			if err := a.blockers(ctx, &out[i]); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// blockers fills c's Blockers and Sample from the index: the allocated addresses of
// its CIDRs that no ready ServiceCIDR holds, with their holders read from etcd.
func (a *Allocator) blockers(ctx context.Context, c *ServiceCIDR) error {
	var sample []Item
	c.Blockers = 0
	a.idx.tab.Load().eachBlocker(c.CIDRs, func(addr netip.Addr) bool {
		c.Blockers++
		if len(sample) < BlockerSample {
			sample = append(sample, IP(addr))
		}
		return true
	})
	c.Sample = nil
	for _, it := range sample {
		al, err := a.Get(ctx, it)
		if errors.Is(err, ErrNotFound) {
			continue // released since the index saw it
		}
		if err != nil {
			return err
		}
		c.Sample = append(c.Sample, al)
	}
	return nil
}
