package masterlease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/allocd/allocd/internal/etcd/call"
	"github.com/allocd/allocd/internal/etcd/watch"
)

const (
	// MaxTTL is the longest TTL a Renew may ask for.
	MaxTTL = time.Hour
	// DefaultTTL is kube-apiserver's DefaultEndpointReconcilerTTL, used when
	// Config.DefaultTTL is zero.
	DefaultTTL = 15 * time.Second
	// DefaultServicePort is the endpoints' port when Config.ServicePort is zero.
	DefaultServicePort = 6443

	// maxAttempts bounds the compare-and-swap retries of Renew and Remove.
	maxAttempts = 8
	// readAttempt bounds one try of a read (tried three times, through the next
	// member), writeAttempt one write (tried again only while etcd certainly did not
	// apply it): etcd answers in milliseconds, and a call that takes longer waits in a
	// stalled member or for an election.
	readAttempt  = time.Second
	writeAttempt = 2 * time.Second
	// timeToLiveParallel bounds the TimeToLive calls in flight for one list.
	timeToLiveParallel = 16
	// shutdownName is the key, under the prefix, that RemoveLease with shutdown set
	// writes in the same transaction as the delete. It is not an IP, so it is never
	// taken for a lease.
	shutdownName = "shutdown"
	// removedDir holds a marker per removed address, <prefix>removed/<ip>, written by
	// every Remove (in the transaction of the delete, when there is a key; else if the
	// key is still absent) and deleted when Renew creates the key again: a watch tells
	// a removal from etcd revoking a lease by it, and a restore (restore.go) never
	// brings back a removed lease. etcd out of space refuses it (Remove).
	removedDir = "removed/"
)

// Config configures a Manager.
type Config struct {
	// Prefix is the full key prefix of the lease keys, e.g. "/allocd/masterleases/"
	// (--etcd-prefix joined with --master-lease-prefix). A missing trailing "/" is
	// added, so that keys never read "<prefix>//<ip>" nor run into the IP.
	Prefix string
	// DefaultTTL is the TTL of a Renew that asks for none (--master-lease-ttl); zero
	// means 15 s.
	DefaultTTL time.Duration
	// ServicePort is the port of the endpoints (--kubernetes-service-port), named
	// "https", protocol TCP; zero means 6443.
	ServicePort int
	// Logger receives warnings (the empty-storage guard, failed revokes, watch
	// restarts); nil discards them.
	Logger *slog.Logger
	// Registerer receives the allocd_masterlease_* metrics; nil means no metrics.
	Registerer prometheus.Registerer
}

// Lease is the master lease of one API server.
type Lease struct {
	// IP is the API server's address, canonical.
	IP netip.Addr
	// ID is the etcd lease the key is bound to; with Revision, a fencing token.
	ID clientv3.LeaseID
	// TTL is the TTL etcd granted.
	TTL time.Duration
	// Remaining is the time left before the lease expires unless renewed.
	Remaining time.Duration
	// Revision is the etcd revision of the key's last write.
	Revision int64
}

// Manager keeps the master leases in etcd under one prefix and derives the endpoints
// of the kubernetes Service from them. Renew, Remove and List talk to etcd directly
// and are safe for concurrent use, also by several Managers (replicas) on one etcd;
// Endpoints and WatchEndpoints serve the state that Run maintains.
type Manager struct {
	cli         *clientv3.Client
	prefix      string
	shutdownKey string
	removedDir  string // prefix + removedDir
	defaultTTL  int64  // seconds
	minTTL      int64  // seconds, etcd's minimum as probed by New
	port        Port
	log         *slog.Logger
	metrics     *metrics // nil: no metrics
	running     atomic.Bool
	syncTimeout time.Duration
	donec       chan struct{} // closed when Run returns
	// progress is the revision up to which every event of the prefix is applied to
	// leases and eps; it advances with m.mu held.
	progress watch.Progress

	mu       sync.Mutex
	leases   map[netip.Addr]leaseState // as of progress, from Run's watch
	eps      Endpoints                 // published
	guarded  bool                      // storage lists no lease; eps kept by the guard
	lastDel  removal                   // last lease key deleted
	lastShut removal                   // last shutdown marker written
	watchers map[chan struct{}]struct{}
	restores map[netip.Addr]restoreJob // keys to restore (restore.go), for the restorer
	restorec chan struct{}             // signalled when restores has a job
}

