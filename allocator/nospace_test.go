package allocator

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// holdKV holds back, once armed, the first transaction that writes an item key (an
// Allocate's, an Assign's, a Transfer's, a Reassign's): its caller waits until its
// context ends, as behind a stalled member, and land sends it to etcd later.
type holdKV struct {
	clientv3.KV
	items []string // the item keys' prefixes
	mu    sync.Mutex
	armed bool
	held  *heldTxn
}

// heldTxn records a transaction as it is built, and sends it unless it is held.
type heldTxn struct {
	h            *holdKV
	ctx          context.Context
	cmps         []clientv3.Cmp
	thens, elses []clientv3.Op
}

func (h *holdKV) Txn(ctx context.Context) clientv3.Txn { return &heldTxn{h: h, ctx: ctx} }

func (t *heldTxn) If(c ...clientv3.Cmp) clientv3.Txn  { t.cmps = append(t.cmps, c...); return t }
func (t *heldTxn) Then(o ...clientv3.Op) clientv3.Txn { t.thens = append(t.thens, o...); return t }
func (t *heldTxn) Else(o ...clientv3.Op) clientv3.Txn { t.elses = append(t.elses, o...); return t }

func (t *heldTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.h.hold(t) {
		<-t.ctx.Done()
		return nil, t.ctx.Err()
	}
	return t.send(t.ctx)
}

func (t *heldTxn) send(ctx context.Context) (*clientv3.TxnResponse, error) {
	return t.h.KV.Txn(ctx).If(t.cmps...).Then(t.thens...).Else(t.elses...).Commit()
}

// hold reports whether t is the transaction to hold, and holds it.
func (h *holdKV) hold(t *heldTxn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.armed || h.held != nil {
		return false
	}
	for _, op := range t.thens {
		k := string(op.KeyBytes())
		for _, p := range h.items {
			if op.IsPut() && strings.HasPrefix(k, p) {
				h.held, h.armed = t, false
				return true
			}
		}
	}
	return false
}

// arm makes h hold the next transaction that writes an item key (on), or none (off).
func (h *holdKV) arm(on bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed = on
}

// land sends the held transaction to etcd (nil, nil when none was held).
func (h *holdKV) land(ctx context.Context) (*clientv3.TxnResponse, error) {
	h.mu.Lock()
	t := h.held
	h.held = nil
	h.mu.Unlock()
	if t == nil {
		return nil, nil
	}
	return t.send(ctx)
}

// noSpaceCase is one case of TestNoSpaceNoAllocationComesBack: the write held (and
// landing late) gives the owner items; it is built before any NOSPACE episode
// ("before"), during one, while the epoch key is absent and etcd still out of space
// ("alarm"), or after one, space back but the key not made anew yet ("absent"). The
// owner's full release comes in a NOSPACE episode after the build: the same one for
// "alarm", the next one otherwise; with retry, the caller's retry of the Allocate
// commits (through the other replica, the key made anew) before it.
type noSpaceCase struct {
	name, write, build string
	retry              bool
}

// TestNoSpaceNoAllocationComesBack: a write that gives an owner items, held on its way
// to etcd while its caller gives up, never lands after the owner's acknowledged full
// release when NOSPACE episodes delete the epoch key (a release while etcd is out of
// space deletes its records and the epoch key instead of writing tombstones).
//
// Before the fix, an Allocate, Assign or Transfer begun while the key was absent
// compared its absence (CreateRevision 0, version below epochSlack): the key made anew
// failed it, but the next episode's delete made that compare hold again, together with
// the owner record's and the items' absence, and the write landed (the first four
// cases). A Reassign compared the epoch only when it emptied its holder's record: one
// that left it holding something landed after the release of an owner that held
// nothing, in one episode (the last case). Now a write that gives items begins only
// under an epoch key that exists (made anew first: while etcd is out of space, that
// fails the call), and compares it always.
//
// The replicas do not run: the test takes their epoch loops' steps (ensure), so that
// no loop makes the key anew at a moment the test does not choose.
func TestNoSpaceNoAllocationComesBack(t *testing.T) {
	for _, c := range []noSpaceCase{
		{name: "allocate retried, released in the next episode", write: "allocate", build: "absent",
			retry: true},
		{name: "allocate, released in the next episode", write: "allocate", build: "absent"},
		{name: "allocate, released in the same episode", write: "allocate", build: "alarm"},
		{name: "assign, released in the next episode", write: "assign", build: "absent"},
		{name: "transfer, released in the next episode", write: "transfer", build: "absent"},
		{name: "reassign, released in an episode after it", write: "reassign", build: "before"},
	} {
		t.Run(c.name, func(t *testing.T) { noSpaceRace(t, c) })
	}
}

