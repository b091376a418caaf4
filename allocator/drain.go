package allocator

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

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
	for _, c := range a.tab.Load().cidrs {
		if c.State != CIDRTerminating || a.indexBlocked(c) {
			continue
		}
		if err := a.removeDrained(ctx, c.Name); err != nil && ctx.Err() == nil {
			a.log.Warn("removing a drained ServiceCIDR failed; will try again", "name", c.Name, "err", err)
		}
	}
}

// indexBlocked reports whether the index sees an allocated address that lies in c and
// in no ready range: then c cannot be removed yet, and etcd need not be asked.
func (a *Allocator) indexBlocked(c ServiceCIDR) bool {
	blocked := false
	a.tab.Load().eachBlocker(c.CIDRs, func(netip.Addr) bool { blocked = true; return false })
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