// leaseState is what Run knows of one lease key.
type leaseState struct {
	id      clientv3.LeaseID
	ttl     int64 // granted, seconds
	asked   int64 // the TTL the API server asked for, seconds
	modRev  int64
	expires time.Time // local clock; when the lease runs out unless renewed
	renewed time.Time // local clock; when the last renewal was seen
	// revoked: etcd deleted the key at modRev, by revoking its lease, while the last
	// renewal seen still had time to run (restore.go). The lease stays live here, in
	// the endpoints and in List, until the key is written again or expires passes.
	revoked bool
	// restoredFrom is the revision of the last early revocation of the key before
	// it was written again (0: none), for List.
	restoredFrom int64
}

// removal is a lease key deleted, or named by a shutdown marker, at a revision.
type removal struct {
	ip  netip.Addr
	rev int64
}

// value is the JSON stored in a lease key, for operators and for Renew to tell
// whether the TTL changed.
type value struct {
	TTLSeconds        int64     `json:"ttlSeconds"`
	GrantedTTLSeconds int64     `json:"grantedTtlSeconds"`
	RenewTime         time.Time `json:"renewTime"`
}

// New returns a Manager of the leases under cfg.Prefix. It checks the configuration
// and probes etcd's minimum lease TTL (it grants a 1 s lease and revokes it), so that
// Renew can refuse a TTL etcd would silently raise; it blocks until etcd answers or ctx
// ends. Call Run to maintain the endpoints.
func New(ctx context.Context, cli *clientv3.Client, cfg Config) (*Manager, error) {
	if cli == nil {
		return nil, errors.New("masterlease: nil etcd client")
	}
	if cfg.Prefix == "" {
		return nil, errors.New("masterlease: empty key prefix")
	}
	prefix := cfg.Prefix
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	if cfg.DefaultTTL == 0 {
		cfg.DefaultTTL = DefaultTTL
	}
	if cfg.ServicePort == 0 {
		cfg.ServicePort = DefaultServicePort
	}
	if cfg.ServicePort < 1 || cfg.ServicePort > 65535 {
		return nil, fmt.Errorf("masterlease: service port %d out of 1-65535", cfg.ServicePort)
	}
	if cfg.DefaultTTL < 0 || cfg.DefaultTTL > MaxTTL {
		return nil, fmt.Errorf("masterlease: default TTL %v out of etcd's minimum to %v", cfg.DefaultTTL,
			MaxTTL)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g, err := cli.Grant(ctx, 1)
	if err != nil {
		return nil, fmt.Errorf("masterlease: probe etcd's minimum lease TTL: %w", err)
	}
	if _, err := cli.Revoke(ctx, g.ID); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		log.Warn("revoke of the TTL probe lease failed; it expires by itself",
			"lease", int64(g.ID), "err", err)
	}
	m := &Manager{
		cli:         cli,
		prefix:      prefix,
		shutdownKey: prefix + shutdownName,
		removedDir:  prefix + removedDir,
		defaultTTL:  ceilSeconds(cfg.DefaultTTL),
		minTTL:      max(g.TTL, 1),
		port:        Port{Name: "https", Port: cfg.ServicePort, Protocol: "TCP"},
		log:         log.With("component", "masterlease"),
		syncTimeout: defaultSyncTimeout,
		donec:       make(chan struct{}),
		leases:      map[netip.Addr]leaseState{},
		watchers:    map[chan struct{}]struct{}{},
		restores:    map[netip.Addr]restoreJob{},
		restorec:    make(chan struct{}, 1),
	}
	m.eps = Endpoints{Ports: []Port{m.port}}
	// Reads wait for Run from the start (it may not have been called yet); stop ends
	// that.
	m.progress.SetRunning(true)
	if m.defaultTTL < m.minTTL {
		return nil, fmt.Errorf("masterlease: default TTL %v below etcd's minimum lease TTL, %v",
			cfg.DefaultTTL, m.MinTTL())
	}
	if cfg.Registerer != nil {
		mt, err := newMetrics(cfg.Registerer, m)
		if err != nil {
			return nil, err
		}
		m.metrics = mt
	}
	return m, nil
}

