package masterlease

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

const testPrefix = "/test/masterleases/"

// start returns a Manager on cli whose Run goroutine is stopped and waited for by
// t.Cleanup.
func start(t *testing.T, cli *clientv3.Client, mutate ...func(*Config)) *Manager {
	t.Helper()
	m := newStopped(t, cli, mutate...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v; want nil", err)
		}
	})
	return m
}

// newStopped returns a Manager whose Run is not running.
func newStopped(t *testing.T, cli *clientv3.Client, mutate ...func(*Config)) *Manager {
	t.Helper()
	cfg := Config{Prefix: testPrefix, DefaultTTL: 2 * time.Second, ServicePort: 6443}
	for _, f := range mutate {
		f(&cfg)
	}
	m, err := New(context.Background(), cli, cfg)
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	return m
}

func etcdLeases(t *testing.T, cli *clientv3.Client) []clientv3.LeaseID {
	t.Helper()
	r, err := cli.Leases(etcdtest.Context(t))
	if err != nil {
		t.Fatalf("Leases() = %v", err)
	}
	var ids []clientv3.LeaseID
	for _, l := range r.Leases {
		ids = append(ids, l.ID)
	}
	return ids
}

func TestParseIP(t *testing.T) {
	tests := []struct {
		in   string
		want string // canonical; "" means invalid
	}{
		{"10.0.0.1", "10.0.0.1"},
		{"2001:DB8::1", "2001:db8::1"},
		{"2001:db8:0:0:0:0:0:1", "2001:db8::1"},
		{"127.0.0.1", "127.0.0.1"},
		{"fe80::1", "fe80::1"},
		{"", ""},
		{"not-an-ip", ""},
		{"0.0.0.0", ""},
		{"::", ""},
		{"224.0.0.1", ""},
		{"ff02::1", ""},
		{"fe80::1%eth0", ""},
		{"::ffff:10.0.0.1", ""},
		{"10.0.0.1/24", ""},
		{"010.0.0.1", ""},
		{" 10.0.0.1", ""},
	}
	for _, tt := range tests {
		a, err := parseAddr(tt.in)
		if tt.want == "" {
			var inv *InvalidError
			if !errors.As(err, &inv) || !errors.Is(err, ErrInvalid) || inv.Violations[0].Field != "ip" {
				t.Errorf("parseAddr(%q) = %v, %v; want an *InvalidError on field ip", tt.in, a, err)
			}
			continue
		}
		if err != nil || a.String() != tt.want {
			t.Errorf("parseAddr(%q) = %v, %v; want %s", tt.in, a, err, tt.want)
		}
	}
}

