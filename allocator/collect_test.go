package allocator

import (
	"strconv"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// writeTombstones writes what n full releases of the owners prefix-0 … prefix-(n-1)
// write (a tombstone and its index key each, a.tombstone's writes) under the epoch as
// a knows it.
func writeTombstones(tb testing.TB, cli *clientv3.Client, a *Allocator, prefix string, n int) {
	tb.Helper()
	f := a.fenceNow()
	var ops []clientv3.Op
	for i := range n {
		uid := prefix + "-" + strconv.Itoa(i)
		ops = append(ops, a.tombstone(uid, &ownerRecord{Namespace: "ns", Name: uid, UID: uid}, f)...)
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

// TestCollectMassRelease: the tombstones of a mass release (more than one round used to
// collect: 16 batches of 32) all go in the first round that may collect them.
func TestCollectMassRelease(t *testing.T) {
	e := etcdtest.New(t)
	a, err := New(etcdtest.Context(t), e.Client, testConfig("10.0.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	_, before := waiting(t, e.Client, a)
	writeTombstones(t, e.Client, a, "mass", 1500)
	passEpochs(t, a) // one collection
	if index, records := waiting(t, e.Client, a); index != 0 || records != before {
		t.Errorf("after a round past the fence of 1500 full releases: %d index keys, %d owner records "+
			"left; want none (and the %d records of before)", index, records-before, before)
	}
}

// TestCollectUnderEarlierEpochKey: tombstones written under an earlier epoch key (it is
// deleted by a release while etcd is out of space, and made anew) go at once, every
// time the key is made anew; those written under the current key wait for their fence.
func TestCollectUnderEarlierEpochKey(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	a, err := New(ctx, e.Client, testConfig("10.0.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	anew := func() {
		t.Helper()
		if _, err := e.Client.Delete(ctx, a.epochKey); err != nil {
			t.Fatal(err)
		}
		a.epochRead(nil)
		if err := a.ensureEpoch(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_, before := waiting(t, e.Client, a)
	writeTombstones(t, e.Client, a, "first", 40)
	if err := a.collectTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	if index, _ := waiting(t, e.Client, a); index != 40 {
		t.Fatalf("index keys after a collection under their own epoch key = %d; want 40 (fenced)", index)
	}
	anew()
	writeTombstones(t, e.Client, a, "second", 40)
	if err := a.collectTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	if index, records := waiting(t, e.Client, a); index != 40 || records-before != 40 {
		t.Fatalf("after the epoch key was made anew and a collection: %d index keys, %d tombstones; "+
			"want the second 40 (the first written under the earlier key)", index, records-before)
	}
	anew()
	if err := a.collectTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	if index, records := waiting(t, e.Client, a); index != 0 || records != before {
		t.Errorf("after the epoch key was made anew again and a collection: %d index keys, %d "+
			"tombstones; want none", index, records-before)
	}
}