// MinTTL is the shortest TTL Renew accepts: etcd's minimum lease TTL, as probed by New
// (ceil(1.5 x election timeout), 2 s with etcd's defaults).
func (m *Manager) MinTTL() time.Duration { return time.Duration(m.minTTL) * time.Second }

// parseAddr parses the address of an API server: an IPv4 or IPv6 address, not
// unspecified, not multicast, without zone, not IPv4-mapped IPv6 (write it as IPv4).
// The returned address's String is the canonical form used in the lease key.
func parseAddr(s string) (netip.Addr, error) {
	inv := invalidRequest()
	a := parseIP(s, inv)
	return a, inv.OrNil()
}

func parseIP(s string, inv *InvalidError) netip.Addr {
	a, err := netip.ParseAddr(s)
	switch {
	case s == "":
		inv.Add("ip", "required")
	case err != nil:
		inv.Add("ip", fmt.Sprintf("%q is not an IPv4 or IPv6 address", s))
	case a.Zone() != "":
		inv.Add("ip", fmt.Sprintf("%q has a zone; endpoints take no zone", s))
	case a.Is4In6():
		inv.Add("ip", fmt.Sprintf("%q is IPv4-mapped IPv6; use %s", s, a.Unmap()))
	case a.IsUnspecified():
		inv.Add("ip", fmt.Sprintf("%q is unspecified", s))
	case a.IsMulticast():
		inv.Add("ip", fmt.Sprintf("%q is multicast", s))
	default:
		return a
	}
	return netip.Addr{}
}

// Renew creates or refreshes the lease of ip with a TTL of ttlSeconds (0: the default
// TTL), from etcd's minimum (MinTTL) to one hour. It reuses the key's etcd lease with a
// keep-alive while the TTL stays the same; for a new key or a new TTL it grants a lease,
// moves the key to it in a transaction, and only then revokes the replaced one, so the
// key never goes away while it is renewed and leases do not pile up. Every Renew
// writes the key, so its revision (in the result, with the lease id: a fencing token)
// changes and every replica sees the renewal. A bad ip or TTL returns *InvalidError
// and writes nothing.
func (m *Manager) Renew(ctx context.Context, ip string, ttlSeconds int64) (Lease, error) {
	inv := invalidRequest()
	addr := parseIP(ip, inv)
	ttl := ttlSeconds
	if ttl == 0 {
		ttl = m.defaultTTL
	}
	if ttl < m.minTTL || ttl > int64(MaxTTL/time.Second) {
		inv.Add("ttl_seconds", fmt.Sprintf("%d is out of %d-%d (0 for the default, %d)",
			ttlSeconds, m.minTTL, int64(MaxTTL/time.Second), m.defaultTTL))
	}
	if err := inv.OrNil(); err != nil {
		m.metrics.renewed("invalid")
		return Lease{}, err
	}
	l, result, err := m.renew(ctx, addr, ttl)
	if err != nil {
		m.metrics.renewed("error")
		return Lease{}, err
	}
	m.metrics.renewed(result)
	return l, nil
}

