package masterlease

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/allocd/allocd/internal/etcd/watch"
)

const (
	// defaultSyncTimeout bounds how long Endpoints and WatchEndpoints wait for Run's
	// watch to reach the revision etcd is at before they answer ErrNotReady.
	defaultSyncTimeout = 5 * time.Second
	// maxBackoff caps the pause between two attempts of Run to list and watch.
	maxBackoff = 5 * time.Second
)

// Port is one port of the kubernetes Service's endpoints.
type Port struct {
	Name     string
	Port     int
	Protocol string
}

// Endpoints are the endpoints of the kubernetes Service: the sorted addresses of the
// live API servers, each serving Ports. Addresses is empty before any lease was seen
// and after the last API server removed its own lease on shutdown.
type Endpoints struct {
	Addresses []netip.Addr
	Ports     []Port
	// Revision is the etcd revision of the lease state these endpoints were derived
	// from when they last changed.
	Revision int64
}

// Equal reports whether e and o list the same addresses and ports; the revision is
// not compared.
func (e Endpoints) Equal(o Endpoints) bool {
	return slices.Equal(e.Addresses, o.Addresses) && slices.Equal(e.Ports, o.Ports)
}

func (e Endpoints) clone() Endpoints {
	e.Addresses = slices.Clone(e.Addresses)
	e.Ports = slices.Clone(e.Ports)
	return e
}

// Run lists the leases, then watches the prefix and keeps the leases, the endpoints
// and the metrics current until ctx ends; it then returns nil. When the watch fails
// (etcd unreachable, leader lost, history compacted) Run lists again after a pause,
// so it returns an error only when called twice. Endpoints follow the leases, with the
// guard of kube-apiserver's lease reconciler: when storage lists no lease at all, the
// last non-empty endpoints are kept and a warning is logged, unless the last lease was
// removed by an API server shutting down (Remove with shutdown set). A lease key that
// etcd deletes while its lease is renewed in time is kept, and written again
// (restore.go).
func (m *Manager) Run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return errors.New("masterlease: Run called twice")
	}
	defer m.stop()
	var g errgroup.Group
	rctx, stopRestores := context.WithCancel(ctx)
	g.Go(func() error {
		m.restoreLoop(rctx)
		return nil
	})
	watch.Loop(ctx, m.log, "master lease watch", maxBackoff, m.listAndWatch)
	stopRestores()
	return g.Wait()
}

// stop marks the Manager stopped and ends every WatchEndpoints.
func (m *Manager) stop() {
	m.progress.SetRunning(false)
	close(m.donec)
}

func (m *Manager) listAndWatch(ctx context.Context) error {
	// WithRequireLeader: a member cut off from its leader ends the watch instead of
	// leaving it silent, and Run lists again from a member that has one.
	// Its own watch stream: sync waits for progress notifications (see package watch).
	wctx, cancel := context.WithCancel(
		clientv3.WithRequireLeader(watch.OwnStream(ctx, "masterlease "+m.prefix)))
	defer cancel()
	rev, err := m.load(wctx)
	if err != nil {
		return err
	}
	// The previous value of a deleted key tells when its lease would have run out
	// (restore.go).
	wch := m.cli.Watch(wctx, m.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1),
		clientv3.WithPrevKV())
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.progress.Asked():
			if err := m.cli.RequestProgress(wctx); err != nil {
				m.log.Debug("watch progress request failed", "err", err)
			}
		case resp, ok := <-wch:
			if !ok {
				return errors.New("watch channel closed")
			}
			if err := resp.Err(); err != nil {
				return fmt.Errorf("watch %s: %w", m.prefix, err)
			}
			if resp.Canceled {
				return errors.New("watch canceled")
			}
			if resp.IsProgressNotify() {
				m.mu.Lock()
				m.progress.Advance(resp.Header.Revision)
				m.mu.Unlock()
				continue
			}
			m.apply(resp.Events)
		}
	}
}

