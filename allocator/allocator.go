package allocator

import (
	"context"
	"log/slog"
	"net/netip"
	"time"
)

// Allocator allocates ClusterIPs and NodePorts in etcd. See the package doc. It wires
// the parts it owns and serves the API over them: the etcd layer (store, with the
// values' codec), the index of the ranges that a watch keeps current (index), the epoch
// and its tombstone collector (epochs), the checkpoints of the index (checkpointer), who
// holds every item (holders), the owner records last seen (ownerHints) and the group
// committer (committer, with the transaction of one batch: batch.go). Its own methods
// are the calls of the API: Allocate and Assign (allocate.go), Release, ReleaseIf and
// Reassign (release.go), Transfer, the reads (read.go) and the ServiceCIDRs.
type Allocator struct {
	*store
	log *slog.Logger
	m   *metrics

	idx       *rangeIndex
	epochs    *epochs
	cp        *checkpointer
	hold      holders
	hints     ownerHints
	committer *committer
	// bg records the failures of the background steps other than the epoch's.
	bg *failures

	flagCIDRs []netip.Prefix // --service-cluster-ip-range, which seeds kubernetes
	kubeIP    netip.Addr
	kubePort  int
	// keepHolders keeps the holders from the start (holders.go); holdersWait is
	// holdersDelay, shorter in tests.
	keepHolders bool
	holdersWait time.Duration
}

// Sync waits until the index reflects every write etcd committed before the call: it
// reads etcd's revision (a linearizable read), then waits for Run's watch to reach
// it, for at most 5 seconds. What Free and Ranges report next is then at least as new
// as any allocation or release acknowledged before Sync was called. It returns
// ErrNotRunning when the watch is behind and Run is not running, ErrNotSynced when
// the watch stays behind for too long, and etcd's and ctx's errors.
func (a *Allocator) Sync(ctx context.Context) error { return a.idx.sync(ctx) }

// Starting marks the index's watch as running before Run's goroutine starts it, so
// that a call that comes meanwhile waits for the watch (Sync) instead of failing at once
// with ErrNotRunning: a server calls it before it serves, then runs Run.
func (a *Allocator) Starting() { a.idx.progress.SetRunning(true) }

// Free returns how many items of the named range the index sees free; 0 for an
// unknown name.
func (a *Allocator) Free(rangeName string) uint64 { return a.idx.freeItems(rangeName) }

// RangeSet returns the ranges as a value.
func (a *Allocator) RangeSet() RangeSet {
	s := RangeSet{NodePort: a.idx.portRange.ports, KubernetesIP: a.kubeIP, KubernetesNodePort: a.kubePort,
		nodePortName: a.idx.portRange.name}
	for _, r := range a.idx.tab.Load().ip {
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
	r, off, err := a.idx.locate(it)
	return err == nil && r.Static(off)
}

// kubernetesIP returns the address reserved for the kubernetes service.
func (a *Allocator) kubernetesIP() netip.Addr { return a.kubeIP }
