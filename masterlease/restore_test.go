package masterlease

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// epsLog records every message of one WatchEndpoints with the time it came.
type epsLog struct {
	mu   sync.Mutex
	msgs []epsAt
}

type epsAt struct {
	at  time.Time
	eps Endpoints
}

func logEndpoints(t *testing.T, ctx context.Context, m *Manager) *epsLog {
	t.Helper()
	l := &epsLog{}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- m.WatchEndpoints(ctx, func(e Endpoints) error {
			l.mu.Lock()
			l.msgs = append(l.msgs, epsAt{time.Now(), e})
			l.mu.Unlock()
			return nil
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

// without returns the messages from since on that lack ip.
func (l *epsLog) without(since time.Time, ip string) []epsAt {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []epsAt
	for _, e := range l.msgs {
		if !e.at.Before(since) && !slices.Contains(e.eps.Addresses, netip.MustParseAddr(ip)) {
			out = append(out, e)
		}
	}
	return out
}

// TestRestoreRevokedEarly: etcd revokes the lease of a key renewed a moment ago, as a
// stale etcd leader's revocation does when it reaches the new leader (the process
// version of it is TestStaleLeaderRevokes). The address never leaves the endpoints nor
// List; the key is written again, under a new lease, within one renew interval; the
// next Renew keeps it. A lease that is not renewed still expires, and is not written
// again; nor is one removed.
func TestRestoreRevokedEarly(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a real 2 s lease TTL")
	}
	t.Parallel()
	const (
		ttl       = 3 // seconds
		ipA, ipB  = "10.9.0.1", "10.9.0.2"
		ipRemoved = "10.9.0.3"
	)
	e := etcdtest.New(t)
	reg := prometheus.NewRegistry()
	m := start(t, e.Client, func(c *Config) { c.Registerer = reg })
	ctx := etcdtest.Context(t)
	mustRenew(t, ctx, m, ipB, 2) // not renewed again: it expires
	mustRenew(t, ctx, m, ipRemoved, ttl)
	a := mustRenew(t, ctx, m, ipA, ttl)
	eps := logEndpoints(t, ctx, m)
	etcdtest.WaitFor(t, 5*time.Second, "three addresses in the endpoints", func() bool {
		e, err := m.Endpoints(ctx)
		return err == nil && len(e.Addresses) == 3
	})
	from := time.Now()

	revoked := time.Now()
	if _, err := e.Client.Revoke(ctx, a.ID); err != nil {
		t.Fatalf("Revoke(%x) = %v", a.ID, err)
	}
	// At once: List has it (Run keeps it, or the key is back).
	ls, _, err := m.List(ctx)
	if err != nil || !slices.ContainsFunc(ls, func(l Lease) bool { return l.IP.String() == ipA }) {
		t.Errorf("List() right after the revoke = %v, %v; want %s in it", ls, err, ipA)
	}
	var back *clientv3.GetResponse
	etcdtest.WaitFor(t, 5*time.Second, "the key written again", func() bool {
		back, err = e.Client.Get(ctx, testPrefix+ipA)
		return err == nil && len(back.Kvs) == 1
	})
	took := time.Since(revoked)
	t.Logf("key of %s written again %v after etcd revoked its lease", ipA, took.Round(time.Millisecond))
	if took > ttl*time.Second/3 {
		t.Errorf("key written again after %v; want within one renew interval, %v", took,
			ttl*time.Second/3)
	}
	kv := back.Kvs[0]
	if clientv3.LeaseID(kv.Lease) == a.ID || kv.Lease == 0 {
		t.Errorf("key's lease = %x after the restore; want a new lease, not %x", kv.Lease, a.ID)
	}
	if v := decode(kv.Value); v.TTLSeconds != ttl || v.GrantedTTLSeconds < 1 || v.GrantedTTLSeconds > ttl {
		t.Errorf("restored value = %+v; want TTL %d asked, granted 1 to %d s", v, ttl, ttl)
	}

	l := mustRenew(t, ctx, m, ipA, ttl)
	if l.ID != clientv3.LeaseID(kv.Lease) && decode(kv.Value).GrantedTTLSeconds == ttl {
		t.Errorf("Renew after the restore moved the key to lease %x; want the restored %x kept", l.ID,
			kv.Lease)
	}

	// A removed lease is not written again, nor is one that expires. ipA's API server
	// keeps renewing meanwhile (the restored lease has only the time its last renewal
	// left, which may run out before ipB's expiry is seen on a loaded machine).
	mustRemove(t, ctx, m, ipRemoved, false)
	renewed := time.Now()
	etcdtest.WaitFor(t, 10*time.Second, ipB+" to expire", func() bool {
		if time.Since(renewed) >= ttl*time.Second/3 { // its renew interval
			mustRenew(t, ctx, m, ipA, ttl)
			renewed = time.Now()
		}
		e, err := m.Endpoints(ctx)
		return err == nil && slices.Equal(e.Addresses, addrs(ipA))
	})
	if _, err := m.Endpoints(ctx); err != nil {
		t.Fatal(err)
	}
	if gone := eps.without(from, ipA); len(gone) > 0 {
		t.Errorf("endpoints without %s after the revoke: %v", ipA, gone)
	}
	for _, ip := range []string{ipB, ipRemoved} {
		if r, err := e.Client.Get(ctx, testPrefix+ip); err != nil || len(r.Kvs) != 0 {
			t.Errorf("Get(%s) = %v, %v; want no key: it expired or was removed", ip, r, err)
		}
	}
	got := gather(t, reg)
	for result, want := range map[string]float64{"restored": 1, "superseded": 0, "expired": 0} {
		if n := got["allocd_masterlease_restores_total{result="+result+"}"]; n != want {
			t.Errorf("allocd_masterlease_restores_total{result=%s} = %v; want %v", result, n, want)
		}
	}
}

// TestRestoreOnce: a restore writes the key only if nothing happened to it since the
// delete: not after a Renew wrote it, nor after a Remove of its address.
func TestRestoreOnce(t *testing.T) {
	t.Parallel()
	e := etcdtest.New(t)
	m := newStopped(t, e.Client) // no Run: the test makes the restore's one attempt
	ctx := etcdtest.Context(t)
	tests := []struct {
		name  string
		after func(ip string) // between the revoke and the restore
		want  string
		key   bool // the key is there after the restore
	}{
		{"nothing since", func(string) {}, "restored", true},
		{"renewed since", func(ip string) { mustRenew(t, ctx, m, ip, 3) }, "superseded", true},
		{"removed since", func(ip string) {
			if removed, _, err := m.Remove(ctx, ip, false); err != nil || removed {
				t.Fatalf("Remove(%s) = %v, %v; want false, nil (no key)", ip, removed, err)
			}
		}, "superseded", false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ip := netip.AddrFrom4([4]byte{10, 9, 1, byte(i + 1)})
			l := mustRenew(t, ctx, m, ip.String(), 3)
			prev, err := e.Client.Get(ctx, m.key(ip))
			if err != nil || len(prev.Kvs) != 1 {
				t.Fatalf("Get(%s) = %v, %v", m.key(ip), prev, err)
			}
			r, err := e.Client.Revoke(ctx, l.ID)
			if err != nil {
				t.Fatalf("Revoke(%x) = %v", l.ID, err)
			}
			j := goneJob(ip, prev.Kvs[0], r.Header.Revision)
			if left := time.Until(j.st.expires); left < 2*time.Second {
				t.Fatalf("goneJob(%s).expires in %v; want about 3 s", ip, left)
			}
			tt.after(ip.String())
			if got, err := m.restoreOnce(ctx, j, time.Until(j.st.expires)); got != tt.want {
				t.Errorf("restoreOnce(%s) = %q, %v; want %q", ip, got, err, tt.want)
			}
			resp, err := e.Client.Get(ctx, m.key(ip))
			if err != nil || (len(resp.Kvs) == 1) != tt.key {
				t.Errorf("Get(%s) after the restore = %v, %v; want the key: %v", m.key(ip), resp.Kvs, err,
					tt.key)
			}
		})
	}
}

// TestLateRenewalWriteExpires: the write of a renewal that comes long after its
// keep-alive (a first try refused during an election, a retry 1.7 s later) is the
// API server's last; its lease then runs out at the keep-alive plus the TTL. That is
// an expiry, not an early revocation: the key is not written again, nor counted
// restored.
func TestLateRenewalWriteExpires(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a real 3 s lease TTL")
	}
	t.Parallel()
	const ip, ttl = "10.9.2.1", 3
	e := etcdtest.New(t)
	var refuse atomic.Bool
	refuseOnce := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if _, ok := req.(*etcdserverpb.TxnRequest); ok && refuse.CompareAndSwap(true, false) {
			// Within call.Write's 2 s budget, with room for a loaded machine: it tries again.
			time.Sleep(1700 * time.Millisecond)
			return rpctypes.ErrGRPCNoLeader // refused before it was proposed: tried again
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Client.Endpoints(), Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(refuseOnce)}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	renewer := newStopped(t, cli)
	reg := prometheus.NewRegistry()
	m := start(t, e.Client, func(c *Config) { c.Registerer = reg })
	ctx := etcdtest.Context(t)
	mustRenew(t, ctx, m, "10.9.2.9", 60) // another API server: the endpoints' guard stays out
	mustRenew(t, ctx, renewer, ip, ttl)
	refuse.Store(true)
	began := time.Now()
	l := mustRenew(t, ctx, renewer, ip, ttl) // the keep-alive, then its write 1.7 s later
	if took := time.Since(began); took < 1700*time.Millisecond {
		t.Fatalf("Renew(%s) took %v; want its write tried again after 1.7 s", ip, took)
	}
	etcdtest.WaitFor(t, 10*time.Second, ip+" to leave the endpoints", func() bool {
		eps, err := m.Endpoints(ctx)
		return err == nil && !slices.Contains(eps.Addresses, netip.MustParseAddr(ip))
	})
	time.Sleep(500 * time.Millisecond) // a restore takes milliseconds
	if r, err := e.Client.Get(ctx, testPrefix+ip); err != nil || len(r.Kvs) != 0 {
		t.Errorf("Get(%s) after lease %x expired = %v, %v; want no key", ip, l.ID, r, err)
	}
	got := gather(t, reg)
	if n := got["allocd_masterlease_restores_total{result=restored}"]; n != 0 {
		t.Errorf("allocd_masterlease_restores_total{result=restored} = %v; want 0: it expired", n)
	}
}

