package allocator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/allocd/allocd/internal/testing/etcdtest"
	"github.com/allocd/allocd/internal/testing/netproxy"
)

// checkTombstone fails the test unless uid's owner record is a tombstone: present,
// holding nothing, with no request to replay.
func checkTombstone(t *testing.T, cli *clientv3.Client, a *Allocator, uid string) {
	t.Helper()
	resp, err := cli.Get(etcdtest.Context(t), a.ownerKey(uid))
	if err != nil || len(resp.Kvs) != 1 {
		t.Errorf("owner record of %s after its full release = %v, %v; want a tombstone", uid, resp, err)
		return
	}
	rec, err := decodeOwnerRecord(resp.Kvs[0].Value)
	if err != nil || rec.items() != 0 || rec.Last != nil {
		t.Errorf("owner record of %s after its full release = %s, %v; want a tombstone (no "+
			"items, no last request)",
			uid, resp.Kvs[0].Value, err)
	}
}

// passEpochs moves the epoch on until the tombstones written so far may be collected,
// and collects them.
func passEpochs(t *testing.T, a *Allocator) {
	t.Helper()
	moveEpoch(t, a)
	if err := a.epochs.collect(etcdtest.Context(t)); err != nil {
		t.Fatal(err)
	}
}

// TestNoAllocationComesBack reproduces, deterministically, the race the tombstones
// close: a replica's Allocate transaction is held in a paused link to etcd (the fault
// suite's proxy, netproxy) and its caller gives up; the caller's retry commits through
// another replica, and the caller releases everything; then the link resumes and the
// held transaction reaches etcd. It must not commit: the owner holds nothing after its
// acknowledged full release. (Before the tombstones, the owner record's absence and
// the free item satisfied its compares, and the allocation came back.) An owner that
// allocates again after a genuine release still can. In the second case the tombstone
// is collected before the held transaction lands: its epoch compare fails it.
//
// Two more cases release an owner that has no record, or only a tombstone, when the
// release reads it: the held transaction (the caller's only attempt, not retried)
// expects just that, so the release must still change the record (a tombstone anew).
// In the last four, everything the owner holds is transferred to another owner instead
// of released: the record emptied by the transfer is a tombstone too, and a transfer
// that finds nothing to move (no record, or a tombstone) writes a tombstone anew as a
// full release does.
func TestNoAllocationComesBack(t *testing.T) {
	for _, c := range []raceCase{
		{name: "tombstone", retry: true},
		{name: "tombstone collected", retry: true, collect: true},
		{name: "no record when released"},
		{name: "only a tombstone when released", tombFirst: true},
		{name: "transferred", retry: true, transfer: true},
		{name: "transferred, tombstone collected", retry: true, collect: true, transfer: true},
		{name: "no record when transferred", transfer: true},
		{name: "only a tombstone when transferred", tombFirst: true, transfer: true},
	} {
		t.Run(c.name, func(t *testing.T) { raceRelease(t, c) })
	}
}

// raceCase is one case of TestNoAllocationComesBack: whether the caller retries
// (else the release finds what the held transaction expects), whether the tombstone
// is collected before the held transaction lands, whether the owner allocated and
// released everything once before (a tombstone when the held transaction is built),
// and whether everything is transferred to another owner rather than released.
type raceCase struct {
	name                                string
	retry, collect, tombFirst, transfer bool
}