func TestRenewInvalidWritesNothing(t *testing.T) {
	e := etcdtest.New(t)
	m := newStopped(t, e.Client)
	ctx := etcdtest.Context(t)
	tests := []struct {
		ip     string
		ttl    int64
		fields []string
	}{
		{"not-an-ip", 0, []string{"ip"}},
		{"0.0.0.0", 0, []string{"ip"}},
		{"::", 0, []string{"ip"}},
		{"224.0.0.1", 0, []string{"ip"}},
		{"ff02::1", 0, []string{"ip"}},
		{"", 0, []string{"ip"}},
		{"10.0.0.1", -1, []string{"ttl_seconds"}},
		{"10.0.0.1", 3601, []string{"ttl_seconds"}},
		{"10.0.0.1", 1 << 62, []string{"ttl_seconds"}},
		{"224.0.0.1", -5, []string{"ip", "ttl_seconds"}},
	}
	before, err := e.Client.Get(ctx, "any")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		l, err := m.Renew(ctx, tt.ip, tt.ttl)
		var inv *InvalidError
		if !errors.As(err, &inv) {
			t.Errorf("Renew(%q, %d) = %v, %v; want *InvalidError", tt.ip, tt.ttl, l, err)
			continue
		}
		var fields []string
		for _, v := range inv.Violations {
			fields = append(fields, v.Field)
		}
		if !slices.Equal(fields, tt.fields) {
			t.Errorf("Renew(%q, %d) violations on %v; want %v", tt.ip, tt.ttl, fields, tt.fields)
		}
	}
	for _, ip := range []string{"not-an-ip", "0.0.0.0", "ff02::1"} {
		if _, _, err := m.Remove(ctx, ip, true); !errors.Is(err, ErrInvalid) {
			t.Errorf("Remove(%q) = %v; want ErrInvalid", ip, err)
		}
	}
	after, err := e.Client.Get(ctx, "any")
	if err != nil {
		t.Fatal(err)
	}
	if after.Header.Revision != before.Header.Revision {
		t.Errorf("etcd revision = %d after bad requests; want %d (nothing written)", after.Header.Revision,
			before.Header.Revision)
	}
	if ids := etcdLeases(t, e.Client); len(ids) != 0 {
		t.Errorf("etcd leases after bad requests = %v; want none", ids)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	e := etcdtest.New(t)
	tests := []Config{
		{Prefix: ""},
		{Prefix: testPrefix, DefaultTTL: 2 * time.Hour},
		{Prefix: testPrefix, ServicePort: 70000},
		{Prefix: testPrefix, ServicePort: -1},
	}
	for _, cfg := range tests {
		if m, err := New(etcdtest.Context(t), e.Client, cfg); err == nil {
			t.Errorf("New(%+v) = %v, nil; want an error", cfg, m)
		}
	}
	if ids := etcdLeases(t, e.Client); len(ids) != 0 {
		t.Errorf("etcd leases after New = %v; want none (the probe lease is revoked)", ids)
	}
}

// TestExpiryLatency measures, for a lease that is not renewed, the time from the last
// acknowledged Renew to the deletion of its key: at least the TTL (etcd's TTL is a lower
// bound) and at most TTL + 1 s on a quiet etcd.
func TestExpiryLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out real lease TTLs: seconds")
	}
	t.Parallel()
	e := etcdtest.New(t)
	m := newStopped(t, e.Client)
	ctx := etcdtest.Context(t)
	for _, ttl := range []int64{1, 2} {
		ip := fmt.Sprintf("10.0.0.%d", ttl)
		l, err := m.Renew(ctx, ip, ttl)
		if err != nil {
			t.Fatalf("Renew(%s, %d) = %v", ip, ttl, err)
		}
		acked := time.Now()
		if l.TTL != time.Duration(ttl)*time.Second {
			t.Errorf("Renew(%s, %d).TTL = %v; want %ds", ip, ttl, l.TTL, ttl)
		}
		wch := e.Client.Watch(ctx, testPrefix+ip, clientv3.WithRev(l.Revision+1))
		var gone time.Time
		for resp := range wch {
			isDelete := func(ev *clientv3.Event) bool { return ev.Type == mvccpb.DELETE }
			if slices.ContainsFunc(resp.Events, isDelete) {
				gone = time.Now()
				break
			}
		}
		took := gone.Sub(acked)
		t.Logf("ttl %ds: key removed %v after the last Renew (TTL + %v)", ttl, took,
			took-time.Duration(ttl)*time.Second)
		if lo, hi := time.Duration(ttl)*time.Second-50*time.Millisecond, time.Duration(ttl)*time.Second+
			time.Second; took < lo || took > hi {
			t.Errorf("expiry of a %ds lease took %v; want within [%v, %v]", ttl, took, lo, hi)
		}
		ls, _, err := m.List(ctx)
		if err != nil || len(ls) != 0 {
			t.Errorf("List() after expiry = %v, %v; want none", ls, err)
		}
	}
}

