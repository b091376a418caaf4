package allocator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// A retry of an Allocate that committed (the caller could not tell) must replay,
// even when that allocation took the last free address: the retry then finds the
// range full before it could pick anything.
func TestRetryReplaysAfterRangeFilled(t *testing.T) {
	tests := []struct {
		name string
		req  Request
		fill Request
	}{
		{"ClusterIP", Request{}, Request{}},
		{"ClusterIP and NodePort", Request{NodePortCount: 1}, Request{NoClusterIP: true, NodePortCount: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := etcdtest.New(t)
			cfg := testConfig("10.0.0.0/29")
			cfg.NodePortRange = PortRange{Base: 30000, Size: 8}
			a := start(t, e.Client, cfg)
			ctx := etcdtest.Context(t)
			req := tc.req
			req.Owner = owner("u-retry")
			first, err := a.Allocate(ctx, req)
			if err != nil {
				t.Fatalf("Allocate(%+v) = %v", req, err)
			}
			// Fill the rest: 6 usable addresses, 8 ports.
			for i := 0; ; i++ {
				f := tc.fill
				f.Owner = owner("filler-" + string(rune('a'+i)))
				_, err := a.Allocate(ctx, f)
				if errors.Is(err, ErrFull) {
					break
				}
				if err != nil {
					t.Fatalf("fill: Allocate(%+v) = %v", f, err)
				}
			}
			again, err := a.Allocate(ctx, req)
			if err != nil || !again.Replayed || !slices.Equal(again.ClusterIPs, first.ClusterIPs) ||
				!slices.Equal(again.NodePorts, first.NodePorts) {
				t.Errorf("Allocate(%+v) again = %+v, %v; want the replay of %+v", req, again, err, first)
			}
			// A different request of the same owner still fails: the range is full.
			other := req
			other.NodePortCount++
			if res, err := a.Allocate(ctx, other); !errors.Is(err, ErrFull) {
				t.Errorf("Allocate(%+v) = %+v, %v; want ErrFull", other, res, err)
			}
		})
	}
}

// hookKV runs hook once, right after the n-th transaction (counted from when it is
// armed) returns. Transactions the hook makes are not counted.
type hookKV struct {
	clientv3.KV
	mu     sync.Mutex
	armed  bool
	inHook bool
	n, at  int
	hook   func()
	fired  bool
}

type hookTxn struct {
	clientv3.Txn
	fire func()
}

func (t *hookTxn) If(c ...clientv3.Cmp) clientv3.Txn  { t.Txn = t.Txn.If(c...); return t }
func (t *hookTxn) Then(o ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(o...); return t }
func (t *hookTxn) Else(o ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(o...); return t }
func (t *hookTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	t.fire()
	return resp, err
}

func (h *hookKV) Txn(ctx context.Context) clientv3.Txn {
	h.mu.Lock()
	defer h.mu.Unlock()
	fire := func() {}
	if h.armed && !h.inHook {
		h.n++
		if h.n == h.at {
			fire = func() {
				h.mu.Lock()
				h.inHook = true
				h.mu.Unlock()
				h.hook()
				h.mu.Lock()
				h.inHook, h.fired = false, true
				h.mu.Unlock()
			}
		}
	}
	return &hookTxn{Txn: h.KV.Txn(ctx), fire: fire}
}

func (h *hookKV) arm(at int, hook func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed, h.n, h.at, h.hook = true, 0, at, hook
}

func (h *hookKV) disarm() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed = false
}