func raceRelease(t *testing.T, c raceCase) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	cfg := testConfig("10.0.0.0/24")
	px, pcli := newProxy(t, e.Endpoint)
	reg := prometheus.NewRegistry()
	cfg1 := cfg
	cfg1.Registerer = reg
	held := start(t, pcli, cfg1)
	other := start(t, e.NewClient(), cfg)
	o := owner("svc")
	req := Request{Owner: o}

	txns := func() float64 { // every group-commit transaction, whatever its result
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0.0
		for _, mf := range mfs {
			if mf.GetName() == "allocd_allocator_commit_transactions_total" {
				for _, m := range mf.Metric {
					n += m.GetCounter().GetValue()
				}
			}
		}
		return n
	}
	if c.tombFirst {
		if _, err := other.Allocate(ctx, req); err != nil {
			t.Fatal(err)
		}
		if _, _, err := other.Release(ctx, o, nil, false); err != nil {
			t.Fatal(err)
		}
		// The held replica knows the tombstone (as from a transaction's read-back), so
		// that its transaction expects it rather than reading it through the paused link.
		resp, err := e.Client.Get(ctx, held.ownerKey(o.UID))
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("tombstone of %s: %v, %v", o.UID, resp, err)
		}
		rec, err := decodeOwnerRecord(resp.Kvs[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		held.hints.put(o.UID, resp.Kvs[0].ModRevision, rec)
	}
	before := txns()
	px.PauseTx()
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := held.Allocate(cctx, req)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		px.UnpauseTx()
		t.Fatalf("Allocate through the paused link = %v; want the caller's deadline (its transaction held)",
			err)
	}
	var res Result
	if c.retry {
		res, err = other.Allocate(ctx, req) // the caller's retry, through another replica
		if err != nil {
			px.UnpauseTx()
			t.Fatalf("retry = %v", err)
		}
	}
	to := owner("svc-to")
	if c.transfer {
		if tr, err := other.Transfer(ctx, o, to, nil); err != nil || len(tr.Moved) != len(res.ClusterIPs) {
			px.UnpauseTx()
			t.Fatalf("Transfer(all of %s) = %+v, %v; want %v moved", o.UID, tr, err, res.ClusterIPs)
		}
	} else if _, _, err := other.Release(ctx, o, nil, false); err != nil {
		px.UnpauseTx()
		t.Fatalf("Release(all of %s) = %v", o.UID, err)
	}
	if c.collect {
		passEpochs(t, other)
		if resp, err := e.Client.Get(ctx, other.ownerKey(o.UID)); err != nil || len(resp.Kvs) != 0 {
			px.UnpauseTx()
			t.Fatalf("tombstone of %s not collected (read: %v)", o.UID, err)
		}
	}
	px.UnpauseTx() // the held transaction reaches etcd, within its 2 s
	etcdtest.WaitFor(t, 10*time.Second, "the held transaction's outcome",
		func() bool { return txns() > before })

	holds := heldBy(t, e.Client, other, o.UID)
	if len(holds) != 0 {
		t.Errorf("after %s's acknowledged full release (of %v), etcd holds %v for it: the held "+
			"transaction committed",
			o.UID, res.ClusterIPs, holds)
	}
	if !c.collect {
		checkTombstone(t, e.Client, other, o.UID)
	}
	if c.transfer {
		if got := heldBy(t, e.Client, other, to.UID); len(got) != len(res.ClusterIPs) {
			t.Errorf("after the transfer, etcd holds %v for %s; want %v", got, to.UID, res.ClusterIPs)
		}
	}

	// A genuine new allocation of the owner, through either replica, follows the
	// tombstone.
	again, err := held.Allocate(ctx, Request{Owner: o, NodePortCount: 1})
	if err != nil || again.Replayed || len(again.ClusterIPs) != 1 {
		t.Fatalf("Allocate after the release = %+v, %v; want a new allocation", again, err)
	}
	if got := heldBy(t, e.Client, other, o.UID); len(got) != 2 {
		t.Errorf("after allocating again, etcd holds %v for %s; want a ClusterIP and a node port", got, o.UID)
	}
}

// heldBy lists the item keys etcd holds for owner uid.
func heldBy(t *testing.T, cli *clientv3.Client, a *Allocator, uid string) []string {
	t.Helper()
	var out []string
	for _, p := range []string{a.ipPrefix, a.portPrefix} {
		resp, err := cli.Get(etcdtest.Context(t), p, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			if o, _, err := decodeItemValue(kv.Value); err == nil && o.UID == uid {
				out = append(out, string(kv.Key))
			}
		}
	}
	return out
}

// newProxy starts a netproxy on loopback to the member at target and returns it and
// an etcd client that goes through it.
func newProxy(t *testing.T, target string) (*netproxy.Proxy, *clientv3.Client) {
	to, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	// A random host of 127.0.0.0/8 (see loopback.FreeAddr), any free port of it.
	host, _, err := net.SplitHostPort(etcdtest.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	px, err := netproxy.Listen(net.JoinHostPort(host, "0"), to.Host)
	if err != nil {
		t.Fatalf("proxy to %s: %v", target, err)
	}
	t.Cleanup(func() { px.Close() })
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + px.Addr()},
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return px, cli
}

// TestEpochSeenKeepsPairs: the epoch's version and CreateRevision are recorded
// together: a late event of the key before it was made anew never lends its version
// to the new key (the epoch compare would be looser than the key allows).
func TestEpochSeenKeepsPairs(t *testing.T) {
	e := &epochs{}
	e.seen(59, 100)
	e.seen(1, 500)  // the key made anew
	e.seen(60, 100) // a late event of the old key
	if ep := e.now(); ep != (epoch{version: 1, create: 500}) {
		t.Errorf("after a late event of the old key: epoch %+v; want {1 500}", ep)
	}
	e.seen(3, 500)
	e.seen(2, 500)
	if ep := e.now(); ep != (epoch{version: 3, create: 500}) {
		t.Errorf("a version went back: epoch %+v; want {3 500}", ep)
	}
	e.seen(0, 0) // deleted
	if ep := e.now(); ep != (epoch{}) {
		t.Errorf("after the key's delete: epoch %+v; want its absence", ep)
	}
}