// TestRenewEveryThirdNeverExpires renews a 1 s lease every 1/3 s for 10 s: the key is
// never deleted, and it stays on one etcd lease.
func TestRenewEveryThirdNeverExpires(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out real lease TTLs: seconds")
	}
	t.Parallel()
	e := etcdtest.New(t)
	m := newStopped(t, e.Client)
	ctx := etcdtest.Context(t)
	const ip = "10.1.0.1"
	first, err := m.Renew(ctx, ip, 1)
	if err != nil {
		t.Fatalf("Renew() = %v", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := e.Client.Watch(wctx, testPrefix+ip, clientv3.WithRev(first.Revision+1))
	deleted := make(chan int64, 1)
	go func() {
		for resp := range wch {
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					deleted <- ev.Kv.ModRevision
					return
				}
			}
		}
	}()
	tick := time.NewTicker(time.Second / 3)
	defer tick.Stop()
	end := time.Now().Add(10 * time.Second)
	n := 0
	for time.Now().Before(end) {
		select {
		case rev := <-deleted:
			t.Fatalf("lease key deleted at revision %d after %d renewals", rev, n)
		case <-tick.C:
		}
		l, err := m.Renew(ctx, ip, 1)
		if err != nil {
			t.Fatalf("Renew() #%d = %v", n, err)
		}
		if l.ID != first.ID {
			t.Fatalf("Renew() #%d lease = %x; want the first one, %x", n, l.ID, first.ID)
		}
		n++
	}
	select {
	case rev := <-deleted:
		t.Fatalf("lease key deleted at revision %d", rev)
	default:
	}
	if ids := etcdLeases(t, e.Client); len(ids) != 1 {
		t.Errorf("etcd leases after %d renewals = %v; want one", n, ids)
	}
}

