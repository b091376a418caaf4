package leader_test

import (
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// TestLeaderFollowsChanges: the replicas name the leader from their watch of the
// election, without a read of etcd, through every way a term ends: a leader killed
// (its lease expires), a leader whose session is revoked, a leader that resigns. At each
// step they name the replica etcd names (the key with the lowest CreateRevision), and
// that replica's term runs.
func TestLeaderFollowsChanges(t *testing.T) {
	e := etcdtest.New(t)
	kill := campaign(t, e, "10.0.0.9:8080")
	var rs []*replica
	for i, id := range []string{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"} {
		rs = append(rs, start(t, e, id))
		waitCandidates(t, e, i+2) // each campaigns after the one before: the order of succession
	}
	a, b, c := rs[0], rs[1], rs[2]
	follows(t, e, "10.0.0.9:8080", rs...)
	reads := make([]int64, len(rs))
	for i, r := range rs {
		reads[i] = r.el.Reads()
	}

	kill() // its keepalive stops, as when its process dies: its lease expires
	follows(t, e, a.el.Identity(), rs...)
	revoke(t, e, a) // its key goes at once; a campaigns again, after c
	follows(t, e, b.el.Identity(), rs...)
	b.stop() // resigns
	follows(t, e, c.el.Identity(), a, c)

	for i, r := range rs {
		if got := r.el.Reads() - reads[i]; got != 0 {
			t.Errorf("%s read the leader from etcd %d times after its watch listed; want 0",
				r.el.Identity(), got)
		}
	}
}

// TestLeaderRelistsAfterCompaction: a replica cut off etcd while the leader changes, and
// the history its watch would resume from compacted meanwhile, lists the election
// again when it reconnects and names the new leader.
func TestLeaderRelistsAfterCompaction(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	a := start(t, e, "10.0.0.1:8080")
	etcdtest.WaitFor(t, 10*time.Second, "a to lead", a.el.IsLeader)
	b := start(t, e, "10.0.0.2:8080")
	waitCandidates(t, e, 2)
	rl := newRelay(t, strings.TrimPrefix(e.Endpoint, "http://"))
	// A lease that outlives the cut: o stays a candidate behind b.
	o := startWith(t, relayedClient(t, rl), "10.0.0.5:8080", time.Minute)
	waitCandidates(t, e, 3)
	follows(t, e, a.el.Identity(), a, b, o)
	lists := o.el.Lists()

	rl.cut()
	a.stop()
	follows(t, e, b.el.Identity(), b)
	for range 3 {
		if _, err := e.Client.Put(ctx, "/other", "x"); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := e.Client.Get(ctx, "/other")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	rl.restore()
	follows(t, e, b.el.Identity(), b, o)
	if got := o.el.Lists(); got <= lists {
		t.Errorf("o's watch listed %d times after the compaction, %d before; want a listing more", got, lists)
	}
}

// follows waits until etcd names want as the leader, want's term runs, and every
// replica of rs names want, from its watch's view and from Leader.
func follows(t *testing.T, e *etcdtest.Server, want string, rs ...*replica) {
	t.Helper()
	ctx := etcdtest.Context(t)
	var last string
	ok := etcdtest.Eventually(20*time.Second, func() bool {
		resp, err := e.Client.Get(ctx, prefix+"/", clientv3.WithFirstCreate()...)
		if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != want {
			last = "etcd does not name it yet"
			return false
		}
		for _, r := range rs {
			me := r.el.Identity() == want
			if me && !r.el.IsLeader() {
				last = want + "'s term has not started"
				return false
			}
			viewed, known := r.el.Viewed()
			id, self, err := r.el.Leader(ctx)
			if (!me && (!known || viewed != want)) || err != nil || id != want || self != me {
				last = r.el.Identity() + " views " + viewed + ", Leader() = " + id + ", " +
					strconv.FormatBool(self)
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("waiting for every replica to follow leader %s: %s", want, last)
	}
}

// campaign makes id a candidate through a session of its own, as a replica does, and
// returns a kill of that replica: its keepalive stops, the key stays until its lease
// expires.
func campaign(t *testing.T, e *etcdtest.Server, id string) (kill func()) {
	t.Helper()
	s, err := concurrency.NewSession(e.NewClient(), concurrency.WithTTL(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Orphan)
	if err := concurrency.NewElection(s, prefix).Campaign(etcdtest.Context(t), id); err != nil {
		t.Fatal(err)
	}
	return s.Orphan
}

// waitCandidates waits until the election has n keys.
func waitCandidates(t *testing.T, e *etcdtest.Server, n int) {
	t.Helper()
	ctx := etcdtest.Context(t)
	etcdtest.WaitFor(t, 10*time.Second, strconv.Itoa(n)+" candidates", func() bool {
		resp, err := e.Client.Get(ctx, prefix+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == int64(n)
	})
}

// revoke revokes the election lease of r's running term (its key names the lease).
func revoke(t *testing.T, e *etcdtest.Server, r *replica) {
	t.Helper()
	fs := r.fences()
	id, err := strconv.ParseInt(strings.TrimPrefix(fs[len(fs)-1].Key, prefix+"/"), 16, 64)
	if err != nil {
		t.Fatalf("lease of fence %v: %v", fs[len(fs)-1], err)
	}
	if _, err := e.Client.Revoke(etcdtest.Context(t), clientv3.LeaseID(id)); err != nil {
		t.Fatal(err)
	}
}

// relay is a TCP relay on loopback to etcd that a test cuts (every connection closed,
// new ones refused) and restores: a replica cut off etcd.
type relay struct {
	t      *testing.T
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener // nil while cut
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newRelay(t *testing.T, target string) *relay {
	r := &relay{t: t, addr: etcdtest.FreeAddr(t), target: target, conns: map[net.Conn]struct{}{}}
	r.restore()
	t.Cleanup(func() { r.cut(); r.wg.Wait() })
	return r
}

// restore listens again: clients reconnect.
func (r *relay) restore() {
	ln, err := net.Listen("tcp", r.addr)
	if err != nil {
		r.t.Fatalf("relay listen %s: %v", r.addr, err)
	}
	r.mu.Lock()
	r.ln = ln
	r.mu.Unlock()
	r.wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", r.target)
			if err != nil {
				in.Close()
				continue
			}
			r.mu.Lock()
			live := r.ln == ln
			if live {
				r.conns[in], r.conns[out] = struct{}{}, struct{}{}
			}
			r.mu.Unlock()
			if !live {
				in.Close()
				out.Close()
				continue
			}
			r.wg.Go(func() { io.Copy(out, in); out.Close(); in.Close() })
			r.wg.Go(func() { io.Copy(in, out); in.Close(); out.Close() })
		}
	})
}

// cut closes the listener and every relayed connection.
func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != nil {
		r.ln.Close()
		r.ln = nil
	}
	for c := range r.conns {
		c.Close()
	}
	clear(r.conns)
}

// relayedClient is an etcd client through rl, closed by t.Cleanup.
func relayedClient(t *testing.T, rl *relay) *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{rl.addr}, DialTimeout: 5 * time.Second,
		Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