// load reads every lease key, takes their remaining TTLs from etcd, replaces the known
// state with them and reconciles the endpoints. It returns the revision read at.
func (m *Manager) load(ctx context.Context) (int64, error) {
	resp, err := m.cli.Get(ctx, m.prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("list %s: %w", m.prefix, err)
	}
	l := m.parseListing(resp.Kvs)
	now := time.Now()
	if err := m.expiries(ctx, l.items, now); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.leases
	m.leases = make(map[netip.Addr]leaseState, len(l.items))
	for _, it := range l.items {
		m.leases[it.addr] = it.st
	}
	m.keepRevokedLocked(old, l.removedAt, now)
	// A re-list after a broken watch may have missed the last API server's shutdown
	// removal: if no lease is left and the newest shutdown marker came after what this
	// replica had seen, it is that removal (the #115804 exception), not a storage gap.
	if len(l.items) == 0 && l.shutdown.rev > m.progress.Rev() &&
		slices.Contains(m.eps.Addresses, l.shutdown.ip) {
		m.lastShut, m.lastDel = l.shutdown, l.shutdown
	}
	m.reconcileLocked(resp.Header.Revision)
	m.progress.Advance(resp.Header.Revision)
	return resp.Header.Revision, nil
}

// listing is what load reads under the prefix.
type listing struct {
	items     []listedLease
	shutdown  removal              // the last shutdown removal recorded in etcd, if any
	removedAt map[netip.Addr]int64 // revisions of the Remove markers
}

// listedLease is one lease key as listed, and the renewal time its value records.
type listedLease struct {
	addr      netip.Addr
	st        leaseState
	renewTime time.Time
}

func (m *Manager) parseListing(kvs []*mvccpb.KeyValue) listing {
	l := listing{removedAt: map[netip.Addr]int64{}}
	for _, kv := range kvs {
		if string(kv.Key) == m.shutdownKey {
			if a, err := netip.ParseAddr(string(kv.Value)); err == nil {
				l.shutdown = removal{ip: a, rev: kv.ModRevision}
			}
			continue
		}
		if addr, ok := m.parseRemovedKey(string(kv.Key)); ok {
			l.removedAt[addr] = kv.ModRevision
			continue
		}
		if addr, ok := m.parseKey(string(kv.Key)); ok {
			v := decode(kv.Value)
			l.items = append(l.items, listedLease{addr: addr, renewTime: v.RenewTime,
				st: leaseState{id: clientv3.LeaseID(kv.Lease), ttl: v.GrantedTTLSeconds, asked: v.TTLSeconds,
					modRev: kv.ModRevision}})
		}
	}
	return l
}

// expiries sets the expiry and last renewal of every listed lease from etcd's
// TimeToLive, once per list: afterwards the watch keeps them current.
func (m *Manager) expiries(ctx context.Context, items []listedLease, now time.Time) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(timeToLiveParallel)
	for i := range items {
		st, renewTime := &items[i].st, items[i].renewTime
		if st.id == 0 {
			st.expires, st.renewed = now, now
			continue
		}
		g.Go(func() error {
			r, err := m.cli.TimeToLive(gctx, st.id)
			if err != nil {
				return fmt.Errorf("time to live of lease %x: %w", int64(st.id), err)
			}
			if r.GrantedTTL > 0 {
				st.ttl = r.GrantedTTL
			}
			// etcd truncates the remaining TTL to whole seconds: expires may be up to
			// 1 s early, which errs on the safe side. The last renewal is the writer's
			// clock if that is plausible, else what the remaining TTL implies.
			st.expires = now.Add(time.Duration(max(r.TTL, 0)) * time.Second)
			st.renewed = st.expires.Add(-time.Duration(st.ttl) * time.Second)
			if !renewTime.IsZero() && renewTime.After(st.renewed) && !renewTime.After(now) {
				st.renewed = renewTime
			}
			return nil
		})
	}
	return g.Wait()
}

// keepRevokedLocked keeps, from the state before a list (old), the leases revoked
// early that the list does not have, unless a Remove marked them since (removedAt, by
// address) or they ran out; and queues their restore again. Its job may have ended
// already (superseded by another replica's restore, before the key was revoked early
// once more while the watch was down), and only a job drops a revoked lease when its
// time runs out.
func (m *Manager) keepRevokedLocked(old map[netip.Addr]leaseState, removedAt map[netip.Addr]int64,
	now time.Time) {
	for a, st := range old {
		if _, ok := m.leases[a]; !ok && st.revoked && removedAt[a] <= st.modRev && st.expires.After(now) {
			m.leases[a] = st
			m.restores[a] = restoreJob{addr: a, st: st, rev: st.modRev}
			select {
			case m.restorec <- struct{}{}:
			default: // the restorer is signalled already
			}
		}
	}
}