func (m *Manager) renew(ctx context.Context, addr netip.Addr, ttl int64) (_ Lease, _ string, err error) {
	key := m.key(addr)
	// A keep-alive extends the lease's TTL: once one was sent, a failure of the call
	// does not mean that nothing changed.
	refreshed := false
	defer func() {
		if refreshed {
			err = call.MayHaveApplied(err)
		}
	}()
	for range maxAttempts {
		var get *clientv3.GetResponse
		err := call.Read(ctx, readAttempt, 3, func(ctx context.Context) (err error) {
			get, err = m.cli.Get(ctx, key)
			return err
		})
		if err != nil {
			return Lease{}, "", fmt.Errorf("masterlease: read %s: %w", key, err)
		}
		var cur *mvccpb.KeyValue
		if len(get.Kvs) == 1 {
			cur = get.Kvs[0]
		}
		if cur != nil && cur.Lease != 0 && keeps(decode(cur.Value), ttl) {
			// Same TTL: keep the lease the key already has.
			id := clientv3.LeaseID(cur.Lease)
			var ka *clientv3.LeaseKeepAliveResponse
			refreshed = true
			sent := time.Now() // no later than etcd's new expiry base (encode)
			err := call.Read(ctx, readAttempt, 3, func(ctx context.Context) (err error) {
				ka, err = m.cli.KeepAliveOnce(ctx, id) // a refresh: as safe to repeat as a read
				return err
			})
			switch {
			case err == nil:
				var resp *clientv3.TxnResponse
				err := call.Write(ctx, writeAttempt, writeAttempt, func(ctx context.Context) (err error) {
					resp, err = m.cli.Txn(ctx).
						If(clientv3.Compare(clientv3.ModRevision(key), "=", cur.ModRevision)).
						Then(clientv3.OpPut(key, encode(ttl, ka.TTL, sent), clientv3.WithLease(id))).
						Commit()
					return err
				})
				if err != nil {
					return Lease{}, "", fmt.Errorf("masterlease: write %s: %w", key, err)
				}
				if !resp.Succeeded {
					continue // another replica wrote the key meanwhile: read again
				}
				return m.lease(addr, id, ka.TTL, resp.Header.Revision), "renewed", nil
			case errors.Is(err, rpctypes.ErrLeaseNotFound):
				// Expired just now; its key is gone. Grant a new one below: the compare
				// on the old revision fails if the key went, and the loop reads again.
			default:
				return Lease{}, "", fmt.Errorf("masterlease: keep alive lease %x of %s: %w", int64(id), key,
					err)
			}
		}
		l, ok, err := m.replace(ctx, addr, cur, ttl)
		if err != nil || ok {
			result := "created"
			if cur != nil {
				result = "replaced"
			}
			return l, result, err
		}
	}
	return Lease{}, "", fmt.Errorf("masterlease: renew %s: %w", addr, ErrConflict)
}

// replace grants a lease with ttl and moves the key to it if the key is still as read
// (cur, nil when absent). The replaced lease is revoked after the move; a lease granted
// for a move that loses the race is revoked at once; one whose write has an unknown
// outcome is left to expire. Either revoke may fail (etcd unreachable): the lease then
// has no key and expires by itself within its TTL.
func (m *Manager) replace(ctx context.Context, addr netip.Addr, cur *mvccpb.KeyValue,
	ttl int64) (Lease, bool, error) {
	key := m.key(addr)
	var g *clientv3.LeaseGrantResponse
	sent := time.Now()
	err := call.Write(ctx, writeAttempt, writeAttempt, func(ctx context.Context) (err error) {
		g, err = m.cli.Grant(ctx, ttl)
		return err
	})
	if err != nil {
		return Lease{}, false, fmt.Errorf("masterlease: grant lease for %s: %w", key, err)
	}
	cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	ops := []clientv3.Op{clientv3.OpPut(key, encode(ttl, g.TTL, sent), clientv3.WithLease(g.ID))}
	if cur != nil {
		cmp = clientv3.Compare(clientv3.ModRevision(key), "=", cur.ModRevision)
	} else {
		ops = append(ops, clientv3.OpDelete(m.removedKey(addr))) // live again
	}
	var resp *clientv3.TxnResponse
	err = call.Write(ctx, writeAttempt, writeAttempt, func(ctx context.Context) (err error) {
		resp, err = m.cli.Txn(ctx).If(cmp).Then(ops...).Commit()
		return err
	})
	if err != nil {
		// The outcome is unknown: the write may have committed and bound the key to
		// g, so g is not revoked (that would delete the live key). If the write was
		// lost, g has no key and expires by itself within its TTL.
		return Lease{}, false, fmt.Errorf("masterlease: write %s: %w", key, err)
	}
	if !resp.Succeeded {
		m.revoke(ctx, g.ID, "unused")
		return Lease{}, false, nil
	}
	if cur != nil && cur.Lease != 0 {
		m.revoke(ctx, clientv3.LeaseID(cur.Lease), "replaced")
	}
	return m.lease(addr, g.ID, g.TTL, resp.Header.Revision), true, nil
}

// revoke revokes a lease that no key uses any more, logging a failure: such a lease
// expires by itself.
func (m *Manager) revoke(ctx context.Context, id clientv3.LeaseID, why string) {
	ctx = context.WithoutCancel(ctx)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := m.cli.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		m.log.Warn("revoke of a master lease failed; it expires by itself",
			"lease", int64(id), "why", why, "err", err)
	}
}