// An owner asks again for a specific address it holds. The first transaction fails
// on that address's key, the read-back finds the owner holding it; before the next
// round the address is released. The next round must not trust the read-back: the
// owner must end up holding the address in etcd (created again), never be told it
// holds an address that has no key (which another owner could then take).
func TestHeldPickRechecked(t *testing.T) {
	x := netip.MustParseAddr("10.0.0.77")
	tests := []struct {
		name string
		call func(ctx context.Context, a *Allocator, u Owner) error
	}{
		{"Allocate", func(ctx context.Context, a *Allocator, u Owner) error {
			res, err := a.Allocate(ctx, Request{Owner: u, ClusterIPs: []netip.Addr{x}, NodePortCount: 1})
			if err == nil && !slices.Equal(res.ClusterIPs, []netip.Addr{x}) {
				t.Errorf("Allocate(%v + 1 port) = %+v; want %v", x, res, x)
			}
			return err
		}},
		{"Assign", func(ctx context.Context, a *Allocator, u Owner) error {
			al, err := a.Assign(ctx, u, IP(x))
			if err == nil && (al.Owner != u || al.CreateRevision == 0) {
				t.Errorf("Assign(%v) = %+v; want held by %v", x, al, u)
			}
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := etcdtest.New(t)
			ctx := etcdtest.Context(t)
			cli := e.NewClient()
			h := &hookKV{KV: cli.KV}
			cli.KV = h
			a, err := New(ctx, cli, testConfig("10.0.0.0/24")) // no Run: commitAlone, deterministic
			if err != nil {
				t.Fatal(err)
			}
			u := owner("u")
			if _, err := a.Allocate(ctx, Request{Owner: u, ClusterIPs: []netip.Addr{x}}); err != nil {
				t.Fatal(err)
			}
			// Transaction 1 fails on x's key; transaction 2 reads the keys back and finds
			// u holding x. Then x goes.
			h.arm(2, func() {
				if _, _, err := a.Release(ctx, Owner{}, []Item{IP(x)}, true); err != nil {
					t.Errorf("Release(%v, force) = %v", x, err)
				}
			})
			err = tc.call(ctx, a, u)
			h.disarm()
			if !h.fired {
				t.Fatalf("%s(%v) made fewer than 2 transactions: the release between read-back and retry "+
					"did not happen", tc.name, x)
			}
			if err != nil {
				t.Fatalf("%s(%v) = %v; want nil", tc.name, x, err)
			}
			if al, err := a.Get(ctx, IP(x)); err != nil || al.Owner != u {
				t.Errorf("Get(%v) = %+v, %v; want held by %v in etcd", x, al, err, u)
			}
			page, err := a.ListPage(ctx, ListOptions{OwnerUID: u.UID})
			isX := func(al Allocation) bool { return al.Item == IP(x) }
			if err != nil || !slices.ContainsFunc(page.Allocations, isX) {
				t.Errorf("ListPage(owner %s) = %+v, %v; want %v listed", u.UID, page, err, x)
			}
			if res, err := a.Allocate(ctx,
				Request{Owner: owner("v"), ClusterIPs: []netip.Addr{x}}); !errors.Is(err, ErrAllocated) {
				t.Errorf("Allocate(v, %v) = %+v, %v; want ErrAllocated", x, res, err)
			}
		})
	}
}

// A request of an existing owner, or its retry, does not fail a transaction first:
// the owner record's revision is known from the owner's last commit on this
// replica (and still compared in etcd: a stale one costs one conflict, no more).
func TestExistingOwnerNoConflict(t *testing.T) {
	e := etcdtest.New(t)
	reg := prometheus.NewRegistry()
	cfg := testConfig("10.0.0.0/24")
	cfg.Registerer = reg
	a := start(t, e.Client, cfg)
	ctx := etcdtest.Context(t)
	u := owner("u")
	conflicts := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.Metric {
				if mf.GetName() == "allocd_allocator_commit_transactions_total" && hasLabel(m, "conflict") {
					return m.GetCounter().GetValue()
				}
			}
		}
		return 0 // no conflict yet: the series does not exist
	}
	first, err := a.Allocate(ctx, Request{Owner: u, NodePortCount: 1})
	if err != nil {
		t.Fatal(err)
	}
	more := Request{Owner: u, NoClusterIP: true, NodePortCount: 2}
	second, err := a.Allocate(ctx, more)
	if err != nil || second.Replayed || len(second.NodePorts) != 2 {
		t.Fatalf("Allocate(%+v) = %+v, %v; want 2 new ports", more, second, err)
	}
	if got := conflicts(); got != 0 {
		t.Errorf("conflicting transactions after a second request of an existing owner = %v; want 0", got)
	}
	again, err := a.Allocate(ctx, more)
	if err != nil || !again.Replayed || !slices.Equal(again.NodePorts, second.NodePorts) {
		t.Errorf("Allocate(%+v) again = %+v, %v; want the replay of %v", more, again, err, second.NodePorts)
	}
	if got := conflicts(); got != 0 {
		t.Errorf("conflicting transactions after a retry = %v; want 0", got)
	}

	// Another replica releases everything u holds: the hint is stale, etcd says so.
	b, err := New(ctx, e.NewClient(), testConfig("10.0.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Release(ctx, u, nil, false); err != nil {
		t.Fatal(err)
	}
	third, err := a.Allocate(ctx, more)
	if err != nil || third.Replayed || len(third.NodePorts) != 2 {
		t.Fatalf("Allocate(%+v) after a release elsewhere = %+v, %v; want 2 new ports, not a replay", more,
			third, err)
	}
	if _, _, err := b.Release(ctx, u, nil, false); err != nil {
		t.Fatal(err)
	}
	other := Request{Owner: u, NoClusterIP: true, NodePortCount: 3}
	fourth, err := a.Allocate(ctx, other)
	if err != nil || fourth.Replayed || len(fourth.NodePorts) != 3 {
		t.Fatalf("Allocate(%+v) after a release elsewhere = %+v, %v; want 3 new ports", other, fourth, err)
	}
	page, err := a.ListPage(ctx, ListOptions{OwnerUID: u.UID})
	if err != nil || len(page.Allocations) != 3 {
		t.Errorf("ListPage(owner %s) = %+v, %v; want the 3 new ports only (first had %v)", u.UID,
			page.Allocations, err, first)
	}
	if got := conflicts(); got != 1 {
		t.Errorf("conflicting transactions after a stale hint = %v; want 1", got)
	}
}

