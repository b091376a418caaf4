package masterlease

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// TestStaleLeaderRevokes is make fault's master-lease violation in three etcd
// processes (etcd's default timing: 100 ms ticks, 1 s election timeout). Leases of a
// 3 s TTL are renewed through the followers; one renewal is held back (as by an allocd
// that was killed), the etcd leader is stopped (SIGSTOP) for 2.5 s and resumed. The
// renewals came in time: the last before the stop and the first through the new
// leader less than the TTL apart, the last 200 ms before the resumption. But the
// resumed leader's lessor saw only the renewal before the stop, and it revokes the
// leases its clock says expired, before it learns it no longer leads (etcd's guard
// looks only when its raft ticks lagged; a resumed process ticks at once). The race
// is etcd's: in most trials no lease goes (1 in 6 to 12 here), so the test runs
// trials until one revokes some.
// Every key etcd deleted is written again within restoreWithin, without waiting for a
// renewal, and its address never leaves the endpoints nor List.
func TestStaleLeaderRevokes(t *testing.T) {
	if os.Getenv("ALLOCD_FAULT_TESTS") == "" {
		t.Skip("fault test: run `make fault` (ALLOCD_FAULT_TESTS=1)")
	}
	const (
		ttl           = 3 // seconds
		held          = 800 * time.Millisecond
		pause         = 2500 * time.Millisecond
		restoreWithin = 500 * time.Millisecond
		trials        = 25
	)
	c := etcdtest.NewCluster(t, 3, etcdtest.Processes(), etcdtest.Timing(100, 1000))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for trial := range trials {
		st := staleTrial{c: c, ttl: ttl, held: held, pause: pause,
			prefix: fmt.Sprintf("%strial%d/", testPrefix, trial)}
		st.run(t, ctx)
		n := 0
		for _, d := range st.deletes {
			since := d.at.Sub(st.lastAck[d.ip])
			t.Logf("  %s deleted at revision %d, %v after the resumption, %v after its last renewal (TTL "+
				"%ds); written again after %v", d.ip, d.rev, d.at.Sub(st.resumed).Round(time.Millisecond),
				since.Round(time.Millisecond), ttl, d.back.Round(time.Millisecond))
			if since >= ttl*time.Second-time.Second {
				// A loaded machine held the renewals back: the lease may have expired.
				t.Logf("  %s: not renewed in time; not checked", d.ip)
				continue
			}
			n++
			if d.back < 0 || d.back > restoreWithin {
				t.Errorf("%s: written again %v after the delete; want within %v", d.ip, d.back, restoreWithin)
			}
		}
		t.Logf("trial %d: stopped leader m%d; etcd revoked %d of %d leases renewed in time when it resumed",
			trial, st.leader, n, len(st.ips))
		if len(st.deletes) > 0 {
			var rs []string
			for _, r := range []string{"restored", "superseded", "expired", "nospace", "deleted",
				"canceled"} {
				n := st.restores["allocd_masterlease_restores_total{result="+r+"}"]
				rs = append(rs, fmt.Sprintf("%s=%v", r, n))
			}
			t.Logf("trial %d: restores by result: %s", trial, strings.Join(rs, " "))
		}
		for what, ms := range st.missing {
			t.Errorf("trial %d: %s missing from %s %d times, %v to %v after the resumption", trial,
				what[:strings.Index(what, " ")], what[strings.Index(what, " ")+1:], ms.n,
				ms.first.Sub(st.resumed).Round(time.Millisecond),
				ms.last.Sub(st.resumed).Round(time.Millisecond))
		}
		if n > 0 || t.Failed() {
			return
		}
	}
	if !t.Failed() {
		t.Skipf("etcd revoked no renewed lease in %d trials: nothing to check", trials)
	}
}

// staleTrial is one trial of TestStaleLeaderRevokes, on its own key prefix.
type staleTrial struct {
	c                 *etcdtest.Cluster
	ttl               int64
	held, pause       time.Duration
	prefix            string
	ips               []string
	leader            int
	resumed           time.Time
	mu                sync.Mutex
	lastAck           map[string]time.Time
	deletes           []staleDelete
	missing           map[string]*missed // "<ip> from the endpoints" or "<ip> from a List"
	stopLists, listed chan struct{}
	restores          map[string]float64 // the Manager's metrics at the trial's end
}

// logWriter writes the Manager's log lines to t.Log while the trial's Manager runs
// (logging after the test ends panics).
type logWriter struct {
	t    *testing.T
	mu   sync.Mutex
	done bool
}

// Write logs b, one slog record, unless stop was called.
func (w *logWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSuffix(string(b), "\n"))
	}
	return len(b), nil
}

// stop ends the logging: the Manager has returned, the trial may end.
func (w *logWriter) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
}

// missed is how often, and from when to when, the checks found an address missing.
type missed struct {
	n           int
	first, last time.Time
}

type staleDelete struct {
	ip   string
	rev  int64
	at   time.Time
	back time.Duration // -1 until the key is written again
}

