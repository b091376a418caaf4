package masterlease

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// recorder collects what one WatchEndpoints sends.
type recorder struct {
	ch   chan Endpoints
	done chan error
}

func watchEndpoints(t *testing.T, ctx context.Context, m *Manager) *recorder {
	t.Helper()
	r := &recorder{ch: make(chan Endpoints, 100), done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		r.done <- m.WatchEndpoints(ctx, func(e Endpoints) error { r.ch <- e; return nil })
	}()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

// next returns the next message, failing the test if none comes within wait.
func (r *recorder) next(t *testing.T, wait time.Duration) Endpoints {
	t.Helper()
	select {
	case e := <-r.ch:
		return e
	case err := <-r.done:
		t.Fatalf("WatchEndpoints() ended: %v", err)
	case <-time.After(wait):
		t.Fatalf("no WatchEndpoints message within %v", wait)
	}
	return Endpoints{}
}

func checkAddrs(t *testing.T, what string, e Endpoints, want ...string) {
	t.Helper()
	wantAddrs := addrs(want...)
	wantPorts := []Port{{Name: "https", Port: 6443, Protocol: "TCP"}}
	if !slices.Equal(e.Addresses, wantAddrs) || !slices.Equal(e.Ports, wantPorts) {
		t.Errorf("%s = %v %v; want %v %v", what, e.Addresses, e.Ports, wantAddrs, wantPorts)
	}
}

func mustRenew(t *testing.T, ctx context.Context, m *Manager, ip string, ttl int64) Lease {
	t.Helper()
	l, err := m.Renew(ctx, ip, ttl)
	if err != nil {
		t.Fatalf("Renew(%s, %d) = %v", ip, ttl, err)
	}
	return l
}

func mustRemove(t *testing.T, ctx context.Context, m *Manager, ip string, shutdown bool) int64 {
	t.Helper()
	removed, rev, err := m.Remove(ctx, ip, shutdown)
	if err != nil || !removed {
		t.Fatalf("Remove(%s, %v) = %v, %v; want true, nil", ip, shutdown, removed, err)
	}
	return rev
}

func mustEndpoints(t *testing.T, ctx context.Context, m *Manager) Endpoints {
	t.Helper()
	eps, err := m.Endpoints(ctx)
	if err != nil {
		t.Fatalf("Endpoints() = %v", err)
	}
	return eps
}

// TestWatchEndpoints checks the stream: the current state first, then one message per
// change in order, none for renewals that change nothing, the guard when storage lists
// no lease, and the shutdown exception, signalled by another replica.
func TestWatchEndpoints(t *testing.T) {
	t.Parallel()
	e := etcdtest.New(t)
	m := start(t, e.Client)
	other := start(t, e.NewClient()) // a second replica
	ctx := etcdtest.Context(t)
	const wait = 5 * time.Second

	r := watchEndpoints(t, ctx, m)
	initial := r.next(t, wait)
	checkAddrs(t, "initial state", initial)
	if initial.Revision == 0 {
		t.Errorf("initial state revision = 0; want the revision read")
	}
	// The other replica lists storage before the first write too: one that listed it
	// only after the last lease left would publish nothing, not the guard's B below.
	checkAddrs(t, "other replica's initial state", mustEndpoints(t, ctx, other))

	a := mustRenew(t, ctx, m, "10.0.0.2", 30)
	got := r.next(t, wait)
	checkAddrs(t, "after Renew(A)", got, "10.0.0.2")
	if got.Revision != a.Revision {
		t.Errorf("revision after Renew(A) = %d; want %d", got.Revision, a.Revision)
	}

	// No change: renewals of A, also a TTL change (a new etcd lease), through either
	// replica.
	mustRenew(t, ctx, m, "10.0.0.2", 30)
	mustRenew(t, ctx, other, "10.0.0.2", 30)
	mustRenew(t, ctx, m, "10.0.0.2", 40)
	b := mustRenew(t, ctx, other, "10.0.0.1", 30)
	got = r.next(t, wait) // the next message is B's: nothing was sent for the renewals
	checkAddrs(t, "after renewals of A, then Renew(B)", got, "10.0.0.1", "10.0.0.2")
	if got.Revision != b.Revision {
		t.Errorf("revision after Renew(B) = %d; want %d", got.Revision, b.Revision)
	}

	rev := mustRemove(t, ctx, m, "10.0.0.2", false)
	got = r.next(t, wait)
	checkAddrs(t, "after Remove(A)", got, "10.0.0.1")
	if got.Revision != rev {
		t.Errorf("revision after Remove(A) = %d; want %d", got.Revision, rev)
	}

	// Guard: the last lease removed without shutdown; the endpoints keep B.
	mustRemove(t, ctx, other, "10.0.0.1", false)
	for _, mm := range []*Manager{m, other} {
		checkAddrs(t, "Endpoints() with no lease in storage (guard)", mustEndpoints(t, ctx, mm), "10.0.0.1")
		if !mm.snapshot().guarded {
			t.Errorf("guarded = false with no lease in storage; want true")
		}
	}

	mustRenew(t, ctx, m, "2001:db8::1", 30)
	got = r.next(t, wait) // nothing was sent while the guard held
	checkAddrs(t, "after Renew(C)", got, "2001:db8::1")

	// The last API server shuts down cleanly, through the other replica: empty.
	rev = mustRemove(t, ctx, other, "2001:db8::1", true)
	got = r.next(t, wait)
	checkAddrs(t, "after Remove(C, shutdown)", got)
	if got.Revision != rev {
		t.Errorf("revision after Remove(C, shutdown) = %d; want %d", got.Revision, rev)
	}

	mustRenew(t, ctx, other, "10.0.0.2", 30)
	got = r.next(t, wait)
	checkAddrs(t, "after Renew(A) again", got, "10.0.0.2")
	select {
	case extra := <-r.ch:
		t.Errorf("unexpected message %v", extra)
	default:
	}
}

// TestApplyBatch: one watch response may carry the events of many revisions (etcd sends
// a watch that starts behind its current revision everything it missed at once); the
// endpoints after it are those of applying the revisions one at a time: the guard keeps
// the last non-empty state, not the one before the response, and the two events of a
// shutdown removal's transaction count together.
func TestApplyBatch(t *testing.T) {
	t.Parallel()
	e := etcdtest.New(t)
	put := func(ip string, rev int64) *clientv3.Event {
		return &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(testPrefix + ip),
			Value: []byte(encode(30, 30, time.Now())), ModRevision: rev, Lease: rev}}
	}
	del := func(ip string, rev int64) *clientv3.Event {
		return &clientv3.Event{Type: mvccpb.DELETE,
			Kv: &mvccpb.KeyValue{Key: []byte(testPrefix + ip), ModRevision: rev}}
	}
	shut := func(ip string, rev int64) *clientv3.Event {
		return &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(testPrefix + shutdownName),
			Value: []byte(ip), ModRevision: rev}}
	}
	tests := []struct {
		name    string
		before  []*clientv3.Event // applied one response per revision
		batch   []*clientv3.Event // one response
		want    []string
		wantRev int64
		guarded bool
	}{
		{"a lease comes and goes", nil,
			[]*clientv3.Event{put("10.0.0.1", 2), del("10.0.0.1", 3)}, []string{"10.0.0.1"}, 2, true},
		{"from none to none", nil, []*clientv3.Event{put("10.0.0.2", 2), put("10.0.0.1", 3),
			del("10.0.0.2", 4), del("10.0.0.1", 5)}, []string{"10.0.0.1"}, 4, true},
		{"kept: the last state, not the one before", []*clientv3.Event{put("10.0.0.2", 2)},
			[]*clientv3.Event{put("10.0.0.1", 3), del("10.0.0.2", 4), del("10.0.0.1", 5)},
			[]string{"10.0.0.1"}, 4, true},
		{"shutdown, then a lease that goes", []*clientv3.Event{put("10.0.0.3", 2)},
			[]*clientv3.Event{del("10.0.0.3", 3), shut("10.0.0.3", 3), put("10.0.0.4", 4),
				del("10.0.0.4", 5)},
			[]string{"10.0.0.4"}, 4, true},
		{"shutdown in the batch", nil,
			[]*clientv3.Event{put("10.0.0.3", 2), del("10.0.0.3", 3), shut("10.0.0.3", 3)}, nil, 3, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newStopped(t, e.Client)
			for _, ev := range tt.before {
				m.apply([]*clientv3.Event{ev})
			}
			m.apply(tt.batch)
			checkAddrs(t, "endpoints", m.eps, tt.want...)
			if m.eps.Revision != tt.wantRev || m.guarded != tt.guarded {
				t.Errorf("revision, guarded = %d, %v; want %d, %v", m.eps.Revision, m.guarded, tt.wantRev,
					tt.guarded)
			}
			if last := tt.batch[len(tt.batch)-1].Kv.ModRevision; m.progress.Rev() != last {
				t.Errorf("progress = %d; want %d", m.progress.Rev(), last)
			}
		})
	}
}

