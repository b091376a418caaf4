package masterlease

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/etcd/call"
)

// A lease key can go while its lease is renewed in time. An etcd leader that was
// stopped (SIGSTOP, a stalled machine) for a while resumes with the expiries of its
// own clock: every lease whose last renewal it saw is older than the TTL has expired
// to it, although the leader elected meanwhile took the renewals that came since.
// etcd's guard (etcd#15247: a leader checks its leadership before it revokes) looks
// only when the leader's raft ticks lagged, and a resumed process ticks at once; so
// the old leader revokes such leases, its proposal reaches the new leader once it has
// stepped down, and etcd deletes the keys. make fault saw it (an allocd killed held
// back one renewal, then the etcd leader was paused 2 s); TestStaleLeaderRevokes
// reproduces it with etcd processes: leases renewed 0.25 s before the leader resumed
// went 13 to 20 ms after it, in one trial of 6 to 15.
//
// Run takes a delete that no Remove wrote (no marker, nor shutdown key naming the
// address, in its transaction) and that comes more than restoreMargin before the
// lease would have run out, by the time of its last renewal (in the key's previous
// value, which the watch brings with the delete) and its TTL, for such a revocation.
// The lease stays live in the replica's state, its endpoints and List, and the
// restorer writes the key again under a new etcd lease of the TTL that was left (at
// least etcd's minimum), unless etcd still has the key's lease (the key was deleted by
// a write: an operator's etcdctl del, or an older replica's Remove, which writes no
// marker, before it revokes the lease), the key was written meanwhile (a Renew,
// another replica's restore) or the address was removed (its marker written since the
// delete). The next Renew moves the key to a lease of its full TTL. If the key cannot
// be written before the time left runs out, the lease leaves the state then.
//
// A key deleted by hand is so not written back: the address leaves the endpoints until
// its API server's next Renew creates the key again. An older replica's Remove without
// shutdown revokes the lease a few milliseconds after its delete: a replica that asks
// for the lease after that takes the delete for an early revocation, and writes the
// key back for the time left, at most one TTL (nothing renews it).
const (
	// restoreMargin: a delete that comes later than this before the lease's expiry
	// is an expiry. The renewal's time in the key is taken before its keep-alive or
	// grant was sent, so etcd's expiry comes no earlier than that time plus the TTL
	// (and up to its expiry tick, 500 ms, later); but the clocks of the replica that
	// renewed and of this one may differ, which goneJob bounds by when this replica
	// saw the renewal.
	restoreMargin = time.Second
	// restoreRetry is the pause between two attempts of a restore.
	restoreRetry = 100 * time.Millisecond
)

// restoreJob is a lease key to write again: its address, the state Run keeps of it,
// and the revision of the delete.
type restoreJob struct {
	addr netip.Addr
	st   leaseState
	rev  int64
}

// goneJob is the restoreJob of a lease key deleted at rev, from its previous value
// prev: the state it would have had, had the lease run out at its last renewal plus
// its TTL.
func goneJob(addr netip.Addr, prev *mvccpb.KeyValue, rev int64) restoreJob {
	v := decode(prev.Value)
	granted := time.Duration(v.GrantedTTLSeconds) * time.Second
	// The wall clocks of two replicas, not this process's monotonic clock: expires is
	// carried over to the monotonic clock now.
	left := v.RenewTime.Add(granted).Sub(time.Now().Round(0))
	now := time.Now()
	return restoreJob{addr: addr, rev: rev, st: leaseState{id: clientv3.LeaseID(prev.Lease),
		ttl: v.GrantedTTLSeconds, asked: v.TTLSeconds, modRev: rev, expires: now.Add(left),
		renewed: now.Add(left - granted), revoked: true}}
}

// revokedLocked decides, for the lease keys deleted at one revision (gone) and the
// addresses whose Remove marker that revision wrote, which were revoked early: those
// stay in m.leases, marked, and go to the restorer.
func (m *Manager) revokedLocked(gone []restoreJob, removed []netip.Addr, now time.Time) {
	for _, g := range gone {
		left := g.st.expires.Sub(now)
		if g.st.id == 0 || g.st.asked <= 0 || left <= restoreMargin || slices.Contains(removed, g.addr) {
			continue
		}
		m.log.Warn("etcd deleted a master lease that was renewed in time (a stale etcd leader "+
			"revoked it); keeping it and writing it again",
			"ip", g.addr, "lease", int64(g.st.id), "revision", g.rev, "left", left.Round(time.Millisecond))
		m.leases[g.addr] = g.st
		m.restores[g.addr] = g
		select {
		case m.restorec <- struct{}{}:
		default: // the restorer is signalled already
		}
	}
}

// restoreLoop writes back the keys revokedLocked queues, one after another, until ctx
// ends.
func (m *Manager) restoreLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.restorec:
		}
		m.mu.Lock()
		jobs := make([]restoreJob, 0, len(m.restores))
		for a, j := range m.restores {
			jobs = append(jobs, j)
			delete(m.restores, a)
		}
		m.mu.Unlock()
		for _, j := range jobs {
			result := m.restore(ctx, j)
			m.metrics.restoredOne(result)
		}
	}
}