// TestConcurrentFullReleases: full releases of one owner at once all succeed. Each
// writes a tombstone (an owner holding nothing gets one anew); one that loses the race
// to another's tombstone, written since it began, is done.
func TestConcurrentFullReleases(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e.Client, testConfig("10.0.0.0/24"))
	ctx := etcdtest.Context(t)
	for _, held := range []bool{false, true} {
		uid := fmt.Sprint("x", held)
		if held {
			if _, err := a.Allocate(ctx, Request{Owner: owner(uid)}); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		errs := make([]error, 48)
		for i := range errs {
			wg.Go(func() { _, _, errs[i] = a.Release(ctx, owner(uid), nil, false) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("full Release #%d of %s (holding something: %v) = %v", i, uid, held, err)
			}
		}
		checkTombstone(t, e.Client, a, uid)
	}
}

// TestStalledReassignAfterCollect: an attempt of Reassign (the last one of a call whose
// caller gave up) is held in a paused link to etcd while the owner it gives the item
// to, which had no record when the attempt read it, allocates, releases everything and
// has its tombstone collected; then the link resumes. The attempt must not commit: its
// compare of the receiving owner's record (absent) holds again, and only its epoch
// compare fails it; else the owner would hold the item after its acknowledged full
// release. (Before, Reassign compared the epoch only when it made a tombstone.)
func TestStalledReassignAfterCollect(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	cfg := testConfig("10.0.0.0/24")
	px, pcli := newProxy(t, e.Endpoint)
	hw := &holdWrites{KV: pcli.KV, px: px, held: make(chan struct{})}
	pcli.KV = hw
	held := start(t, pcli, cfg)
	other := start(t, e.NewClient(), cfg)
	from, to := owner("from"), owner("to")
	it := Port(30500)
	give(t, other, from, it, Port(30501))
	al, err := other.Get(ctx, it)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		rev int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		rev, _, err := held.conditional(context.WithValue(ctx, holdKey{}, true), al,
			&reassign{to: to, now: time.Now()})
		done <- result{rev, err}
	}()
	select {
	case <-hw.held:
	case r := <-done:
		px.UnpauseTx()
		t.Fatalf("Reassign's attempt ended before its write was held: %+v", r)
	}
	give(t, other, to, Port(30502))
	if _, _, err := other.Release(ctx, to, nil, false); err != nil {
		px.UnpauseTx()
		t.Fatalf("Release(all of %s) = %v", to.UID, err)
	}
	passEpochs(t, other)
	if rec := record(t, e.Client, other, to.UID); rec != nil {
		px.UnpauseTx()
		t.Fatalf("tombstone of %s not collected: %+v", to.UID, rec)
	}
	px.UnpauseTx() // the held transaction reaches etcd
	r := <-done
	if r.err != nil || r.rev != 0 {
		t.Errorf("the held attempt of Reassign(%v to %s) = revision %d, %v; want its compares failed "+
			"(revision 0)", it, to.UID, r.rev, r.err)
	}
	checkHolds(t, e.Client, other, to, nil)
	checkHolds(t, e.Client, other, from, []Item{it, Port(30501)})
}

// holdKey marks the context of a call whose write holdWrites holds.
type holdKey struct{}

// holdWrites is the KV of a client that reaches etcd through px: a transaction with
// compares (a write) whose context carries holdKey pauses px first (the reads before it
// went through), closes held, and waits in the paused link until px resumes.
type holdWrites struct {
	clientv3.KV
	px   *netproxy.Proxy
	held chan struct{}
}

func (h *holdWrites) Txn(ctx context.Context) clientv3.Txn {
	return &holdTxn{Txn: h.KV.Txn(ctx), h: h, hold: ctx.Value(holdKey{}) != nil}
}

type holdTxn struct {
	clientv3.Txn
	h           *holdWrites
	hold, write bool
}

func (t *holdTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.Txn, t.write = t.Txn.If(cs...), len(cs) > 0
	return t
}

func (t *holdTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }

func (t *holdTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *holdTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.hold && t.write {
		t.h.px.PauseTx()
		close(t.h.held)
	}
	return t.Txn.Commit()
}
