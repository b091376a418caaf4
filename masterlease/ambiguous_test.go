package masterlease

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// TestRelistKeepsShutdownException: the last API server removes its lease with
// shutdown=true while a replica's watch is down. When that replica lists again (what
// Run does after any watch failure), it must publish no address, like a replica that
// saw the events, rather than keep the dead one by the guard.
func TestRelistKeepsShutdownException(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	watching := start(t, e.Client) // a replica whose watch stays up
	relisting := newStopped(t, e.Client)

	mustRenew(t, ctx, watching, "10.9.0.1", 0)
	if _, err := relisting.load(ctx); err != nil { // Run's first list
		t.Fatal(err)
	}
	// ... watch breaks here; meanwhile the last API server shuts down cleanly:
	mustRemove(t, ctx, watching, "10.9.0.1", true)
	if _, err := relisting.load(ctx); err != nil { // Run's re-list after the failure
		t.Fatal(err)
	}
	w, err := watching.Endpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	relisting.mu.Lock()
	r := relisting.eps.clone()
	relisting.mu.Unlock()
	t.Logf("replica with a live watch: %v; replica that re-listed: %v (guarded=%v)", w.Addresses, r.Addresses,
		relisting.guarded)
	if len(r.Addresses) != len(w.Addresses) {
		t.Errorf("replicas disagree after a clean shutdown of the last API server: %v vs %v", w.Addresses,
			r.Addresses)
	}
}

// ambiguousKV commits a Txn but reports an error, as etcd does for "request timed out"
// or a deadline that expires after the request was sent.
type ambiguousKV struct {
	clientv3.KV
	fail *bool
}

func (k ambiguousKV) Txn(ctx context.Context) clientv3.Txn {
	return &ambiguousTxn{Txn: k.KV.Txn(ctx), fail: k.fail}
}

type ambiguousTxn struct {
	clientv3.Txn
	fail *bool
}

func (t *ambiguousTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *ambiguousTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Then(ops...)
	return t
}
func (t *ambiguousTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}
func (t *ambiguousTxn) Commit() (*clientv3.TxnResponse, error) {
	r, err := t.Txn.Commit()
	if err == nil && *t.fail {
		*t.fail = false
		return nil, context.DeadlineExceeded
	}
	return r, err
}

// TestAmbiguousRenewKeepsCommittedLease: a create (or TTL change) whose Txn committed
// but answered with an error must not revoke the lease the key is now bound to, which
// would delete a live API server's key.
func TestAmbiguousRenewKeepsCommittedLease(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	cli := e.NewClient()
	fail := false
	cli.KV = ambiguousKV{KV: cli.KV, fail: &fail}
	m := start(t, cli)
	other := start(t, e.Client)
	mustRenew(t, ctx, other, "10.9.0.2", 0) // another API server, so no guard
	mustRenew(t, ctx, m, "10.9.0.1", 2)
	fail = true
	_, err := m.Renew(ctx, "10.9.0.1", 3) // TTL change: replace path
	t.Logf("Renew with a new TTL, Txn committed but answered an error: %v", err)
	// Renew revokes what it revokes before it returns, and List reads etcd (a
	// linearizable read): a key deleted by a revoke is gone from it already.
	ls, _, err := other.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("leases after: %v", ls)
	eps, _ := other.Endpoints(ctx)
	t.Logf("endpoints after: %v", eps.Addresses)
	if len(ls) != 2 {
		t.Errorf("the key of 10.9.0.1 was deleted by revoking the lease its committed Txn bound it to")
	}
}
