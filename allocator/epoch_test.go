package allocator

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/pkg/v3/proxy"
	"go.uber.org/zap"

	"github.com/allocd/allocd/internal/testing/etcdtest"
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
// suite's proxy, pkg/proxy) and its caller gives up; the caller's retry commits through
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
// In the last two, what the retry got is transferred to another owner instead of
// released: the record emptied by the transfer is a tombstone too.
func TestNoAllocationComesBack(t *testing.T) {
	for _, c := range []raceCase{
		{name: "tombstone", retry: true},
		{name: "tombstone collected", retry: true, collect: true},
		{name: "no record when released"},
		{name: "only a tombstone when released", tombFirst: true},
		{name: "transferred", retry: true, transfer: true},
		{name: "transferred, tombstone collected", retry: true, collect: true, transfer: true},
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
	px, via := newProxy(t, e.Endpoint)
	pcli, err := clientv3.New(clientv3.Config{Endpoints: []string{via}, DialTimeout: 5 * time.Second,
		Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pcli.Close() })
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
	_, err = held.Allocate(cctx, req)
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
		if moved, _, err := other.Transfer(ctx, o, to, nil); err != nil || len(moved) != len(res.ClusterIPs) {
			px.UnpauseTx()
			t.Fatalf("Transfer(all of %s) = %v, %v; want %v moved", o.UID, moved, err, res.ClusterIPs)
		}
	} else if _, _, err := other.Release(ctx, o, nil, false); err != nil {
		px.UnpauseTx()
		t.Fatalf("Release(all of %s) = %v", o.UID, err)
	}
	if c.collect {
		passEpochs(t, other)
		if resp, _ := e.Client.Get(ctx, other.ownerKey(o.UID)); len(resp.Kvs) != 0 {
			px.UnpauseTx()
			t.Fatalf("tombstone of %s not collected", o.UID)
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

// newProxy starts etcd's pkg/proxy (the fault suite's) to the member at target and
// returns it and its URL.
func newProxy(t *testing.T, target string) (proxy.Server, string) {
	to, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	from := url.URL{Scheme: "http", Host: etcdtest.FreeAddr(t)}
	px := proxy.NewServer(proxy.ServerConfig{Logger: zap.NewNop(), From: from, To: *to})
	select {
	case <-px.Ready():
	case err := <-px.Error():
		t.Fatalf("proxy to %s: %v", target, err)
	}
	go func() {
		for {
			select {
			case <-px.Error():
			case <-px.Done():
				return
			}
		}
	}()
	t.Cleanup(func() { px.Close() })
	return px, from.String()
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