// TestApplyCatchUp replays TestWatchEndpoints's writes as etcd sends them to a watch
// opened behind its current revision (as Run's watch is when writes come between its
// list and its creation): in one response. The guard keeps B, as with live events.
func TestApplyCatchUp(t *testing.T) {
	t.Parallel()
	e := etcdtest.New(t)
	writer := start(t, e.Client)
	m := newStopped(t, e.Client)
	ctx := etcdtest.Context(t)
	from, err := m.load(ctx)
	if err != nil {
		t.Fatalf("load() = %v", err)
	}
	mustRenew(t, ctx, writer, "10.0.0.2", 30)
	mustRenew(t, ctx, writer, "10.0.0.1", 30)
	mustRemove(t, ctx, writer, "10.0.0.2", false)
	last := mustRemove(t, ctx, writer, "10.0.0.1", false)

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := e.Client.Watch(wctx, testPrefix, clientv3.WithPrefix(), clientv3.WithRev(from+1))
	responses := 0
	for m.progress.Rev() < last {
		select {
		case resp := <-wch:
			if err := resp.Err(); err != nil {
				t.Fatalf("watch: %v", err)
			}
			responses++
			m.apply(resp.Events)
		case <-time.After(5 * time.Second):
			t.Fatalf("watch at revision %d after 5s; want %d", m.progress.Rev(), last)
		}
	}
	t.Logf("4 revisions in %d watch responses", responses)
	checkAddrs(t, "endpoints with no lease in storage (guard)", m.eps, "10.0.0.1")
	if !m.guarded {
		t.Errorf("guarded = false with no lease in storage; want true")
	}
}