// apply applies one watch response's events and reconciles the endpoints after each
// revision. A response may carry the events of many revisions: etcd sends a watch that
// starts behind its current revision (writes between load's list and the watch's
// creation) everything it missed at once. Reconciling once, after the last, would skip
// the states in between, and with them the guard's last non-empty endpoints (all of
// them, when the batch goes from none to none). The events of one revision (one
// transaction: a delete and its shutdown marker) are applied together.
func (m *Manager) apply(evs []*clientv3.Event) {
	if len(evs) == 0 {
		return
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	var rv revisionEvents
	for i, ev := range evs {
		m.applyEventLocked(ev, now, &rv)
		if rev := ev.Kv.ModRevision; i == len(evs)-1 || evs[i+1].Kv.ModRevision != rev {
			m.revokedLocked(rv.gone, rv.removed, now)
			rv = revisionEvents{}
			m.reconcileLocked(rev)
		}
	}
	m.progress.Advance(evs[len(evs)-1].Kv.ModRevision)
}

// revisionEvents is what the events of one revision deleted and removed, for
// revokedLocked.
type revisionEvents struct {
	gone    []restoreJob // lease keys deleted, with their state before
	removed []netip.Addr // addresses whose Remove marker was written
}

// applyEventLocked applies one watch event to the leases and the removal records,
// and notes in rv the lease keys it deletes and the Remove markers it writes.
func (m *Manager) applyEventLocked(ev *clientv3.Event, now time.Time, rv *revisionEvents) {
	kv := ev.Kv
	if string(kv.Key) == m.shutdownKey {
		if a, err := netip.ParseAddr(string(kv.Value)); ev.Type == mvccpb.PUT && err == nil {
			m.lastShut = removal{ip: a, rev: kv.ModRevision}
			// A removal, also when an older replica wrote no marker beside it.
			rv.removed = append(rv.removed, a)
		}
		return
	}
	if addr, ok := m.parseRemovedKey(string(kv.Key)); ok {
		if ev.Type == mvccpb.PUT {
			rv.removed = append(rv.removed, addr)
			if st, ok := m.leases[addr]; ok && st.revoked {
				// Removed while revoked early: it goes now, as removed.
				delete(m.leases, addr)
				m.lastDel = removal{ip: addr, rev: kv.ModRevision}
			}
		}
		return
	}
	addr, ok := m.parseKey(string(kv.Key))
	if !ok {
		return
	}
	switch ev.Type {
	case mvccpb.PUT:
		v := decode(kv.Value)
		ttl := v.GrantedTTLSeconds
		prev, ok := m.leases[addr]
		if !ok || prev.id != clientv3.LeaseID(kv.Lease) {
			// A new lease (a new API server, or a new TTL): one line. Plain
			// renewals of the same lease are not logged: they come every TTL/3.
			m.log.Info("master lease granted", "ip", addr, "lease", kv.Lease, "ttl_seconds", ttl,
				"revision", kv.ModRevision)
		}
		restoredFrom := prev.restoredFrom
		if prev.revoked {
			restoredFrom = prev.modRev
		}
		m.leases[addr] = leaseState{
			id: clientv3.LeaseID(kv.Lease), ttl: ttl, asked: v.TTLSeconds, modRev: kv.ModRevision,
			expires: now.Add(time.Duration(ttl) * time.Second), renewed: now, restoredFrom: restoredFrom,
		}
	case mvccpb.DELETE:
		// Expired (etcd revoked the lease) or removed: either way the API server
		// leaves the endpoints, unless etcd revoked it early (revokedLocked).
		m.log.Info("master lease gone", "ip", addr, "revision", kv.ModRevision)
		if ev.PrevKv != nil {
			j := goneJob(addr, ev.PrevKv, kv.ModRevision)
			if st, ok := m.leases[addr]; ok && st.modRev == ev.PrevKv.ModRevision &&
				st.expires.Before(j.st.expires) {
				// This replica saw the last write earlier than the renewal time in it
				// says: the clock of the replica that renewed is ahead of this one's.
				j.st.expires, j.st.renewed = st.expires, st.renewed
			}
			rv.gone = append(rv.gone, j)
		}
		delete(m.leases, addr)
		m.lastDel = removal{ip: addr, rev: kv.ModRevision}
	}
}

// reconcileLocked derives the endpoints from the leases as of rev and publishes them
// if they changed.
func (m *Manager) reconcileLocked(rev int64) {
	addrs := make([]netip.Addr, 0, len(m.leases))
	for a := range m.leases {
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	if m.eps.Revision == 0 {
		m.eps.Revision = rev // the first state read: nothing seen yet, as of rev
	}
	if len(addrs) == 0 && len(m.eps.Addresses) > 0 {
		if m.lastDel.rev != 0 && m.lastDel == m.lastShut {
			m.log.Info("the last API server removed its lease on shutdown; endpoints of the kubernetes "+
				"service are now empty",
				"ip", m.lastDel.ip, "revision", rev)
		} else {
			if !m.guarded {
				m.log.Warn("no API server IP addresses were listed in storage, refusing to erase all "+
					"endpoints for the kubernetes service",
					"kept", m.eps.Addresses, "revision", rev)
			}
			m.guarded = true
			return
		}
	}
	m.guarded = false
	next := Endpoints{Addresses: addrs, Ports: []Port{m.port}, Revision: rev}
	if next.Equal(m.eps) {
		return
	}
	m.eps = next
	m.log.Info("endpoints of the kubernetes service changed", "addresses", addrs, "revision", rev)
	for w := range m.watchers {
		select {
		case w <- struct{}{}:
		default: // already signalled; the watcher reads the latest state
		}
	}
}

// sync waits until Run has applied every event up to the revision etcd is at now, so
// that what the Manager serves next is at least as new as any write acknowledged
// before the call: a linearizable read of the derived state.
func (m *Manager) sync(ctx context.Context) error {
	select {
	case <-m.donec:
		return fmt.Errorf("masterlease: manager stopped: %w", ErrNotReady)
	default:
	}
	err := m.progress.Sync(ctx, m.cli, m.shutdownKey, m.syncTimeout)
	if errors.Is(err, watch.ErrBehind) {
		return fmt.Errorf("masterlease: %w: %w", err, ErrNotReady)
	}
	if err != nil {
		return fmt.Errorf("masterlease: %w", err)
	}
	return nil
}

// Endpoints returns the current endpoints of the kubernetes Service, after waiting for
// Run to catch up with etcd (at most a few seconds; ErrNotReady after that or when Run
// is not running).
func (m *Manager) Endpoints(ctx context.Context) (Endpoints, error) {
	if err := m.sync(ctx); err != nil {
		return Endpoints{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.eps.clone(), nil
}

// WatchEndpoints calls send with the current endpoints (as Endpoints returns them),
// then once per change, until ctx ends (it returns ctx's error), send fails (it returns
// that error) or Run stops (ErrNotReady). It never sends the same state twice in a row.
// send may block: a slow caller delays only itself. While it is blocked, states that
// come and go are skipped, and the next call gets the latest one.
func (m *Manager) WatchEndpoints(ctx context.Context, send func(Endpoints) error) error {
	if err := m.sync(ctx); err != nil {
		return err
	}
	w := make(chan struct{}, 1)
	m.mu.Lock()
	m.watchers[w] = struct{}{}
	last := m.eps.clone()
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.watchers, w)
		m.mu.Unlock()
	}()
	if err := send(last); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.donec:
			return fmt.Errorf("masterlease: manager stopped: %w", ErrNotReady)
		case <-w:
		}
		m.mu.Lock()
		cur := m.eps.clone()
		m.mu.Unlock()
		if cur.Equal(last) {
			continue
		}
		if err := send(cur); err != nil {
			return err
		}
		last = cur
	}
}

// snapshot is the state the metrics read.
type snapshot struct {
	leases  map[netip.Addr]leaseState
	guarded bool
	eps     int
}

func (m *Manager) snapshot() snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := snapshot{leases: make(map[netip.Addr]leaseState, len(m.leases)), guarded: m.guarded,
		eps: len(m.eps.Addresses)}
	for a, st := range m.leases {
		s.leases[a] = st
	}
	return s
}