func (m *Manager) lease(addr netip.Addr, id clientv3.LeaseID, ttl, rev int64) Lease {
	d := time.Duration(ttl) * time.Second
	return Lease{IP: addr, ID: id, TTL: d, Remaining: d, Revision: rev}
}

// Remove deletes the lease key of ip and revokes its etcd lease. It reports whether a
// lease was there (removing an absent lease is not an error) and the revision of the
// delete, or of the marker written when there was no key (it stops a restore of a
// lease etcd revoked early, restore.go). Set shutdown when the API server at ip
// removes its own lease because it shuts down cleanly: if it was the last lease, the
// endpoints become empty instead of keeping the last address (kubernetes #115804).
// A bad ip returns *InvalidError and writes nothing.
//
// When etcd is out of space (NOSPACE) it refuses any write with a Put but not a
// delete: Remove then deletes the key alone, without the marker and without the
// shutdown key (the last address stays, as after an expiry), and an absent key gets
// no marker. Every replica drops such a lease at once (restore.go).
func (m *Manager) Remove(ctx context.Context, ip string,
	shutdown bool) (removed bool, revision int64, err error) {
	inv := invalidRequest()
	addr := parseIP(ip, inv)
	if err := inv.OrNil(); err != nil {
		m.metrics.removed("invalid")
		return false, 0, err
	}
	removed, revision, err = m.remove(ctx, addr, shutdown)
	switch {
	case err != nil:
		m.metrics.removed("error")
	case removed:
		m.metrics.removed("removed")
	default:
		m.metrics.removed("absent")
	}
	return removed, revision, err
}

func (m *Manager) remove(ctx context.Context, addr netip.Addr, shutdown bool) (bool, int64, error) {
	key := m.key(addr)
	for range maxAttempts {
		get, err := m.cli.Get(ctx, key)
		if err != nil {
			return false, 0, fmt.Errorf("masterlease: read %s: %w", key, err)
		}
		if len(get.Kvs) == 0 {
			rev, done, err := m.markAbsent(ctx, addr, get.Header.Revision, shutdown)
			if err != nil || done {
				return false, rev, err
			}
			continue // written again meanwhile (a restore): read it and delete it
		}
		cur := get.Kvs[0]
		ops := []clientv3.Op{clientv3.OpDelete(key), clientv3.OpPut(m.removedKey(addr), "")}
		if shutdown {
			ops = append(ops, clientv3.OpPut(m.shutdownKey, addr.String()))
		}
		cmp := clientv3.Compare(clientv3.ModRevision(key), "=", cur.ModRevision)
		resp, err := m.cli.Txn(ctx).If(cmp).Then(ops...).Commit()
		if errors.Is(err, rpctypes.ErrNoSpace) {
			// Out of space (NOSPACE): etcd refuses any transaction with a Put, but
			// not a delete. Delete only: no marker, no shutdown key (restore.go).
			m.log.WarnContext(ctx, "etcd out of space: removing a master lease without its marker",
				"ip", addr, "shutdown", shutdown)
			resp, err = m.cli.Txn(ctx).If(cmp).Then(clientv3.OpDelete(key)).Commit()
		}
		if err != nil {
			return false, 0, fmt.Errorf("masterlease: delete %s: %w", key, err)
		}
		if !resp.Succeeded {
			continue // renewed meanwhile: read the new lease id and delete again
		}
		if cur.Lease != 0 {
			m.revoke(ctx, clientv3.LeaseID(cur.Lease), "removed")
		}
		m.log.InfoContext(ctx, "master lease removed", "ip", addr, "lease", cur.Lease, "shutdown", shutdown,
			"revision", resp.Header.Revision)
		return true, resp.Header.Revision, nil
	}
	return false, 0, fmt.Errorf("masterlease: remove %s: %w", addr, ErrConflict)
}