// recordHandler keeps the records logged at info and above.
type recordHandler struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recordHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }

// take returns the records logged since the last take, each as its message and its
// attributes (groups flattened to "group.key").
func (h *recordHandler) take() []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]string
	for _, r := range h.recs {
		m := map[string]string{"msg": r.Message}
		var add func(prefix string, a slog.Attr)
		add = func(prefix string, a slog.Attr) {
			if a.Value.Kind() == slog.KindGroup {
				for _, g := range a.Value.Group() {
					add(prefix+a.Key+".", g)
				}
				return
			}
			m[prefix+a.Key] = a.Value.String()
		}
		r.Attrs(func(a slog.Attr) bool { add("", a); return true })
		out = append(out, m)
	}
	h.recs = nil
	return out
}

// Every write is one info line, logged once etcd committed it; replays and no-ops
// log nothing.
func TestWritesLogged(t *testing.T) {
	e := etcdtest.New(t)
	h := &recordHandler{}
	cfg := testConfig("10.0.0.0/24", "fd00::/120")
	cfg.Logger = slog.New(h)
	a := start(t, e.Client, cfg)
	ctx := etcdtest.Context(t)
	if got := h.take(); !slices.ContainsFunc(got, func(m map[string]string) bool {
		return m["msg"] == "assigned" && m["uid"] == KubernetesOwner.UID && m["cluster_ips"] == "10.0.0.1"
	}) {
		t.Errorf("New logged %v; want the kubernetes address assigned", got)
	}
	u, v, w := owner("u"), owner("v"), owner("w")
	req := Request{Owner: u, Policy: RequireDualStack, NodePorts: []int{30100}, NodePortCount: 1}
	var res Result
	var al, before Allocation
	steps := []struct {
		name string
		// do makes the call and returns its revision.
		do func() (int64, error)
		// want is the one line it logs; nil: none.
		want func() map[string]string
	}{
		{"Allocate", func() (int64, error) {
			var err error
			res, err = a.Allocate(ctx, req)
			return res.Revision, err
		}, func() map[string]string {
			return map[string]string{"msg": "allocated", "namespace": "ns", "name": "svc-u", "uid": "u",
				"ranges":      "10.0.0.0/24,fd00::/120,30000-32767",
				"cluster_ips": fmt.Sprint(res.ClusterIPs[0], ",", res.ClusterIPs[1]),
				"node_ports":  fmt.Sprint(res.NodePorts[0], ",", res.NodePorts[1])}
		}},
		{"Allocate replayed", func() (int64, error) {
			r, err := a.Allocate(ctx, req)
			if err == nil && !r.Replayed {
				t.Errorf("Allocate(%+v) again = %+v; want Replayed", req, r)
			}
			return r.Revision, err
		}, nil},
		{"Release", func() (int64, error) {
			_, r, err := a.Release(ctx, u, []Item{Port(30100)}, false)
			return r, err
		}, func() map[string]string {
			return map[string]string{"msg": "released", "uid": "u", "node_ports": "30100", "force": "false"}
		}},
		{"Release force", func() (int64, error) {
			_, r, err := a.Release(ctx, Owner{}, []Item{IP(res.ClusterIPs[1])}, true)
			return r, err
		}, func() map[string]string {
			return map[string]string{"msg": "released", "cluster_ips": res.ClusterIPs[1].String(),
				"force": "true", "holder_uids": "[u]"}
		}},
		{"Assign", func() (int64, error) {
			var err error
			al, err = a.Assign(ctx, v, Port(30200))
			return al.ModRevision, err
		}, func() map[string]string {
			return map[string]string{"msg": "assigned", "uid": "v", "range": "30000-32767",
				"node_ports": "30200"}
		}},
		{"Assign held", func() (int64, error) {
			al, err := a.Assign(ctx, v, Port(30200))
			return al.ModRevision, err
		}, nil},
		{"Reassign", func() (int64, error) {
			var err error
			before = al
			al, err = a.Reassign(ctx, al, w)
			return al.ModRevision, err
		}, func() map[string]string {
			return map[string]string{"msg": "reassigned", "uid": "v", "to_uid": "w", "node_ports": "30200",
				"if_mod_revision": strconv.FormatInt(before.ModRevision, 10)}
		}},
		{"ReleaseIf", func() (int64, error) {
			if ok, err := a.ReleaseIf(ctx, al); !ok || err != nil {
				return 0, fmt.Errorf("ReleaseIf(%+v) = %v, %v; want true", al, ok, err)
			}
			_, err := a.Get(ctx, Port(30200))
			if !errors.Is(err, ErrNotFound) {
				return 0, fmt.Errorf("Get(30200) after ReleaseIf = %v; want ErrNotFound", err)
			}
			return 0, nil
		}, func() map[string]string {
			return map[string]string{"msg": "released", "uid": "w", "node_ports": "30200",
				"if_mod_revision": strconv.FormatInt(al.ModRevision, 10)}
		}},
		{"ReleaseIf gone", func() (int64, error) {
			if ok, err := a.ReleaseIf(ctx, al); ok || err != nil {
				return 0, fmt.Errorf("ReleaseIf(%+v) again = %v, %v; want false", al, ok, err)
			}
			return 0, nil
		}, nil},
		{"Transfer", func() (int64, error) {
			_, r, err := a.Transfer(ctx, Owner{UID: "u"}, owner("x"), nil)
			return r, err
		}, func() map[string]string {
			return map[string]string{"msg": "transferred", "namespace": "ns", "name": "svc-u", "uid": "u",
				"to_namespace": "ns", "to_name": "svc-x", "to_uid": "x",
				"cluster_ips": res.ClusterIPs[0].String(), "node_ports": fmt.Sprint(res.NodePorts[1])}
		}},
		{"Transfer again", func() (int64, error) {
			moved, r, err := a.Transfer(ctx, Owner{UID: "u"}, owner("x"), nil)
			if err == nil && (len(moved) != 0 || r != 0) {
				t.Errorf("Transfer again = %v, %d; want nothing moved, revision 0", moved, r)
			}
			return r, err
		}, nil},
	}
	for _, s := range steps {
		rev, err := s.do()
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		got := h.take()
		if s.want == nil {
			if len(got) != 0 {
				t.Errorf("%s logged %v; want nothing", s.name, got)
			}
			continue
		}
		if len(got) != 1 {
			t.Errorf("%s logged %v; want one line", s.name, got)
			continue
		}
		for k, v := range s.want() {
			if got[0][k] != v {
				t.Errorf("%s logged %s=%q; want %q (line %v)", s.name, k, got[0][k], v, got[0])
			}
		}
		if rev != 0 && got[0]["revision"] != strconv.FormatInt(rev, 10) {
			t.Errorf("%s logged revision=%q; want %d", s.name, got[0]["revision"], rev)
		}
	}
}

func TestOwnerHints(t *testing.T) {
	var h ownerHints
	rec := &ownerRecord{UID: "u0"}
	for i := range 2*maxHints + 1 {
		h.put(fmt.Sprint("u", i), int64(i+1), rec)
	}
	tests := []struct {
		uid  string
		want int64 // 0: forgotten
	}{
		{"u0", 0},                                 // two generations ago
		{fmt.Sprint("u", maxHints-1), 0},          // the end of the forgotten generation
		{fmt.Sprint("u", maxHints), maxHints + 1}, // the old generation
		{fmt.Sprint("u", 2*maxHints), 2*maxHints + 1},
	}
	for _, tc := range tests {
		if got, ok := h.get(tc.uid); got.rev != tc.want || ok != (tc.want != 0) {
			t.Errorf("get(%s) = %d, %v; want %d", tc.uid, got.rev, ok, tc.want)
		}
	}
	h.del(fmt.Sprint("u", maxHints), fmt.Sprint("u", 2*maxHints))
	for _, uid := range []string{fmt.Sprint("u", maxHints), fmt.Sprint("u", 2*maxHints)} {
		if got, ok := h.get(uid); ok {
			t.Errorf("get(%s) after del = %d; want none", uid, got.rev)
		}
	}
}