// TestDeletesNotRestored: a lease key deleted by something other than etcd revoking
// its lease is not written again, although no Remove marker came with the delete: an
// operator's etcdctl del (the etcd lease lives on), and the Remove with shutdown of a
// replica older than the markers (the shutdown key in the delete's transaction, the
// lease revoked after). The address leaves the endpoints at once.
func TestDeletesNotRestored(t *testing.T) {
	t.Parallel()
	e := etcdtest.New(t)
	reg := prometheus.NewRegistry()
	m := start(t, e.Client, func(c *Config) { c.Registerer = reg })
	ctx := etcdtest.Context(t)
	mustRenew(t, ctx, m, "10.9.3.9", 60) // another API server: the endpoints' guard stays out
	tests := []struct {
		name, ip string
		del      func(key, ip string, id clientv3.LeaseID) error
	}{
		{"etcdctl del", "10.9.3.1", func(key, _ string, _ clientv3.LeaseID) error {
			_, err := e.Client.Delete(ctx, key)
			return err
		}},
		{"older replica's Remove on shutdown", "10.9.3.2", func(key, ip string, id clientv3.LeaseID) error {
			shutdown := clientv3.OpPut(testPrefix+"shutdown", ip) // and no marker
			_, err := e.Client.Txn(ctx).Then(clientv3.OpDelete(key), shutdown).Commit()
			if err == nil {
				_, err = e.Client.Revoke(ctx, id)
			}
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := mustRenew(t, ctx, m, tt.ip, 30)
			etcdtest.WaitFor(t, 5*time.Second, tt.ip+" in the endpoints", func() bool {
				eps, err := m.Endpoints(ctx)
				return err == nil && slices.Contains(eps.Addresses, netip.MustParseAddr(tt.ip))
			})
			if err := tt.del(testPrefix+tt.ip, tt.ip, l.ID); err != nil {
				t.Fatal(err)
			}
			etcdtest.WaitFor(t, 5*time.Second, tt.ip+" to leave the endpoints", func() bool {
				eps, err := m.Endpoints(ctx)
				return err == nil && !slices.Contains(eps.Addresses, netip.MustParseAddr(tt.ip))
			})
			time.Sleep(200 * time.Millisecond) // a restore takes milliseconds
			if r, err := e.Client.Get(ctx, testPrefix+tt.ip); err != nil || len(r.Kvs) != 0 {
				t.Errorf("Get(%s) after the delete = %v, %v; want no key", tt.ip, r, err)
			}
		})
	}
	if n := gather(t, reg)["allocd_masterlease_restores_total{result=restored}"]; n != 0 {
		t.Errorf("allocd_masterlease_restores_total{result=restored} = %v; want 0", n)
	}
}

