package masterlease

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// TestRemoveRacesRestore: a Remove that finds no key (etcd revoked the lease early)
// writes its marker only if the key is still absent; a replica's restore that writes
// the key between Remove's read and its marker is deleted by the Remove, which must
// not answer "absent" and leave the key live in the endpoints. The marker writes of
// this manager's client are delayed 300 ms (a slow link) and its restore's grant
// 100 ms, which makes the interleaving certain.
func TestRemoveRacesRestore(t *testing.T) {
	e := etcdtest.New(t)
	var grantDelay atomic.Bool
	delayMarker := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if markerOnly(req) {
			time.Sleep(300 * time.Millisecond)
		}
		if _, ok := req.(*etcdserverpb.LeaseGrantRequest); ok && grantDelay.Load() {
			time.Sleep(100 * time.Millisecond) // the restore's grant: Remove reads first
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Client.Endpoints(), Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(delayMarker)}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	m := start(t, cli)
	ctx := etcdtest.Context(t)
	const ip = "10.9.7.1"
	mustRenew(t, ctx, m, "10.9.7.9", 60) // another API server: the endpoints' guard stays out
	l := mustRenew(t, ctx, m, ip, 3)
	grantDelay.Store(true)
	if _, err := e.Client.Revoke(ctx, l.ID); err != nil { // a stale etcd leader's revoke
		t.Fatal(err)
	}
	removed, rev, err := m.Remove(ctx, ip, false)
	t.Logf("Remove(%s) = %v, %d, %v", ip, removed, rev, err)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	resp, err := e.Client.Get(ctx, testPrefix+ip)
	if err != nil {
		t.Fatal(err)
	}
	eps, err := m.Endpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 || len(eps.Addresses) != 1 {
		t.Errorf("after Remove(%s) returned: key %v, endpoints %v; want no key and no address",
			ip, resp.Kvs, eps.Addresses)
	}
}

// TestListAfterRemoveOfRevoked: List right after an acknowledged Remove of a lease
// that Run keeps as revoked early, before Run applied the marker's event, does not
// list it: List's own read returns the marker.
func TestListAfterRemoveOfRevoked(t *testing.T) {
	e := etcdtest.New(t)
	m := newStopped(t, e.Client) // Run's state is set by hand: the window before the marker's event
	ctx := etcdtest.Context(t)
	const ip = "10.9.7.2"
	keepRevoked(t, ctx, e, m, ip) // what revokedLocked keeps
	if removed, _, err := m.Remove(ctx, ip, false); err != nil || removed {
		t.Fatalf("Remove = %v, %v", removed, err)
	}
	ls, rev, err := m.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range ls {
		if x.IP.String() == ip {
			t.Errorf("List() at revision %d, after Remove(%s) was acknowledged, lists it: %+v", rev, ip, x)
		}
	}
}

// markerOnly reports whether req writes a Remove marker without deleting a key.
func markerOnly(req any) bool {
	switch r := req.(type) {
	case *etcdserverpb.PutRequest:
		return strings.Contains(string(r.Key), "/removed/")
	case *etcdserverpb.TxnRequest:
		marker := false
		for _, op := range r.Success {
			if op.GetRequestDeleteRange() != nil {
				return false
			}
			if p := op.GetRequestPut(); p != nil && strings.Contains(string(p.Key), "/removed/") {
				marker = true
			}
		}
		return marker
	}
	return false
}