func noSpaceRace(t *testing.T, c noSpaceCase) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	cfg := testConfig("10.0.0.0/24")
	hcli := e.NewClient()
	hk := &holdKV{KV: hcli.KV}
	hcli.KV = hk
	held, err := New(ctx, hcli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	hk.items = []string{held.ipPrefix, held.portPrefix}
	other, err := New(ctx, e.NewClient(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"x", "y", "from"} {
		if _, err := other.Allocate(ctx, Request{Owner: owner(u), NodePortCount: 1}); err != nil {
			t.Fatal(err)
		}
	}
	o := owner("svc")
	epochPresent := func() bool {
		resp, err := e.Client.Get(ctx, other.epochKey)
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Kvs) > 0
	}

	var disarm func()
	if c.build != "before" {
		disarm = raiseNoSpace(t, e)
		if _, _, err := other.Release(ctx, owner("x"), nil, false); err != nil {
			t.Fatalf("Release(x) under NOSPACE = %v", err)
		}
		// The held replica learns the key's absence from its own release (its epoch
		// compare fails and the read-back finds the key gone), as its watch would.
		if _, _, err := held.Release(ctx, owner("y"), nil, false); err != nil {
			t.Fatalf("Release(y) under NOSPACE = %v", err)
		}
		if epochPresent() || held.epochs.now() != (epoch{}) {
			t.Fatalf("after releases under NOSPACE: epoch key present %v, held replica's epoch %+v; "+
				"want it deleted, and known so", epochPresent(), held.epochs.now())
		}
		if c.build == "absent" {
			disarm()
		}
	}

	hk.arm(true)
	err = heldWrite(ctx, t, c.write, held, o)
	hk.arm(false) // a write refused at once held nothing
	if err == nil {
		t.Fatalf("%s for %s succeeded; want it held until its caller gives up (or refused)", c.write, o.UID)
	}
	t.Logf("the %s: %v (held: %v)", c.write, err, hk.held != nil)

	var res Result
	if c.build != "alarm" {
		if !epochPresent() {
			// Space is back: the epoch loop makes the key anew.
			if err := other.epochs.ensure(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := other.epochs.ensure(ctx); err != nil { // the other replica knows it
			t.Fatal(err)
		}
		if c.retry {
			if res, err = other.Allocate(ctx, Request{Owner: o}); err != nil {
				t.Fatalf("the caller's retry = %v", err)
			}
		}
		disarm = raiseNoSpace(t, e)
	}
	if _, _, err := other.Release(ctx, o, nil, false); err != nil {
		t.Fatalf("Release(all of %s) under NOSPACE = %v", o.UID, err)
	}
	if epochPresent() {
		t.Fatalf("after the release of %s under NOSPACE the epoch key is present; want it deleted", o.UID)
	}
	disarm()

	resp, err := hk.land(ctx) // the held write reaches etcd, space back, the key not yet anew
	if err != nil {
		t.Fatalf("the held write's transaction = %v", err)
	}
	if got := heldBy(t, e.Client, other, o.UID); len(got) != 0 || (resp != nil && resp.Succeeded) {
		t.Errorf("after %s's acknowledged full release (of %v), etcd holds %v for it: the held %s "+
			"committed (%v)", o.UID, res.ClusterIPs, got, c.write, resp != nil && resp.Succeeded)
	}
	if c.write == "transfer" || c.write == "reassign" {
		if got := heldBy(t, e.Client, other, "from"); len(got) != 2 {
			t.Errorf("etcd holds %v for the held %s's owner; want its address and port", got, c.write)
		}
	}

	// Space back, the key made anew by the epoch loop, and known to both replicas (as
	// their watches would tell them): the owner allocates again.
	for _, a := range []*Allocator{other, held} {
		if err := a.epochs.ensure(ctx); err != nil {
			t.Fatal(err)
		}
	}
	again, err := held.Allocate(ctx, Request{Owner: o, NodePortCount: 1})
	if err != nil || again.Replayed || len(again.ClusterIPs) != 1 {
		t.Fatalf("Allocate after the release = %+v, %v; want a new allocation", again, err)
	}
	if got := heldBy(t, e.Client, other, o.UID); len(got) != 2 {
		t.Errorf("after allocating again, etcd holds %v for %s; want a ClusterIP and a node port", got, o.UID)
	}
}

// heldWrite makes the write of kind for o through a, its caller giving up after 300
// ms: an Allocate, an Assign of 10.0.0.200, a Transfer of what "from" holds, a
// Reassign of the address "from" holds (which keeps its node port).
func heldWrite(ctx context.Context, t *testing.T, kind string, a *Allocator, o Owner) error {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	switch kind {
	case "allocate":
		_, err := a.Allocate(cctx, Request{Owner: o})
		return err
	case "assign":
		_, err := a.Assign(cctx, o, IP(netip.MustParseAddr("10.0.0.200")))
		return err
	case "transfer":
		_, err := a.Transfer(cctx, owner("from"), o, nil)
		return err
	}
	page, err := a.ListPage(ctx, ListOptions{OwnerUID: "from"})
	if err != nil {
		t.Fatal(err)
	}
	for _, al := range page.Allocations {
		if al.Item.Kind == KindClusterIP {
			_, err := a.Reassign(cctx, al, o)
			return err
		}
	}
	t.Fatalf("ListPage(from) = %+v; want an address", page)
	return errors.New("unreachable")
}