func TestRenewLeavesOneEtcdLease(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out real lease TTLs: seconds")
	}
	t.Parallel()
	e := etcdtest.New(t)
	m1 := newStopped(t, e.Client)
	m2 := newStopped(t, e.NewClient())
	ctx := etcdtest.Context(t)
	const ip = "10.2.0.1"

	var ids []clientv3.LeaseID
	for range 30 {
		l, err := m1.Renew(ctx, ip, 10)
		if err != nil {
			t.Fatalf("Renew() = %v", err)
		}
		ids = append(ids, l.ID)
	}
	used := slices.Compact(slices.Clone(ids))
	if got := etcdLeases(t, e.Client); len(got) != 1 || got[0] != ids[0] || len(used) != 1 {
		t.Errorf("after 30 renewals: etcd leases %x, renewals used %x; want one lease", got, used)
	}

	// A new TTL needs a new lease: the old one is revoked.
	l, err := m1.Renew(ctx, ip, 20)
	if err != nil {
		t.Fatalf("Renew(ttl 20) = %v", err)
	}
	if l.ID == ids[0] || l.TTL != 20*time.Second {
		t.Errorf("Renew(ttl 20) = lease %x ttl %v; want a new lease with 20s", l.ID, l.TTL)
	}
	if got := etcdLeases(t, e.Client); !slices.Equal(got, []clientv3.LeaseID{l.ID}) {
		t.Errorf("etcd leases after a TTL change = %x; want [%x]", got, l.ID)
	}

	// Two replicas renewing the same IP at once, with alternating TTLs, race on the
	// key; afterwards exactly one lease is left, the key's.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 8 {
		m := m1
		if i%2 == 1 {
			m = m2
		}
		wg.Go(func() {
			for j := range 6 {
				if _, err := m.Renew(ctx, ip, int64(10+(i+j)%2)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		// ErrConflict is allowed under this much contention; anything else is not.
		if !errors.Is(err, ErrConflict) {
			t.Errorf("concurrent Renew() = %v", err)
		}
	}
	ls, _, err := m2.List(ctx)
	if err != nil || len(ls) != 1 {
		t.Fatalf("List() = %v, %v; want one lease", ls, err)
	}
	if got := etcdLeases(t, e.Client); !slices.Equal(got, []clientv3.LeaseID{ls[0].ID}) {
		t.Errorf("etcd leases after concurrent renewals = %x; want only the key's, [%x]", got, ls[0].ID)
	}
}

func TestRemove(t *testing.T) {
	e := etcdtest.New(t)
	m := newStopped(t, e.Client)
	ctx := etcdtest.Context(t)
	l, err := m.Renew(ctx, "2001:db8::7", 30)
	if err != nil {
		t.Fatalf("Renew() = %v", err)
	}
	removed, rev, err := m.Remove(ctx, "2001:DB8::7", false)
	if err != nil || !removed || rev <= l.Revision {
		t.Errorf("Remove() = %v, %d, %v; want true, > %d, nil", removed, rev, err, l.Revision)
	}
	if ids := etcdLeases(t, e.Client); len(ids) != 0 {
		t.Errorf("etcd leases after Remove = %v; want none (revoked)", ids)
	}
	if r, err := e.Client.Get(ctx, testPrefix+"2001:db8::7"); err != nil || len(r.Kvs) != 0 {
		t.Errorf("lease key after Remove = %v, %v; want gone", r.Kvs, err)
	}
	removed, _, err = m.Remove(ctx, "2001:db8::7", false)
	if err != nil || removed {
		t.Errorf("Remove() of an absent lease = %v, %v; want false, nil", removed, err)
	}
}

func TestListSortedWithRemaining(t *testing.T) {
	e := etcdtest.New(t)
	writer := newStopped(t, e.Client)
	ctx := etcdtest.Context(t)
	ips := []string{"2001:db8::1", "10.0.0.10", "192.168.0.1", "10.0.0.9", "::1"}
	for _, ip := range ips {
		if _, err := writer.Renew(ctx, ip, 30); err != nil {
			t.Fatalf("Renew(%s) = %v", ip, err)
		}
	}
	// Write a key under the prefix that is not a lease: List skips it.
	if _, err := e.Client.Put(ctx, testPrefix+"junk", "x"); err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.9", "10.0.0.10", "192.168.0.1", "::1", "2001:db8::1"}
	// The writer's Run is not running (remaining TTLs from etcd's TimeToLive); the
	// other Manager's is (remaining TTLs from its watch).
	for name, m := range map[string]*Manager{"without Run": writer, "with Run": start(t, e.NewClient())} {
		if _, err := m.Renew(ctx, "10.0.0.9", 30); err != nil {
			t.Fatal(err)
		}
		if name == "with Run" {
			if _, err := m.Endpoints(ctx); err != nil { // wait for the watch
				t.Fatal(err)
			}
		}
		ls, rev, err := m.List(ctx)
		if err != nil {
			t.Fatalf("%s: List() = %v", name, err)
		}
		var got []string
		for _, l := range ls {
			got = append(got, l.IP.String())
			if l.TTL != 30*time.Second || l.Remaining <= 25*time.Second || l.Remaining > 30*time.Second ||
				l.ID == 0 || l.Revision == 0 || l.Revision > rev {
				t.Errorf("%s: List() lease %+v; want TTL 30s, remaining in (25s, 30s], an id and a "+
					"revision <= %d", name, l, rev)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: List() = %v; want %v", name, got, want)
		}
	}
}

func TestMetrics(t *testing.T) {
	e := etcdtest.New(t)
	reg := prometheus.NewRegistry()
	m := start(t, e.Client, func(c *Config) { c.Registerer = reg })
	ctx := etcdtest.Context(t)
	if _, err := m.Renew(ctx, "10.3.0.1", 0); err != nil {
		t.Fatal(err)
	}
	lastRenew := time.Now()
	if _, err := m.Renew(ctx, "10.3.0.1", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Renew(ctx, "10.3.0.2", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Renew(ctx, "bad", 0); err == nil {
		t.Fatal("Renew(bad) = nil")
	}
	if _, err := m.Endpoints(ctx); err != nil {
		t.Fatal(err)
	}
	check := func(when string, want map[string]float64) {
		t.Helper()
		got := gather(t, reg)
		for k, v := range want {
			if g, ok := got[k]; v < 0 && ok {
				t.Errorf("%s: metric %s = %v; want absent", when, k, g)
			} else if v >= 0 && (!ok || g != v) {
				t.Errorf("%s: metric %s = %v (present %v); want %v", when, k, g, ok, v)
			}
		}
	}
	check("after renewals", map[string]float64{
		"allocd_masterlease_leases":                       2,
		"allocd_masterlease_renews_total{result=created}": 2,
		"allocd_masterlease_renews_total{result=renewed}": 1,
		"allocd_masterlease_renews_total{result=invalid}": 1,
		"allocd_masterlease_endpoints_addresses":          2,
		"allocd_masterlease_ttl_seconds{ip=10.3.0.1}":     2,
	})
	s := gather(t, reg)["allocd_masterlease_seconds_since_renew{ip=10.3.0.1}"]
	if limit := time.Since(lastRenew).Seconds(); s < 0 || s > limit {
		t.Errorf("seconds since renew of 10.3.0.1 = %v; want in [0, %v] (time since the Renew call)", s,
			limit)
	}
	if _, _, err := m.Remove(ctx, "10.3.0.1", false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Remove(ctx, "10.3.0.1", false); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Endpoints(ctx); err != nil {
		t.Fatal(err)
	}
	check("after removals", map[string]float64{
		"allocd_masterlease_leases":                           1,
		"allocd_masterlease_removes_total{result=removed}":    1,
		"allocd_masterlease_removes_total{result=absent}":     1,
		"allocd_masterlease_seconds_since_renew{ip=10.3.0.1}": -1,
		"allocd_masterlease_endpoints_guarded":                0,
	})
	if _, ok := gather(t, reg)["allocd_masterlease_seconds_since_renew{ip=10.3.0.2}"]; !ok {
		t.Errorf("seconds since renew of 10.3.0.2 absent; want present")
	}
}

// gather flattens a registry into "name{label=value,...}" -> value.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather() = %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			name := mf.GetName()
			if len(mt.GetLabel()) > 0 {
				name += "{"
				for i, lp := range mt.GetLabel() {
					if i > 0 {
						name += ","
					}
					name += lp.GetName() + "=" + lp.GetValue()
				}
				name += "}"
			}
			switch {
			case mt.GetCounter() != nil:
				out[name] = mt.GetCounter().GetValue()
			case mt.GetGauge() != nil:
				out[name] = mt.GetGauge().GetValue()
			}
		}
	}
	return out
}

func addrs(ss ...string) []netip.Addr {
	out := []netip.Addr{}
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// TestRenewThroughRestart renews a 2 s lease every TTL/3 while the etcd member
// restarts (its lessor is promoted again, as after a leader change): renewals during
// the outage may fail, the key must never be deleted and keeps its lease.
func TestRenewThroughRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts etcd under real lease TTLs: seconds")
	}
	t.Parallel()
	e := etcdtest.New(t, etcdtest.WithFsync())
	m := newStopped(t, e.Client)
	ctx := etcdtest.Context(t)
	const ip = "10.7.0.1"
	first, err := m.Renew(ctx, ip, 2)
	if err != nil {
		t.Fatalf("Renew() = %v", err)
	}
	tick := time.NewTicker(2 * time.Second / 3)
	defer tick.Stop()
	failed := 0
	for i := range 9 { // 6 s
		if i == 3 {
			e.Restart()
		}
		<-tick.C
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		if _, err := m.Renew(rctx, ip, 2); err != nil {
			failed++
			t.Logf("Renew() #%d during the restart = %v", i, err)
		}
		cancel()
	}
	// The key's history from the first Renew on holds no delete.
	resp, err := e.Client.Get(ctx, testPrefix+ip)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("Get(lease key) = %v, %v; want the key", resp, err)
	}
	if got := clientv3.LeaseID(resp.Kvs[0].Lease); got != first.ID ||
		resp.Kvs[0].CreateRevision != first.Revision {
		t.Errorf("lease key: lease %x created at %d; want the first lease %x, created at %d (never deleted)",
			got, resp.Kvs[0].CreateRevision, first.ID, first.Revision)
	}
	t.Logf("%d of 9 renewals failed around the restart; the lease outlived them", failed)
}