// TestRemoveUnderNoSpace: with etcd out of space (NOSPACE), which refuses any
// transaction with a Put but not a delete, and grants no lease, Remove still deletes
// the key (without its marker, which etcd refuses), and the address leaves the
// endpoints at once: every replica takes the unmarked delete for an early revocation
// (or, while its etcd lease lives, a delete by hand), and drops it rather than keep it
// for its TTL. So does a lease etcd revokes early meanwhile: it cannot be written back.
func TestRemoveUnderNoSpace(t *testing.T) {
	e := etcdtest.New(t)
	reg := prometheus.NewRegistry()
	m := start(t, e.Client, func(c *Config) { c.Registerer = reg })
	ctx := etcdtest.Context(t)
	const ip, revoked, other = "10.9.7.3", "10.9.7.6", "10.9.7.4"
	mustRenew(t, ctx, m, other, 60) // the endpoints' guard stays out
	mustRenew(t, ctx, m, ip, 60)
	l := mustRenew(t, ctx, m, revoked, 60)
	st, err := e.Client.Status(ctx, e.Client.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	mc := etcdserverpb.NewMaintenanceClient(e.Client.ActiveConnection())
	if _, err := mc.Alarm(ctx, &etcdserverpb.AlarmRequest{Action: etcdserverpb.AlarmRequest_ACTIVATE,
		MemberID: st.Header.MemberId, Alarm: etcdserverpb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	defer e.Client.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: st.Header.MemberId,
		Alarm: etcdserverpb.AlarmType_NOSPACE})
	if _, err := e.Client.Txn(ctx).Then(clientv3.OpDelete(testPrefix + "nothing")).Commit(); err != nil {
		t.Fatalf("a delete-only txn under NOSPACE = %v", err)
	}
	removed, _, err := m.Remove(ctx, ip, false)
	if err != nil || !removed {
		t.Fatalf("Remove(%s) under NOSPACE = %v, %v; want true, nil (a delete is not refused)", ip, removed,
			err)
	}
	etcdtest.WaitFor(t, 5*time.Second, "the endpoints without "+ip, func() bool {
		eps, err := m.Endpoints(ctx)
		return err == nil && !slices.Contains(eps.Addresses, addrs(ip)[0])
	})
	if removed, _, err := m.Remove(ctx, ip, false); err != nil || removed {
		t.Errorf("Remove(%s) again under NOSPACE = %v, %v; want false, nil", ip, removed, err)
	}
	if _, err := e.Client.Revoke(ctx, l.ID); err != nil { // a stale etcd leader's revoke
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 5*time.Second, "the endpoints without "+revoked, func() bool {
		eps, err := m.Endpoints(ctx)
		return err == nil && slices.Equal(eps.Addresses, addrs(other))
	})
	ls, _, err := m.List(ctx)
	if err != nil || len(ls) != 1 || ls[0].IP.String() != other {
		t.Errorf("List() under NOSPACE = %v, %v; want only %s", ls, err, other)
	}
	got := gather(t, reg)
	nospace, deleted := got["allocd_masterlease_restores_total{result=nospace}"],
		got["allocd_masterlease_restores_total{result=deleted}"]
	if nospace < 1 || nospace+deleted != 2 {
		t.Errorf("allocd_masterlease_restores_total{result=nospace} = %v, {result=deleted} = %v; want "+
			"2 in all, the revoked one nospace", nospace, deleted)
	}
}

// TestShutdownOfLastRevokedEarly: the last API server, whose key etcd revoked early
// (its restore not written yet), removes its lease on shutdown: the endpoints become
// empty, as when its key is there (kubernetes #115804), rather than keep its address.
// The restore's grant is delayed 300 ms, so that Remove finds no key.
func TestShutdownOfLastRevokedEarly(t *testing.T) {
	e := etcdtest.New(t)
	var delay atomic.Bool
	delayGrant := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if _, ok := req.(*etcdserverpb.LeaseGrantRequest); ok && delay.Load() {
			time.Sleep(300 * time.Millisecond)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Client.Endpoints(), Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(delayGrant)}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	m := start(t, cli)
	ctx := etcdtest.Context(t)
	const ip = "10.9.7.5"
	l := mustRenew(t, ctx, m, ip, 30)
	etcdtest.WaitFor(t, 5*time.Second, ip+" in the endpoints", func() bool {
		eps, err := m.Endpoints(ctx)
		return err == nil && slices.Equal(eps.Addresses, addrs(ip))
	})
	delay.Store(true)
	if _, err := e.Client.Revoke(ctx, l.ID); err != nil { // a stale etcd leader's revoke
		t.Fatal(err)
	}
	if removed, _, err := m.Remove(ctx, ip, true); err != nil || removed {
		t.Fatalf("Remove(%s, shutdown) = %v, %v; want false, nil (no key)", ip, removed, err)
	}
	eps, err := m.Endpoints(ctx)
	if err != nil || len(eps.Addresses) != 0 {
		t.Errorf("Endpoints() after the last API server's shutdown = %v, %v; want none", eps.Addresses, err)
	}
	time.Sleep(500 * time.Millisecond) // the delayed restore's attempt
	if r, err := e.Client.Get(ctx, testPrefix+ip); err != nil || len(r.Kvs) != 0 {
		t.Errorf("Get(%s) after Remove = %v, %v; want no key", ip, r, err)
	}
}
