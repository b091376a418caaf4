package allocator

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// testOp is an op of owner with one pick of each key, queued as submit queues it.
func testOp(owner string, keys ...string) *op {
	o := &op{ownerKey: owner, cancel: make(chan struct{}), res: make(chan opResult, 1)}
	for _, k := range keys {
		o.picks = append(o.picks, &pick{key: k})
	}
	return o
}

// TestCommitterTake: the committer packs queued ops into one transaction's worth of
// keys (the epoch's compares counted), never an owner or an item key twice in one
// (those wait for the next), not before minKeys keys have queued, and fails the ops
// whose caller gave up.
func TestCommitterTake(t *testing.T) {
	c := newCommitter(1, nil)
	a1, a2, b1, c3 := testOp("A", "k1"), testOp("A", "k2"), testOp("B", "k1"), testOp("C", "k3")
	c.queue = []*op{a1, a2, b1, c3}
	if got := c.take(1); len(got) != 2 || got[0] != a1 || got[1] != c3 {
		t.Errorf("take = %v; want a1 and c3 (a2: owner A again, b1: key k1 again)", got)
	}
	if got := c.take(1); len(got) != 2 || got[0] != a2 || got[1] != b1 {
		t.Errorf("take after = %v; want a2 and b1", got)
	}
	if got := c.take(1); got != nil {
		t.Errorf("take of an empty queue = %v; want nil", got)
	}

	for i := range 200 {
		c.queue = append(c.queue, testOp(fmt.Sprint("o", i), fmt.Sprint("k", i)))
	}
	if got := c.take(1000); got != nil {
		t.Errorf("take(minKeys 1000) of 400 keys = %d ops; want none", len(got))
	}
	want := (maxTxnOps - epochOps) / 2 // two keys an op: its item and its owner record
	if got := c.take(64); len(got) != want || len(c.queue) != 200-want {
		t.Errorf("take of 200 ops = %d ops, %d left; want %d in one transaction", len(got), len(c.queue),
			want)
	}

	c.queue = nil
	gone, done := testOp("D", "k4"), make(chan struct{})
	gone.cancel = done
	close(done)
	c.queue = []*op{gone, testOp("E", "k5")}
	if got := c.take(1); len(got) != 1 || got[0].ownerKey != "E" {
		t.Errorf("take with a canceled op = %v; want only E's", got)
	}
	if r := <-gone.res; !errors.Is(r.err, context.Canceled) {
		t.Errorf("canceled op's result = %v; want context.Canceled", r.err)
	}
}
