package allocator

import (
	"net/netip"
	"slices"
	"time"
)

// The requests of the group committer: an op is what one Allocate or Assign asks to
// write, a pick one of its items.

// op is one request to the group committer: items for one owner, written in one
// transaction with the owner's record.
type op struct {
	owner    Owner
	ownerKey string
	assign   bool   // Assign: do not record the request for replay
	hash     string // Allocate: the request's idempotency hash
	picks    []*pick
	// epoch is the epoch the call began in: its transactions compare it (epoch.go).
	epoch epoch

	// ownerRev is the ModRevision of the owner's record, 0 when none is expected;
	// record is that record. next is the record the op's transaction writes (when
	// putRecord) or keeps.
	ownerRev  int64
	record    *ownerRecord
	next      *ownerRecord
	putRecord bool
	// hinted is set while ownerRev and record come from the owner hints rather than
	// from etcd: a stale hint must cost a conflict, never a wrong answer.
	hinted bool

	cancel    <-chan struct{} // the caller's ctx.Done()
	conflicts int
	rounds    int
	res       chan opResult // buffered 1
}

// pick is one item of an op.
type pick struct {
	r        *rng
	off      uint64
	item     Item
	key      string
	specific bool
	pending  bool // the op holds the pending bit of off
	held     bool // the owner holds it at modRev: a ModRevision compare, no put
	// guard is the ready ServiceCIDR an address is drawn from: the transaction
	// compares its key's revision, so that nothing is allocated from a ServiceCIDR
	// once its deletion committed.
	guard *cidrRef

	// What etcd holds once the op is done: the key's revisions and time.
	createRev, modRev int64
	at                time.Time
}

type opResult struct {
	rev      int64
	replayed bool
	ips      []netip.Addr
	ports    []int
	err      error
}

// keys is how many keys the op's transaction touches: every pick (a held one is
// compared, the others compared and put) and the owner record.
func (o *op) keys() int { return 1 + len(o.picks) }

// newGuards is how many compares of ServiceCIDRs o adds to a transaction whose keys
// (and guard keys) are in seen.
func (o *op) newGuards(seen map[string]struct{}) int {
	n := 0
	for i, p := range o.picks {
		if p.guard == nil {
			continue
		}
		if _, ok := seen[p.guard.id]; ok {
			continue
		}
		sameGuard := func(q *pick) bool { return q.guard != nil && q.guard.id == p.guard.id }
		if !slices.ContainsFunc(o.picks[:i], sameGuard) {
			n++
		}
	}
	return n
}

// release drops the op's pending bits at once: nothing of it was written.
func (o *op) release() {
	for _, p := range o.picks {
		if p.pending {
			p.r.Unpend(p.off)
			p.pending = false
		}
	}
}

func (o *op) fail(err error) {
	o.release()
	o.res <- opResult{err: err}
}