// markAbsent writes the Remove marker of addr, whose key a read at rev found absent
// (etcd may have revoked its lease while it was renewed, and a replica may be about to
// restore it: the marker stops that restore), and with shutdown the shutdown key (the
// last API server, revoked early, leaves the endpoints as if its key were there), if
// the key is still absent. It returns the revision of the marker and true; false when
// the key was written meanwhile (a restore that committed between the read and the
// marker), for the caller to delete it. Out of space (NOSPACE), etcd refuses the
// marker: it returns rev and true, and writes nothing; no restore can grant a lease
// then either.
func (m *Manager) markAbsent(ctx context.Context, addr netip.Addr, rev int64,
	shutdown bool) (int64, bool, error) {
	key := m.key(addr)
	ops := []clientv3.Op{clientv3.OpPut(m.removedKey(addr), "")}
	if shutdown {
		ops = append(ops, clientv3.OpPut(m.shutdownKey, addr.String()))
	}
	resp, err := m.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(ops...).Commit()
	switch {
	case errors.Is(err, rpctypes.ErrNoSpace):
		m.log.WarnContext(ctx, "etcd out of space: master lease absent, its removal not marked", "ip", addr)
		return rev, true, nil
	case err != nil:
		return 0, false, fmt.Errorf("masterlease: mark %s removed: %w", key, err)
	case !resp.Succeeded:
		return 0, false, nil
	}
	return resp.Header.Revision, true, nil
}

// List returns every live lease, sorted by address, with the revision it was read at.
// The read is linearizable. The remaining TTL comes from what Run saw of the key (its
// last write and the TTL granted then), and from etcd's TimeToLive only for keys Run
// has not caught up with, so that a list of many leases costs one range read. A lease
// whose key etcd revoked early (restore.go) is listed while Run keeps it, with the ID
// and revision of its last key.
func (m *Manager) List(ctx context.Context) ([]Lease, int64, error) {
	resp, err := m.cli.Get(ctx, m.prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("masterlease: list %s: %w", m.prefix, err)
	}
	now := time.Now()
	var out []Lease
	var ask []int // indexes of out whose remaining TTL etcd must tell
	listed := map[netip.Addr]bool{}
	removedAt := map[netip.Addr]int64{} // the Remove markers the read found
	m.mu.Lock()
	for _, kv := range resp.Kvs {
		if a, ok := m.parseRemovedKey(string(kv.Key)); ok {
			removedAt[a] = kv.ModRevision
			continue
		}
		addr, ok := m.parseKey(string(kv.Key))
		if !ok {
			continue
		}
		listed[addr] = true
		l := Lease{IP: addr, ID: clientv3.LeaseID(kv.Lease), Revision: kv.ModRevision}
		l.TTL = time.Duration(decode(kv.Value).GrantedTTLSeconds) * time.Second
		if st, ok := m.leases[addr]; ok && st.modRev == kv.ModRevision && st.id == l.ID {
			// Clamped to the TTL: the watch may have applied the renewal after now
			// was read.
			l.Remaining = min(max(st.expires.Sub(now), 0), l.TTL)
		} else if kv.Lease != 0 {
			ask = append(ask, len(out))
		}
		out = append(out, l)
	}
	m.mu.Unlock()
	out = append(out, m.revokedMissing(ctx, listed, removedAt, resp.Header.Revision)...)
	ttls, err := m.timeToLive(ctx, out, ask)
	if err != nil {
		return nil, 0, err
	}
	for _, i := range ask {
		out[i].Remaining = ttls[i].remaining
		if ttls[i].granted > 0 {
			out[i].TTL = ttls[i].granted
		}
	}
	slices.SortFunc(out, func(a, b Lease) int { return a.IP.Compare(b.IP) })
	return out, resp.Header.Revision, nil
}

