package allocator

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// writeTombstones writes what n full releases of the owners prefix-0 … prefix-(n-1)
// write (a tombstone and its index key each, a.tombstone's writes) under the epoch as
// a knows it.
func writeTombstones(tb testing.TB, cli *clientv3.Client, a *Allocator, prefix string, n int) {
	tb.Helper()
	f := a.epochs.now()
	var ops []clientv3.Op
	for i := range n {
		uid := prefix + "-" + strconv.Itoa(i)
		ops = append(ops, a.epochs.tombstone(uid, &ownerRecord{Namespace: "ns", Name: uid, UID: uid}, f)...)
		if len(ops) == maxTxnOps || i == n-1 {
			if _, err := cli.Txn(etcdtest.Context(tb)).Then(ops...).Commit(); err != nil {
				tb.Fatal(err)
			}
			ops = ops[:0]
		}
	}
}

// waiting counts the tombstones' index keys and the owner records under a (tombstones
// or not).
func waiting(t *testing.T, cli *clientv3.Client, a *Allocator) (index, records int64) {
	t.Helper()
	ctx := etcdtest.Context(t)
	r1, err := cli.Get(ctx, a.tombPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	r2, err := cli.Get(ctx, a.ownerPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return r1.Count, r2.Count
}

// idle makes an Allocator of 10.0.0.0/24 on cli, not running: nothing but the test
// moves its epoch or collects.
func idle(t *testing.T, cli *clientv3.Client) *Allocator {
	t.Helper()
	a, err := New(etcdtest.Context(t), cli, testConfig("10.0.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// epochAnew deletes the epoch key, as a release does while etcd is out of space, and
// makes it anew, as a's epoch loop would.
func epochAnew(t *testing.T, cli *clientv3.Client, a *Allocator) {
	t.Helper()
	ctx := etcdtest.Context(t)
	if _, err := cli.Delete(ctx, a.epochKey); err != nil {
		t.Fatal(err)
	}
	a.epochs.seenKV(nil)
	if err := a.epochs.ensure(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestCollectMassRelease: the tombstones of a mass release (more than one round used to
// collect: 16 batches of 32) all go in the first round that may collect them, within
// its budget.
func TestCollectMassRelease(t *testing.T) {
	e := etcdtest.New(t)
	a := idle(t, e.Client)
	a.epochs.budget = time.Minute // a round's budget is TestCollectBudget's
	_, before := waiting(t, e.Client, a)
	writeTombstones(t, e.Client, a, "mass", 1500)
	passEpochs(t, a) // one collection
	if index, records := waiting(t, e.Client, a); index != 0 || records != before {
		t.Errorf("after a round past the epoch of 1500 full releases: %d index keys, %d owner records "+
			"left; want none (and the %d records of before)", index, records-before, before)
	}
}

// TestCollectUnderEarlierEpochKey: tombstones written under an earlier epoch key (it is
// deleted by a release while etcd is out of space, and made anew) go at once, every
// time the key is made anew; those written under the current key wait for their epoch.
func TestCollectUnderEarlierEpochKey(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	a := idle(t, e.Client)
	_, before := waiting(t, e.Client, a)
	writeTombstones(t, e.Client, a, "first", 40)
	if err := a.epochs.collect(ctx); err != nil {
		t.Fatal(err)
	}
	if index, _ := waiting(t, e.Client, a); index != 40 {
		t.Fatalf("index keys after a collection under their own epoch key = %d; want 40 (their epoch not "+
			"passed)", index)
	}
	epochAnew(t, e.Client, a)
	writeTombstones(t, e.Client, a, "second", 40)
	if err := a.epochs.collect(ctx); err != nil {
		t.Fatal(err)
	}
	if index, records := waiting(t, e.Client, a); index != 40 || records-before != 40 {
		t.Fatalf("after the epoch key was made anew and a collection: %d index keys, %d tombstones; "+
			"want the second 40 (the first written under the earlier key)", index, records-before)
	}
	epochAnew(t, e.Client, a)
	if err := a.epochs.collect(ctx); err != nil {
		t.Fatal(err)
	}
	if index, records := waiting(t, e.Client, a); index != 0 || records != before {
		t.Errorf("after the epoch key was made anew again and a collection: %d index keys, %d "+
			"tombstones; want none", index, records-before)
	}
}

// collectFor runs one collection of up to keys index keys on an Allocator of b's client
// and fails the test when it makes more calls to etcd than such a collection needs: two
// transactions a batch (the owner records' read, the deletes) and, in each of its two
// sweeps, a read per tombstoneRead keys and the read that finds none. A collection that
// reads the same keys again and again never ends: the calls past the bound fail. (A
// bound on wall time failed under -race on a loaded machine.)
func collectFor(t *testing.T, a *Allocator, b *rpcBudget, keys int) {
	t.Helper()
	batches := (keys + tombstoneBatch - 1) / tombstoneBatch
	limit := int64(2*batches + 2*(keys/tombstoneRead+2))
	b.calls.Store(0)
	b.limit.Store(limit)
	defer b.limit.Store(0)
	ctx, cancel := context.WithTimeout(etcdtest.Context(t), time.Minute)
	defer cancel()
	err := a.epochs.collect(ctx)
	if n := b.calls.Load(); n > limit || err != nil {
		t.Fatalf("collect = %v after %d calls to etcd; want done in at most %d (%d keys)", err, n, limit,
			keys)
	}
}

// rpcBudget counts the unary calls of an etcd client and, once limit is set, fails
// those past it.
type rpcBudget struct {
	calls, limit atomic.Int64
}

// errOverBudget is the error of a call past an rpcBudget's limit.
var errOverBudget = errors.New("call to etcd past the test's budget")

func (b *rpcBudget) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if n, limit := b.calls.Add(1), b.limit.Load(); limit > 0 && n > limit {
		return errOverBudget
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// budgeted is a client of e whose calls b counts; recv > 0 is its receive limit.
func budgeted(t *testing.T, e *etcdtest.Server, recv int) (*clientv3.Client, *rpcBudget) {
	t.Helper()
	b := &rpcBudget{}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second,
		MaxCallRecvMsgSize: recv,
		DialOptions:        []grpc.DialOption{grpc.WithChainUnaryInterceptor(b.intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli, b
}

// moveEpoch moves the epoch on past that of every tombstone written so far.
func moveEpoch(t *testing.T, a *Allocator) {
	t.Helper()
	target := a.epochs.now().version + 2*epochSlack + 1
	for a.epochs.now().version < target {
		if _, err := a.epochs.bump(etcdtest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCollectForeignKeys: keys under the tombstones' prefix of no index key's form
// (allocd writes none; an operator's slip, a future format) are deleted, and do not
// hold the collection in a loop: one written under an earlier epoch key, and 1024 at
// the head of the range the epoch has passed, before a real index key. (Before, each
// made its loop read it again for ever.)
func TestCollectForeignKeys(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	garbage := "/allocd/tombstones/garbage"
	if _, err := e.Client.Put(ctx, garbage, ""); err != nil { // before New makes the epoch key
		t.Fatal(err)
	}
	cli, b := budgeted(t, e, 0)
	a := idle(t, cli)
	a.epochs.budget = time.Minute
	if a.tombPrefix+"garbage" != garbage {
		t.Fatalf("tombstones' prefix %s", a.tombPrefix)
	}
	_, before := waiting(t, e.Client, a)
	var ops []clientv3.Op
	for i := range 1024 {
		ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s%020d-g%04d", a.tombPrefix, 0, i), ""))
		if len(ops) == maxTxnOps {
			if _, err := e.Client.Txn(ctx).Then(ops...).Commit(); err != nil {
				t.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	writeTombstones(t, e.Client, a, "real", 1)
	moveEpoch(t, a)
	collectFor(t, a, b, 1026)
	if index, records := waiting(t, e.Client, a); index != 0 || records != before {
		t.Errorf("after a collection: %d keys under the tombstones' prefix, %d tombstones; want none",
			index, records-before)
	}
}

// TestCollectIndexKeyWrittenAgain: the sweep of an earlier epoch key reads its index
// keys, then collects them a batch at a time; an owner released again meanwhile, under
// the new key at the version of its earlier release, writes the same index key anew
// with a new tombstone. The sweep's stale batch must not delete the new index key
// alone (its tombstone would never be collected): each index key goes at the revision
// read.
func TestCollectIndexKeyWrittenAgain(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	a := idle(t, e.Client)
	_, before := waiting(t, e.Client, a)
	writeTombstones(t, e.Client, a, "o", 1) // under key c1, version 1
	epochAnew(t, e.Client, a)               // key c2, version 1
	c := a.epochs.now().create
	resp, err := e.Client.Get(ctx, a.tombPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithMaxModRev(c-1))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the sweep's read = %v, %v; want one key", resp, err)
	}
	writeTombstones(t, e.Client, a, "o", 1) // the same index key's name, a new tombstone
	if _, err := a.epochs.collectBatches(ctx, resp.Kvs, c, false, time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	passEpochs(t, a)
	if index, records := waiting(t, e.Client, a); index != 0 || records != before {
		t.Errorf("after the stale batch and a collection: %d index keys, %d tombstones left; want none "+
			"(a tombstone without its index key is never collected)", index, records-before)
	}
}

// TestCollectEarlierKeyOverReceiveLimit: the sweep of an earlier epoch key reads its
// index keys a bounded response at a time. Read in one response, past the client's
// receive limit (the daemon's is 64 MiB: about 700k index keys) it failed every round,
// before anything was deleted and before the collection by version. Scaled down: a
// 256 KiB limit, 4000 keys (340 KiB of them).
func TestCollectEarlierKeyOverReceiveLimit(t *testing.T) {
	e := etcdtest.New(t)
	cli, b := budgeted(t, e, 256<<10)
	a := idle(t, cli)
	a.epochs.budget = time.Minute
	_, before := waiting(t, e.Client, a)
	writeTombstones(t, e.Client, a, "00000000-0000-0000-0000-0000000", 4000)
	epochAnew(t, e.Client, a)
	writeTombstones(t, e.Client, a, "later", 10) // under the new key
	moveEpoch(t, a)
	collectFor(t, a, b, 4010)
	if index, records := waiting(t, e.Client, a); index != 0 || records != before {
		t.Errorf("after a collection: %d index keys, %d tombstones left; want none", index, records-before)
	}
}

// TestCollectBudget: a round stops at its budget and leaves the rest to the next.
func TestCollectBudget(t *testing.T) {
	e := etcdtest.New(t)
	cli, b := budgeted(t, e, 0)
	a := idle(t, cli)
	writeTombstones(t, e.Client, a, "o", 200)
	moveEpoch(t, a)
	a.epochs.budget = 0
	collectFor(t, a, b, 200)
	if index, _ := waiting(t, e.Client, a); index != 200 {
		t.Errorf("index keys after a round of no budget = %d; want the 200", index)
	}
	a.epochs.budget = time.Minute
	collectFor(t, a, b, 200)
	if index, _ := waiting(t, e.Client, a); index != 0 {
		t.Errorf("index keys after a round of a minute = %d; want none", index)
	}
}

// TestCollectRoundOverLatency: a round keeps several collecting transactions in flight,
// so that its budget is not spent on round trips. Behind a link that adds 25 ms to every
// request (as a member busy with a mass release answers), a round of 500 ms collected
// at most 10 batches of 32 one at a time (two round trips each, after the read): 320
// tombstones a second, far fewer than 64 clients release (scale.md, "Mass release").
// Measured under a load average of 24: 160 one at a time, 800 with 8 in flight.
func TestCollectRoundOverLatency(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	px, cli := newProxy(t, e.Endpoint)
	a := idle(t, cli)
	writeTombstones(t, e.Client, a, "o", 2048)
	moveEpoch(t, a)
	px.DelayTx(25*time.Millisecond, 0)
	defer px.UndelayTx()
	if err := a.epochs.collect(ctx); err != nil {
		t.Fatal(err)
	}
	index, _ := waiting(t, e.Client, a)
	if got := 2048 - index; got < 448 {
		t.Errorf("a round of %v over a link of 25 ms collected %d tombstones; want at least 448",
			a.epochs.budget, got)
	}
}
