package leader

import (
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Fence proves leadership in a write: the election key of a term and its
// CreateRevision. A write compares CreateRevision(Key) = Rev, so that a deposed leader
// can never write after its successor was elected (etcd's concurrency.Election
// Proclaim does the same).
type Fence struct {
	Key string
	Rev int64
}

// ErrFenceLost is the error of a write refused by its fence: the election key is gone
// or was created again, so another replica may lead. It ends the term.
var ErrFenceLost = errors.New("leadership lost (the election key changed): a write was refused by the fence")

// Valid reports whether f names a term: a key and a positive revision.
func (f Fence) Valid() bool { return f.Key != "" && f.Rev > 0 }

// Cmp is the compare that holds while the term of f lasts.
func (f Fence) Cmp() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(f.Key), "=", f.Rev)
}

// Get is the read to put among a transaction's Else ops, so that Held can tell, when the
// transaction failed, whether the fence was the compare that failed.
func (f Fence) Get() clientv3.Op { return clientv3.OpGet(f.Key) }

// Held reports whether the fence still held when the failed transaction resp ran:
// false when the response of Else op i (f.Get()) shows the key gone or re-created.
func (f Fence) Held(resp *clientv3.TxnResponse, i int) bool {
	if i >= len(resp.Responses) {
		return false
	}
	kvs := resp.Responses[i].GetResponseRange().GetKvs()
	return len(kvs) == 1 && kvs[0].CreateRevision == f.Rev
}

// String names the fence in logs.
func (f Fence) String() string { return fmt.Sprintf("%s@%d", f.Key, f.Rev) }