// TestGuardOnExpiry lets the only lease expire: storage lists none, the endpoints
// keep its address.
func TestGuardOnExpiry(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out real lease TTLs: seconds")
	}
	t.Parallel()
	e := etcdtest.New(t)
	m := start(t, e.Client)
	ctx := etcdtest.Context(t)
	mustRenew(t, ctx, m, "10.4.0.1", 1)
	etcdtest.WaitFor(t, 5*time.Second, "the lease to expire", func() bool {
		ls, _, err := m.List(ctx)
		return err == nil && len(ls) == 0
	})
	eps, err := m.Endpoints(ctx)
	if err != nil {
		t.Fatalf("Endpoints() = %v", err)
	}
	checkAddrs(t, "Endpoints() after the only lease expired", eps, "10.4.0.1")
	if !m.snapshot().guarded {
		t.Errorf("guarded = false after the only lease expired; want true")
	}
	// A shutdown removal of an absent lease is not the last API server's shutdown.
	if removed, _, err := m.Remove(ctx, "10.4.0.1", true); err != nil || removed {
		t.Errorf("Remove(absent, shutdown) = %v, %v; want false, nil", removed, err)
	}
	eps, _ = m.Endpoints(ctx)
	checkAddrs(t, "Endpoints() after a shutdown removal of an absent lease", eps, "10.4.0.1")
}

// TestEndpointsLeaveWithinTTL: a lease that is not renewed leaves WatchEndpoints
// within TTL + 2 s while another is renewed every TTL/3.
func TestEndpointsLeaveWithinTTL(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out real lease TTLs: seconds")
	}
	t.Parallel()
	e := etcdtest.New(t)
	m := start(t, e.Client)
	ctx := etcdtest.Context(t)
	r := watchEndpoints(t, ctx, m)
	checkAddrs(t, "initial", r.next(t, 5*time.Second))

	kctx, stop := context.WithCancel(ctx)
	defer stop()
	mustRenew(t, ctx, m, "10.5.0.1", 1)
	go func() { // the live API server
		tick := time.NewTicker(time.Second / 3)
		defer tick.Stop()
		for {
			select {
			case <-kctx.Done():
				return
			case <-tick.C:
				if _, err := m.Renew(kctx, "10.5.0.1", 1); err != nil && kctx.Err() == nil {
					t.Errorf("Renew(live) = %v", err)
				}
			}
		}
	}()
	checkAddrs(t, "after Renew(live)", r.next(t, 5*time.Second), "10.5.0.1")
	mustRenew(t, ctx, m, "10.5.0.2", 1)
	acked := time.Now()
	checkAddrs(t, "after Renew(dead)", r.next(t, 5*time.Second), "10.5.0.1", "10.5.0.2")
	got := r.next(t, 5*time.Second)
	took := time.Since(acked)
	checkAddrs(t, "after the dead lease expired", got, "10.5.0.1")
	t.Logf("a 1s lease left WatchEndpoints %v after its last Renew", took)
	if took > 3*time.Second {
		t.Errorf("dead lease left WatchEndpoints after %v; want <= TTL + 2s = 3s", took)
	}
	ls, _, err := m.List(ctx)
	if err != nil || len(ls) != 1 || ls[0].IP != netip.MustParseAddr("10.5.0.1") {
		t.Errorf("List() = %v, %v; want the live lease only", ls, err)
	}
}