// TestRelistRestoresKeptLease: a re-list keeps a lease revoked early that it does
// not find, and queues its restore again: its last job may have ended (superseded by
// another replica's restore, the key revoked early once more while the watch was
// down), and without a job the lease would stay in the state, and the endpoints,
// past its time.
func TestRelistRestoresKeptLease(t *testing.T) {
	t.Parallel()
	e := etcdtest.New(t)
	m := newStopped(t, e.Client) // no Run: the test calls load, as a re-list does
	ctx := etcdtest.Context(t)
	const ip = "10.9.4.1"
	j := keepRevoked(t, ctx, e, m, ip) // revoked early, its job ended
	if _, err := m.load(ctx); err != nil {
		t.Fatalf("load() = %v", err)
	}
	m.mu.Lock()
	job, queued := m.restores[j.addr]
	m.mu.Unlock()
	if !queued {
		t.Fatalf("after a re-list: no restore of %s queued; want one", ip)
	}
	if got := m.restore(ctx, job); got != "restored" {
		t.Errorf("restore(%s) = %q; want restored", ip, got)
	}
	if resp, err := e.Client.Get(ctx, testPrefix+ip); err != nil || len(resp.Kvs) != 1 {
		t.Errorf("Get(%s) after the restore = %v, %v; want the key", ip, resp, err)
	}
}

// keepRevoked renews ip's lease, revokes it in etcd and puts into m's state what Run
// keeps for a lease revoked early (m's Run not running): the job of its restore.
func keepRevoked(t *testing.T, ctx context.Context, e *etcdtest.Server, m *Manager, ip string) restoreJob {
	t.Helper()
	l := mustRenew(t, ctx, m, ip, 3)
	prev, err := e.Client.Get(ctx, testPrefix+ip)
	if err != nil || len(prev.Kvs) != 1 {
		t.Fatal(prev, err)
	}
	r, err := e.Client.Revoke(ctx, l.ID)
	if err != nil {
		t.Fatal(err)
	}
	j := goneJob(addrs(ip)[0], prev.Kvs[0], r.Header.Revision)
	m.mu.Lock()
	m.leases[j.addr] = j.st
	m.mu.Unlock()
	return j
}
