package masterlease

import (
	"context"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// renewer renews one lease every TTL/3 in its own goroutine, as client.LeaseKeeper
// does: each attempt bounded by TTL/3, the next one TTL/3 after the start of a
// successful one, and a failed one retried after retryAfter.
type renewer struct {
	ip   string
	ttl  time.Duration
	stop chan struct{} // closed to stop, honoured after a successful renewal
	done chan struct{} // closed when the goroutine is over
	next atomic.Int64  // unix nanoseconds of the next attempt

	// Read after done.
	lastAck    time.Time // the last acknowledged renewal
	ok, failed int
	maxGap     time.Duration // longest time between two acknowledged renewals
	maxFailing time.Duration // longest run of failures, from the first failed start to the next ack
	maxTook    time.Duration // longest successful Renew call
	ids        []clientv3.LeaseID
	errs       []error
}

const retryAfter = 50 * time.Millisecond

func startRenewer(t *testing.T, ctx context.Context, m *Manager, ip string, ttl time.Duration) *renewer {
	t.Helper()
	first := mustRenew(t, ctx, m, ip, int64(ttl/time.Second))
	r := &renewer{ip: ip, ttl: ttl, stop: make(chan struct{}), done: make(chan struct{}),
		lastAck: time.Now(), ok: 1, ids: []clientv3.LeaseID{first.ID}}
	go r.run(ctx, m)
	t.Cleanup(r.halt)
	return r
}

func (r *renewer) run(ctx context.Context, m *Manager) {
	defer close(r.done)
	interval := r.ttl / 3
	next := time.Now().Add(interval)
	var failingSince time.Time
	for {
		r.next.Store(next.UnixNano())
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, interval)
		l, err := m.Renew(rctx, r.ip, int64(r.ttl/time.Second))
		cancel()
		if err != nil {
			r.failed++
			r.errs = append(r.errs, err)
			if failingSince.IsZero() {
				failingSince = start
			}
			next = time.Now().Add(retryAfter)
			continue
		}
		now := time.Now()
		r.ok++
		r.maxTook = max(r.maxTook, now.Sub(start))
		r.maxGap = max(r.maxGap, now.Sub(r.lastAck))
		if !failingSince.IsZero() {
			r.maxFailing = max(r.maxFailing, now.Sub(failingSince))
			failingSince = time.Time{}
		}
		r.lastAck = now
		if !slices.Contains(r.ids, l.ID) {
			r.ids = append(r.ids, l.ID)
		}
		select {
		case <-r.stop:
			return
		default:
		}
		next = start.Add(interval)
	}
}

// halt stops the renewer after its next successful renewal and waits for it.
func (r *renewer) halt() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
}