// restore writes j's key again and reports how it ended: "restored"; "superseded" (the
// key was written meanwhile, or its address removed); "expired" (not written before
// the time left ran out: the lease leaves the state); "nospace" (etcd is out of space
// and grants no lease: the lease leaves the state at once); "deleted" (the key was
// deleted by a write, not by a revocation: its etcd lease lives; the lease leaves the
// state at once); "canceled" (ctx ended).
//
// Out of space (NOSPACE), no lease key can be written: not by a restore, nor by the
// Renew of any API server, so every lease runs out within its TTL whatever a restore
// would do. A Remove then deletes the key without its marker (manager.go), which looks
// like a revocation here: the lease leaves at once rather than at its TTL, and is not
// written back if the alarm is disarmed before then.
func (m *Manager) restore(ctx context.Context, j restoreJob) string {
	if m.leaseLives(ctx, j.st.id) {
		m.dropRevoked(j)
		m.log.Info("a master lease key was deleted by hand (its etcd lease lives on); not writing it "+
			"again", "ip", j.addr, "lease", int64(j.st.id), "revision", j.rev)
		return "deleted"
	}
	for {
		left := time.Until(j.st.expires)
		if left <= 0 {
			m.dropRevoked(j)
			m.log.Warn("a master lease revoked early could not be written again before it ran out",
				"ip", j.addr, "revision", j.rev)
			return "expired"
		}
		done, err := m.restoreOnce(ctx, j, left)
		if done == "nospace" {
			m.dropRevoked(j)
			m.log.Warn("etcd out of space: a master lease revoked early cannot be written again; it "+
				"leaves now", "ip", j.addr, "revision", j.rev)
		}
		if done != "" {
			return done
		}
		m.log.Debug("restore of a master lease failed; trying again", "ip", j.addr, "err", err)
		select {
		case <-ctx.Done():
			return "canceled"
		case <-time.After(restoreRetry):
		}
	}
}

// leaseLives reports whether etcd still has lease id. A key that etcd deleted by
// revoking its lease has none; one deleted by a write (etcdctl del, or the Remove of
// a replica older than the marker, until it revokes the lease just after) leaves it
// live. When etcd does not answer within readAttempt, it reports false: the restore
// goes on, not delayed by more than that.
func (m *Manager) leaseLives(ctx context.Context, id clientv3.LeaseID) bool {
	ctx, cancel := context.WithTimeout(ctx, readAttempt)
	defer cancel()
	r, err := m.cli.TimeToLive(ctx, id)
	return err == nil && r.TTL > 0
}

// restoreOnce makes one attempt: it grants a lease of the time left (at least etcd's
// minimum) and writes the key under it, if the key is absent and no Remove marked the
// address since the delete. It returns "" and the error when the next attempt should
// follow.
func (m *Manager) restoreOnce(ctx context.Context, j restoreJob, left time.Duration) (string, error) {
	if ctx.Err() != nil {
		return "canceled", ctx.Err()
	}
	key := m.key(j.addr)
	ttl := min(max(ceilSeconds(left), m.minTTL), max(j.st.ttl, m.minTTL))
	var g *clientv3.LeaseGrantResponse
	sent := time.Now()
	err := call.Write(ctx, writeAttempt, writeAttempt, func(ctx context.Context) (err error) {
		g, err = m.cli.Grant(ctx, ttl)
		return err
	})
	if errors.Is(err, rpctypes.ErrNoSpace) {
		return "nospace", err
	}
	if err != nil {
		return "", err
	}
	var resp *clientv3.TxnResponse
	err = call.Write(ctx, writeAttempt, writeAttempt, func(ctx context.Context) (err error) {
		resp, err = m.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
				clientv3.Compare(clientv3.ModRevision(m.removedKey(j.addr)), "<", j.rev+1)).
			Then(clientv3.OpPut(key, encode(j.st.asked, g.TTL, sent), clientv3.WithLease(g.ID))).
			Commit()
		return err
	})
	switch {
	case call.NotApplied(err):
		m.revoke(ctx, g.ID, "unused")
		return "", err
	case err != nil:
		// Perhaps written: g is left to expire (it is the key's if it was).
		return "", err
	case !resp.Succeeded:
		// The watch brings what was written (the key, or the marker of a Remove,
		// which takes the lease out of the state).
		m.revoke(ctx, g.ID, "unused")
		return "superseded", nil
	}
	m.log.Info("master lease written again after etcd revoked it early", "ip", j.addr,
		"lease", int64(g.ID), "ttl_seconds", g.TTL, "revision", resp.Header.Revision)
	return "restored", nil
}

// dropRevoked takes j's lease out of the state if it is still the one revoked early,
// and reconciles the endpoints.
func (m *Manager) dropRevoked(j restoreJob) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if st, ok := m.leases[j.addr]; ok && st.revoked && st.modRev == j.st.modRev {
		delete(m.leases, j.addr)
		m.lastDel = removal{ip: j.addr, rev: j.rev}
		m.reconcileLocked(m.progress.Rev())
	}
}