// TestSlowWatcher: a watcher whose send blocks holds up neither the Manager nor other
// watchers, and when it unblocks it gets the latest state, once.
func TestSlowWatcher(t *testing.T) {
	t.Parallel()
	e := etcdtest.New(t)
	m := start(t, e.Client)
	ctx := etcdtest.Context(t)

	release := make(chan struct{})
	slow := make(chan Endpoints, 100)
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- m.WatchEndpoints(sctx, func(e Endpoints) error {
			slow <- e
			<-release
			return nil
		})
	}()
	defer func() { cancel(); <-done }()
	checkAddrs(t, "slow watcher's first message", <-slow)

	fast := watchEndpoints(t, ctx, m)
	fast.next(t, 5*time.Second)
	for _, ip := range []string{"10.6.0.1", "10.6.0.2", "10.6.0.3"} {
		mustRenew(t, ctx, m, ip, 30)
		fast.next(t, 5*time.Second)
	}
	if _, err := m.Endpoints(ctx); err != nil {
		t.Fatalf("Endpoints() with a blocked watcher = %v", err)
	}
	close(release)
	select {
	case got := <-slow:
		checkAddrs(t, "slow watcher after unblocking", got, "10.6.0.1", "10.6.0.2", "10.6.0.3")
	case <-time.After(5 * time.Second):
		t.Fatal("slow watcher got nothing after unblocking")
	}
	mustRenew(t, ctx, m, "10.6.0.4", 30)
	select {
	case got := <-slow:
		checkAddrs(t, "slow watcher's next message", got, "10.6.0.1", "10.6.0.2", "10.6.0.3", "10.6.0.4")
	case <-time.After(5 * time.Second):
		t.Fatal("slow watcher got nothing after a change")
	}
}

func TestNotReady(t *testing.T) {
	t.Parallel()
	e := etcdtest.New(t)
	m := newStopped(t, e.Client)
	m.syncTimeout = 200 * time.Millisecond
	ctx := etcdtest.Context(t)
	if _, err := m.Endpoints(ctx); !errors.Is(err, ErrNotReady) {
		t.Errorf("Endpoints() without Run = %v; want ErrNotReady", err)
	}

	rctx, stop := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- m.Run(rctx) }()
	if _, err := m.Endpoints(ctx); err != nil {
		t.Fatalf("Endpoints() with Run = %v", err)
	}
	// Writes outside the prefix move etcd's revision past the watch's last event: the
	// read must catch up through a progress notification, within the sync timeout.
	for range 3 {
		if _, err := e.Client.Put(ctx, "/elsewhere", "x"); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Endpoints(ctx); err != nil {
			t.Fatalf("Endpoints() after a write elsewhere = %v", err)
		}
	}
	if err := m.Run(ctx); err == nil {
		t.Errorf("second Run() = nil; want an error")
	}
	wdone := make(chan error, 1)
	first := make(chan struct{})
	go func() {
		wdone <- m.WatchEndpoints(ctx, func(Endpoints) error { close(first); return nil })
	}()
	<-first
	stop()
	if err := <-runDone; err != nil {
		t.Errorf("Run() = %v; want nil after its context ended", err)
	}
	if err := <-wdone; !errors.Is(err, ErrNotReady) {
		t.Errorf("WatchEndpoints() after Run stopped = %v; want ErrNotReady", err)
	}
	if _, err := m.Endpoints(ctx); !errors.Is(err, ErrNotReady) {
		t.Errorf("Endpoints() after Run stopped = %v; want ErrNotReady", err)
	}
}

// TestProgressBesideAFutureWatch: another watch on the same client, opened from the
// revision after the current one (as every list-then-watch loop does), must not keep
// the Manager from catching up with writes outside its prefix. etcd drops progress
// requests on a stream holding such a watch, so the Manager's watch has its own stream.
func TestProgressBesideAFutureWatch(t *testing.T) {
	t.Parallel()
	e := etcdtest.New(t)
	m := start(t, e.Client)
	m.syncTimeout = time.Second
	ctx := etcdtest.Context(t)
	if _, err := m.Endpoints(ctx); err != nil {
		t.Fatalf("Endpoints() = %v", err)
	}
	resp, err := e.Client.Put(ctx, "/elsewhere", "x")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	_ = e.Client.Watch(wctx, "/other/", clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	if _, err := m.Endpoints(ctx); err != nil {
		t.Fatalf("Endpoints() beside a watch from the next revision = %v", err)
	}
}