// revokedMissing returns the leases that a read at rev did not list (listed) and
// that Run keeps as revoked early, unless the read found the marker of a Remove
// written since the delete (removedAt, by address): Run may not have applied it yet,
// and the Remove was acknowledged before the read. When Run knows a lease that is live
// and unlisted, and has not caught up with rev, it waits for Run (at most readAttempt)
// to tell whether etcd revoked that key early or it was removed.
func (m *Manager) revokedMissing(ctx context.Context, listed map[netip.Addr]bool,
	removedAt map[netip.Addr]int64, rev int64) []Lease {
	kept := func(wait bool) (out []Lease, unsure bool) {
		now := time.Now()
		m.mu.Lock()
		defer m.mu.Unlock()
		for a, st := range m.leases {
			deleted := st.restoredFrom // the early revocation's revision
			if st.revoked {
				deleted = st.modRev
			}
			switch {
			case listed[a]:
			case deleted != 0 && removedAt[a] > deleted:
				// Removed since etcd revoked it.
			case st.revoked || st.restoredFrom != 0 && st.restoredFrom <= rev && rev < st.modRev:
				// Revoked early, and not written again as of rev.
				ttl := time.Duration(st.ttl) * time.Second
				out = append(out, Lease{IP: a, ID: st.id, TTL: ttl,
					Remaining: min(max(st.expires.Sub(now), 0), ttl), Revision: st.modRev})
			case wait && st.modRev <= rev && st.expires.Sub(now) > restoreMargin:
				unsure = true
			}
		}
		return out, unsure && m.progress.Rev() < rev
	}
	out, unsure := kept(true)
	if !unsure {
		return out
	}
	if err := m.progress.Wait(ctx, rev, readAttempt); err != nil {
		return out
	}
	out, _ = kept(false)
	return out
}

type ttlInfo struct{ remaining, granted time.Duration }

// timeToLive asks etcd for the remaining TTL of the leases at the indexes ask of ls,
// a bounded number at a time.
func (m *Manager) timeToLive(ctx context.Context, ls []Lease, ask []int) (map[int]ttlInfo, error) {
	out := make(map[int]ttlInfo, len(ask))
	if len(ask) == 0 {
		return out, nil
	}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(timeToLiveParallel)
	for _, i := range ask {
		g.Go(func() error {
			r, err := m.cli.TimeToLive(gctx, ls[i].ID)
			if err != nil {
				return fmt.Errorf("masterlease: time to live of lease %x: %w", int64(ls[i].ID), err)
			}
			mu.Lock()
			out[i] = ttlInfo{remaining: time.Duration(max(r.TTL, 0)) * time.Second,
				granted: time.Duration(max(r.GrantedTTL, 0)) * time.Second}
			mu.Unlock()
			return nil
		})
	}
	return out, g.Wait()
}

func (m *Manager) key(addr netip.Addr) string { return m.prefix + addr.String() }

// removedKey is the marker of a Remove of addr (removedDir).
func (m *Manager) removedKey(addr netip.Addr) string { return m.removedDir + addr.String() }

// parseRemovedKey returns the address of a Remove's marker key.
func (m *Manager) parseRemovedKey(key string) (netip.Addr, bool) {
	s, ok := strings.CutPrefix(key, m.removedDir)
	if !ok {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.String() != s {
		return netip.Addr{}, false
	}
	return a, true
}

// parseKey returns the address of a lease key; false for a key under the prefix that
// is not a lease (the shutdown marker, or something written by hand).
func (m *Manager) parseKey(key string) (netip.Addr, bool) {
	s, ok := strings.CutPrefix(key, m.prefix)
	if !ok {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.String() != s {
		return netip.Addr{}, false
	}
	return a, true
}

// keeps reports whether a Renew with ttl keeps the lease of a key whose value is v:
// the TTL asked for is the same, and the lease was granted it (a restore binds the key
// to a lease of what was left of the TTL, which the next Renew replaces).
func keeps(v value, ttl int64) bool { return v.TTLSeconds == ttl && v.GrantedTTLSeconds >= ttl }

// encode is a lease key's value. renewed is when the grant or keep-alive of its lease
// was sent: etcd counts the TTL from when it took that request, later, so renewed plus
// the TTL is never after etcd's expiry, however long the key's write took after it
// (retries of a write during an election: up to writeAttempt), and a delete before it
// is an early revocation (restore.go).
func encode(ttl, granted int64, renewed time.Time) string {
	b, _ := json.Marshal(value{TTLSeconds: ttl, GrantedTTLSeconds: granted, RenewTime: renewed.UTC()})
	return string(b)
}

// decode reads a lease key's value; a value it cannot read gives zeros, which makes
// the next Renew move the key to a fresh lease.
func decode(b []byte) value {
	var v value
	if json.Unmarshal(b, &v) != nil {
		return value{}
	}
	return v
}

func ceilSeconds(d time.Duration) int64 {
	return int64(math.Ceil(d.Seconds()))
}