// run makes one trial: the deletes and misses are in st.
func (st *staleTrial) run(t *testing.T, ctx context.Context) {
	st.leader = st.c.Leader()
	var followers []string
	for i, ep := range st.c.Endpoints {
		if i != st.leader {
			followers = append(followers, ep)
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: followers, DialTimeout: 5 * time.Second,
		Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	defer cli.Close()
	// The Manager's decisions (debug and up) and its restores by result, to read when
	// a key is not written again.
	lw := &logWriter{t: t}
	reg := prometheus.NewRegistry()
	m := newStopped(t, cli, func(c *Config) {
		c.Prefix = st.prefix
		c.Logger = slog.New(slog.NewTextHandler(lw, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.Registerer = reg
	})
	mctx, stopManager := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- m.Run(mctx) }()
	defer func() {
		stopManager()
		<-runDone
		lw.stop()
		st.restores = gather(t, reg)
	}()

	st.lastAck, st.missing = map[string]time.Time{}, map[string]*missed{}
	for i := range 8 {
		ip := fmt.Sprintf("10.9.2.%d", i+1)
		st.ips = append(st.ips, ip)
		mustRenew(t, ctx, m, ip, st.ttl)
		st.lastAck[ip] = time.Now()
	}
	etcdtest.WaitFor(t, 5*time.Second, "the endpoints", func() bool {
		e, err := m.Endpoints(ctx)
		return err == nil && len(e.Addresses) == len(st.ips)
	})
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watchDone := st.watch(wctx, cli, m)
	defer func() { stopWatch(); <-watchDone }()

	time.Sleep(st.held) // the renewal an allocd killed held back
	st.c.PauseMember(st.leader)
	paused := time.Now()
	st.renewUntil(ctx, m, paused.Add(st.pause-200*time.Millisecond))
	time.Sleep(time.Until(paused.Add(st.pause)))
	st.c.ResumeMember(st.leader)
	st.resumed = time.Now()
	// No renewal for a while: a key etcd deleted comes back only by its restore. The
	// members' raft state meanwhile: a member whose committed index lags serves the
	// Manager's watch and writes late.
	st.logMembers(t, ctx, st.resumed.Add(time.Second))
	time.Sleep(time.Until(st.resumed.Add(time.Second)))
}

// logMembers logs, about every 100 ms until end, each member's leader, term, and
// committed and applied raft index.
func (st *staleTrial) logMembers(t *testing.T, ctx context.Context, end time.Time) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: st.c.Endpoints, DialTimeout: time.Second,
		Logger: zap.NewNop()})
	if err != nil {
		t.Logf("  member status: %v", err)
		return
	}
	defer cli.Close()
	for time.Now().Before(end) {
		next := time.Now().Add(100 * time.Millisecond)
		for i, ep := range st.c.Endpoints {
			sctx, cancel := context.WithTimeout(ctx, 80*time.Millisecond)
			s, err := cli.Status(sctx, ep)
			cancel()
			at := time.Since(st.resumed).Round(time.Millisecond)
			if err != nil {
				t.Logf("  %v after the resumption: m%d: %v", at, i, err)
				continue
			}
			t.Logf("  %v after the resumption: m%d (%x): leader %x, term %d, committed %d, applied %d", at, i,
				s.Header.MemberId, s.Leader, s.RaftTerm, s.RaftIndex, s.RaftAppliedIndex)
		}
		time.Sleep(time.Until(next))
	}
}

// renewUntil renews every address every 200 ms, each in its own goroutine (a renewal
// waits for the election), until end.
func (st *staleTrial) renewUntil(ctx context.Context, m *Manager, end time.Time) {
	var wg sync.WaitGroup
	for _, ip := range st.ips {
		wg.Go(func() {
			for time.Now().Before(end) {
				rctx, cancel := context.WithDeadline(ctx, end)
				_, err := m.Renew(rctx, ip, st.ttl)
				cancel()
				if err == nil {
					st.mu.Lock()
					st.lastAck[ip] = time.Now()
					st.mu.Unlock()
				}
				time.Sleep(200 * time.Millisecond)
			}
		})
	}
	wg.Wait()
}

// watch records every delete of a lease key and when it is written again, and checks,
// every 20 ms, that the endpoints and a List have every address, until ctx ends; the
// returned channel is closed then.
func (st *staleTrial) watch(ctx context.Context, cli *clientv3.Client, m *Manager) chan struct{} {
	done := make(chan struct{})
	wch := cli.Watch(ctx, st.prefix, clientv3.WithPrefix())
	var wg sync.WaitGroup
	wg.Go(func() {
		for resp := range wch {
			now := time.Now()
			st.mu.Lock()
			for _, ev := range resp.Events {
				ip, ok := m.parseKey(string(ev.Kv.Key))
				switch {
				case !ok:
				case ev.Type == mvccpb.DELETE:
					st.deletes = append(st.deletes,
						staleDelete{ip: ip.String(), rev: ev.Kv.ModRevision, at: now, back: -1})
				default:
					for i := range st.deletes {
						if d := &st.deletes[i]; d.ip == ip.String() && d.back < 0 {
							d.back = now.Sub(d.at)
						}
					}
				}
			}
			st.mu.Unlock()
		}
	})
	wg.Go(func() {
		for ctx.Err() == nil {
			st.check(ctx, m)
			time.Sleep(20 * time.Millisecond)
		}
	})
	go func() { wg.Wait(); close(done) }()
	return done
}

// check counts the addresses missing from the endpoints or from a List.
func (st *staleTrial) check(ctx context.Context, m *Manager) {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ls, _, lerr := m.List(cctx)
	eps, eerr := m.Endpoints(cctx)
	if lerr != nil || eerr != nil {
		return // etcd without a leader: nothing to read
	}
	now := time.Now()
	st.mu.Lock()
	defer st.mu.Unlock()
	miss := func(what string) {
		ms := st.missing[what]
		if ms == nil {
			ms = &missed{first: now}
			st.missing[what] = ms
		}
		ms.n, ms.last = ms.n+1, now
	}
	for _, ip := range st.ips {
		a := addrs(ip)[0]
		if now.Sub(st.lastAck[ip]) >= time.Duration(st.ttl)*time.Second-time.Second {
			continue // not renewed in time: it may go
		}
		if !slices.Contains(eps.Addresses, a) {
			miss(ip + " the endpoints")
		}
		if !slices.ContainsFunc(ls, func(l Lease) bool { return l.IP == a }) {
			miss(ip + " a List")
		}
	}
}