// TestRenewThroughLeaderChange renews two 2 s leases every TTL/3 for 10 x TTL on a
// three-member etcd while the leader crashes, comes back, and the next leader crashes
// too: neither key is ever deleted, both keep their etcd lease, and the endpoints
// never lose an address. Then one lease is no longer renewed: it still expires, and
// leaves the endpoints, within TTL + 2 s + the election timeout.
func TestRenewThroughLeaderChange(t *testing.T) {
	if os.Getenv("ALLOCD_FAULT_TESTS") == "" {
		// 28 s of leader crashes, with a timing margin that a loaded machine can eat:
		// a fault run, not part of `make test`.
		t.Skip("fault test: run `make fault` (ALLOCD_FAULT_TESTS=1)")
	}
	t.Parallel()
	const (
		ttl      = 2 * time.Second
		election = 100 * time.Millisecond // etcdtest's election timeout
		ipA      = "10.8.0.1"             // renewed all along
		ipB      = "10.8.0.2"             // renewed through the leader changes, then not
	)
	c := etcdtest.NewCluster(t, 3)
	m := start(t, c.Client)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began := time.Now()

	// Every endpoints message, with the time it came.
	type epsAt struct {
		at  time.Time
		eps Endpoints
	}
	var (
		mu     sync.Mutex
		epsLog []epsAt
	)
	wctx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan error, 1)
	go func() {
		watchDone <- m.WatchEndpoints(wctx, func(e Endpoints) error {
			mu.Lock()
			epsLog = append(epsLog, epsAt{time.Now(), e})
			mu.Unlock()
			return nil
		})
	}()
	defer func() { stopWatch(); <-watchDone }()

	a := startRenewer(t, ctx, m, ipA, ttl)
	b := startRenewer(t, ctx, m, ipB, ttl)
	createA, createB := keyCreated(t, ctx, c.Client, ipA), keyCreated(t, ctx, c.Client, ipB)
	etcdtest.WaitFor(t, 5*time.Second, "both addresses in the endpoints", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(epsLog) > 0 && len(epsLog[len(epsLog)-1].eps.Addresses) == 2
	})
	watchFrom := time.Now()

	// Every delete under the prefix from now on (the client's watch resumes on another
	// member when its member goes, without losing events).
	type deletion struct {
		key string
		rev int64
	}
	deletes := make(chan deletion, 16)
	dctx, stopDeletes := context.WithCancel(ctx)
	defer stopDeletes()
	rev := max(createA, createB)
	dch := c.Client.Watch(dctx, testPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	go func() {
		for resp := range dch {
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					deletes <- deletion{string(ev.Kv.Key), ev.Kv.ModRevision}
				}
			}
		}
		close(deletes)
	}()

	// The leader changes: crash the leader, bring it back, crash the next one, bring
	// it back, all while the renewers run, for 10 x TTL in all.
	pause := func(d time.Duration) {
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
	var elections []time.Duration // from the crash of a leader until a new one leads
	for range 2 {
		pause(ttl)
		// Crash the leader just before A's next renewal, so that it meets the election.
		pause(time.Until(time.Unix(0, a.next.Load())) - 20*time.Millisecond)
		old := c.Leader()
		t0 := time.Now()
		c.StopMember(old)
		now := c.Leader()
		elections = append(elections, time.Since(t0).Round(time.Millisecond))
		t.Logf("%v: crashed leader m%d; m%d leads after %v", time.Since(began).Round(time.Millisecond), old,
			now, elections[len(elections)-1])
		if now == old {
			t.Fatalf("Leader() = %d after stopping it", now)
		}
		pause(2 * ttl)
		c.StartMember(old)
		t.Logf("%v: m%d back", time.Since(began).Round(time.Millisecond), old)
	}
	pause(time.Until(watchFrom.Add(10 * ttl)))

	// B is renewed no more; A carries on.
	b.halt()
	stoppedB := b.lastAck
	t.Logf("%v: renewals of %s stopped; leader m%d", time.Since(began).Round(time.Millisecond), ipB,
		c.Leader())
	var goneB time.Time
	etcdtest.WaitFor(t, 3*ttl, "the unrenewed lease to expire", func() bool {
		resp, err := c.Client.Get(ctx, testPrefix+ipB, clientv3.WithCountOnly())
		if err == nil && resp.Count == 0 {
			goneB = time.Now()
			return true
		}
		return false
	})
	limit := ttl + 2*time.Second + election
	took := goneB.Sub(stoppedB)
	t.Logf("the unrenewed lease expired %v after its last renewal (TTL + %v)", took, took-ttl)
	if took < ttl || took > limit {
		t.Errorf("expiry of the unrenewed %v lease took %v; want within [%v, %v]", ttl, took, ttl, limit)
	}
	etcdtest.WaitFor(t, max(time.Until(stoppedB.Add(limit)), 0)+200*time.Millisecond,
		"the endpoints to drop "+ipB,
		func() bool {
			mu.Lock()
			defer mu.Unlock()
			return slices.Equal(epsLog[len(epsLog)-1].eps.Addresses, addrs(ipA))
		})
	a.halt()
	stopDeletes()

	// Neither key was deleted through the leader changes; B once, when it expired.
	var got []deletion
	for d := range deletes {
		got = append(got, d)
	}
	if want := []string{testPrefix + ipB}; len(got) != 1 || got[0].key != want[0] {
		t.Errorf("deletes under the prefix = %v; want only %v, when it expired", got, want)
	}
	if now := keyCreated(t, ctx, c.Client, ipA); now != createA {
		t.Errorf("key of %s created at revision %d; want %d: it was deleted and written again", ipA, now,
			createA)
	}
	for _, r := range []*renewer{a, b} {
		if len(r.ids) != 1 {
			t.Errorf("etcd leases of %s = %v; want one, kept through the leader changes", r.ip, r.ids)
		}
		t.Logf(
			"%s: %d renewals, %d failed (longest failing %v), slowest %v, longest between acks %v (TTL %v)",
			r.ip, r.ok, r.failed, r.maxFailing.Round(time.Millisecond), r.maxTook.Round(time.Millisecond),
			r.maxGap.Round(time.Millisecond), r.ttl)
		for i, err := range r.errs {
			if i < 5 {
				t.Logf("  %s renew failed: %v", r.ip, err)
			}
		}
		if r.maxGap >= r.ttl {
			t.Errorf("%s: %v between two acknowledged renewals; want < TTL %v", r.ip, r.maxGap, r.ttl)
		}
	}

	// The endpoints, from the moment both were in, always listed both, until B expired.
	mu.Lock()
	defer mu.Unlock()
	both, onlyA := addrs(ipA, ipB), addrs(ipA)
	for _, e := range epsLog {
		if e.at.Before(watchFrom) {
			continue
		}
		switch {
		case slices.Equal(e.eps.Addresses, both) && e.at.Before(goneB.Add(time.Second)):
		case slices.Equal(e.eps.Addresses, onlyA) && !e.at.Before(stoppedB.Add(ttl)):
		default:
			t.Errorf("endpoints at %v = %v; want %v until %s expired, then %v",
				e.at.Sub(began).Round(time.Millisecond), e.eps.Addresses, both, ipB, onlyA)
		}
	}
	t.Logf("elections took %v; %d endpoints messages", elections, len(epsLog))
}

// keyCreated returns the create revision of ip's lease key, failing the test if the key
// is missing.
func keyCreated(t *testing.T, ctx context.Context, cli *clientv3.Client, ip string) int64 {
	t.Helper()
	resp, err := cli.Get(ctx, testPrefix+ip)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("Get(%s) = %v, %v; want the key", testPrefix+ip, resp, err)
	}
	return resp.Kvs[0].CreateRevision
}
