package allocator

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// No allocation comes back: a transaction built before a release never commits after
// it. An Allocate whose transaction waited in a stalled member, while its caller's
// retry committed and the caller released everything, would otherwise land later and
// hand the owner back what it released: its compares (the owner record absent, or at
// the revision read; the item keys absent) hold again once the release deleted them.
//
//   - A full release (and repair's, a forced one and a transfer, when it empties a
//     record) keeps the owner record as a tombstone (no items) instead of deleting it: the
//     compare of any transaction built before it fails, whether it expected no record or
//     the one the release replaced. A full release that finds nothing held (no record, or
//     a tombstone) writes a tombstone anew all the same, for the same reason. An owner
//     that allocates again (a Service turned ExternalName and back) follows the
//     tombstone like any record.
//   - Tombstones are deleted after a bounded time, counted on etcd, not on a clock: the
//     epoch key <prefix>/epoch is rewritten every epochInterval by one replica (a
//     compare of its version), and every allocation and release transaction compares
//     Version(epoch) < e + epochSlack, e being the epoch its replica knew when the call
//     began, and the epoch's CreateRevision. A release records e + epochSlack (u, above
//     the epoch's version when it commits) in its index key
//     <prefix>/tombstones/<u>/<uid>; the tombstone is deleted only by a transaction
//     that compares Version(epoch) >= u + epochSlack, when every transaction built
//     before the release fails its epoch compare.
//
// A call waits at most epochSlack epochs (about 10 s) for its transaction to commit;
// tombstones live about 10 to 20 s: the keys they cost are the releases of that time.
// The epoch is the allocator's own; it has nothing to do with a leader's fence
// (package leader): every replica writes, and the epoch only bounds how old a write
// may be.

const (
	epochInterval = time.Second
	epochSlack    = 10
	// tombstoneBatch is how many tombstones one collecting transaction deletes.
	tombstoneBatch = 32
	// tombstoneRead is how many index keys a collection reads at once.
	tombstoneRead = 1024
	// collectBudget is how long a round collects at most: half of it, the calls have
	// etcd and the CPU to themselves (BenchmarkCollectTombstones: 20,000 tombstones in
	// the first two rounds that may take them, fsync off; 512 a round when a round took
	// 16 batches).
	collectBudget = epochInterval / 2
	// epochOps is how many compares epochs.cmps adds to a transaction.
	epochOps = 2
)

// epochs keeps the epoch as this replica knows it, moves it on while tombstones wait,
// and collects the tombstones that every transaction built before them can no longer
// pass (the comment above). The watch reports the epoch key's changes (seen, read);
// every write asks for the epoch it begins in (now) and compares it (cmps); run is
// its loop.
type epochs struct {
	*store
	log   *slog.Logger
	fails *failures
	// cur is the epoch key's version and CreateRevision as last seen, at at
	// (monotonicNow, when the version last moved).
	cur atomic.Pointer[epoch]
	at  atomic.Int64
	// gone is set when the key was seen deleted: run makes it anew.
	gone atomic.Bool
	// earlierSwept is the CreateRevision of the epoch key under which this replica
	// found no index key written under an earlier one (collect).
	earlierSwept atomic.Int64
	// budget is collectBudget, longer in tests.
	budget time.Duration
}

func newEpochs(st *store, log *slog.Logger, fails *failures) *epochs {
	return &epochs{store: st, log: log, fails: fails, budget: collectBudget}
}

// processStart is the reading of the monotonic clock that monotonicNow counts from.
var processStart = time.Now()

// monotonicNow is the time since the process started, on the monotonic clock: a
// wall clock stepped back does not hold the epoch still.
func monotonicNow() time.Duration { return time.Since(processStart) }

// seen records the epoch key as etcd holds it (a watch event, a read or a write): its
// version and CreateRevision, together (an epoch never pairs the version of one key
// with the CreateRevision of the next). A version never goes back for one key;
// a key made anew (a larger CreateRevision) replaces the older one's state, and the
// key's absence (0, 0) replaces whatever was seen (a stale absence only makes calls
// fail their compare and read the key again).
func (e *epochs) seen(version, create int64) {
	for {
		cur := e.cur.Load()
		if cur != nil {
			switch {
			case create != 0 && create < cur.create:
				return // an earlier key's
			case create == cur.create && version <= cur.version:
				return
			}
		}
		if e.cur.CompareAndSwap(cur, &epoch{version: version, create: create}) {
			e.at.Store(int64(monotonicNow()))
			return
		}
	}
}

// ensure creates the epoch key unless it exists, and records it.
func (e *epochs) ensure(ctx context.Context) error {
	resp, err := e.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(e.epochKey), "=", 0)).
		Then(clientv3.OpPut(e.epochKey, "")).Else(clientv3.OpGet(e.epochKey)).Commit()
	if err != nil {
		return fmt.Errorf("epoch key %s: %w", e.epochKey, err)
	}
	if resp.Succeeded {
		e.seen(1, resp.Header.Revision)
		return nil
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		e.seen(kvs[0].Version, kvs[0].CreateRevision)
	}
	return nil
}

// epoch is the epoch a call began in: the epoch key's version and CreateRevision as
// its replica knew them.
type epoch struct{ version, create int64 }

// now is the epoch of a call that begins now.
func (e *epochs) now() epoch {
	if cur := e.cur.Load(); cur != nil {
		return *cur
	}
	return epoch{}
}

// cmps are the compares of a transaction begun in ep: it commits only while the epoch
// key is the same key and its version below ep.version + epochSlack.
func (e *epochs) cmps(ep epoch) []clientv3.Cmp {
	return []clientv3.Cmp{versionBelow(e.epochKey, ep.version+epochSlack), createdAt(e.epochKey, ep.create)}
}

// outlived reports whether the epoch key as read (kv, nil when absent) is past the
// epoch ep: a call begun in ep is then too old to commit and must be begun again.
func (e *epochs) outlived(kv *mvccpb.KeyValue, ep epoch) bool {
	e.seenKV(kv)
	if kv == nil {
		return ep.create != 0
	}
	return kv.Version >= ep.version+epochSlack || kv.CreateRevision != ep.create
}

// seenKV records the epoch key as read (kv nil: absent, deleted by a release while etcd
// was out of space). While it is absent, calls compare its absence (CreateRevision 0):
// every transaction built before the delete compares a CreateRevision that is not 0,
// and fails; run makes the key anew once etcd takes writes.
func (e *epochs) seenKV(kv *mvccpb.KeyValue) {
	if kv == nil {
		e.gone.Store(true)
		e.seen(0, 0)
		return
	}
	e.seen(kv.Version, kv.CreateRevision)
}

// noSpaceWrites rewrites writes, those of a release that makes tombstones of the
// records under the keys tombs, for an etcd out of space, which refuses every put: the
// tombstones (and their index keys) become deletions of the records, and the epoch key
// is deleted, which fails every transaction built before the release as surely (their
// compare of its CreateRevision). It reports false when writes put anything else (a
// record that keeps items).
func (e *epochs) noSpaceWrites(writes []clientv3.Op, tombs []string) ([]clientv3.Op, bool) {
	out := make([]clientv3.Op, 0, len(writes)+1)
	for _, w := range writes {
		switch k := string(w.KeyBytes()); {
		case !w.IsPut():
			out = append(out, w)
		case strings.HasPrefix(k, e.tombPrefix):
		case slices.Contains(tombs, k):
			out = append(out, clientv3.OpDelete(k))
		default:
			return nil, false // a record that keeps items: a put
		}
	}
	return append(out, clientv3.OpDelete(e.epochKey)), true
}

// tombstone returns the writes that turn uid's record (rec, as read) into a tombstone
// and index it for collection, in a transaction begun in ep (it compares ep: the epoch
// is below ep.version + epochSlack when it commits).
func (e *epochs) tombstone(uid string, rec *ownerRecord, ep epoch) []clientv3.Op {
	t := &ownerRecord{Namespace: rec.Namespace, Name: rec.Name, UID: uid}
	return []clientv3.Op{
		clientv3.OpPut(e.ownerKey(uid), string(appendOwnerRecord(nil, t))),
		clientv3.OpPut(e.tombstoneKey(ep.version+epochSlack, uid), ""),
	}
}

// run moves the epoch on every epochInterval (when no replica has for that long) while
// tombstones wait to be collected, and collects those it makes old enough, until ctx
// ends. An idle allocd writes nothing. A deleted epoch key (a release while etcd is out
// of space deletes it) is made anew. A step that fails is logged at warning and
// counted (allocd_allocator_epoch_failures_total{step}): a replica that keeps failing
// here leaves tombstones piling up.
func (e *epochs) run(ctx context.Context) {
	t := time.NewTicker(epochInterval / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if e.gone.Load() {
			if err := e.ensure(ctx); err != nil {
				e.failed(ctx, stepRecreate, err)
				continue
			}
			e.fails.ok(stepRecreate)
			e.gone.Store(false)
		}
		if monotonicNow()-time.Duration(e.at.Load()) < epochInterval {
			continue
		}
		_ = e.round(ctx) // recorded by its step
	}
}

// The steps of the epoch's loop, as the failures metric labels them.
const (
	stepRecreate = "recreate" // make a deleted epoch key anew
	stepCount    = "count"    // count the tombstones that wait
	stepBump     = "bump"     // move the epoch on
	stepCollect  = "collect"  // collect the tombstones the epoch has passed
)

// epochSteps are the steps of the epoch's loop.
var epochSteps = []string{stepRecreate, stepCount, stepBump, stepCollect}

// failed records a failure of step (unless ctx ended: allocd stopping) and returns it.
func (e *epochs) failed(ctx context.Context, step string, err error) error {
	if ctx.Err() == nil {
		e.fails.fail(step, "epoch step failed; tombstones wait longer", err)
	}
	return fmt.Errorf("epoch %s: %w", step, err)
}

// round moves the epoch on and collects tombstones, when any wait. A step that fails
// is recorded, and its error returned.
func (e *epochs) round(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, epochInterval)
	defer cancel()
	resp, err := e.cli.Get(cctx, e.tombPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return e.failed(ctx, stepCount, err)
	}
	e.fails.ok(stepCount)
	if resp.Count == 0 {
		return nil
	}
	bumped, err := e.bump(ctx)
	if err != nil {
		return e.failed(ctx, stepBump, err)
	}
	e.fails.ok(stepBump)
	if !bumped {
		return nil
	}
	if err := e.collect(ctx); err != nil {
		return e.failed(ctx, stepCollect, err)
	}
	e.fails.ok(stepCollect)
	return nil
}

// bump rewrites the epoch key if it is at the version this replica knows; it reports
// whether it did.
func (e *epochs) bump(ctx context.Context) (bool, error) {
	ep := e.now()
	v, c := ep.version, ep.create
	cctx, cancel := context.WithTimeout(ctx, epochInterval)
	defer cancel()
	resp, err := e.cli.Txn(cctx).If(clientv3.Compare(clientv3.Version(e.epochKey), "=", v),
		clientv3.Compare(clientv3.CreateRevision(e.epochKey), "=", c)).
		Then(clientv3.OpPut(e.epochKey, "")).Else(clientv3.OpGet(e.epochKey)).Commit()
	if err != nil {
		return false, err
	}
	if resp.Succeeded {
		e.seen(v+1, c)
		return true, nil
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		e.seen(kvs[0].Version, kvs[0].CreateRevision)
		return false, nil
	}
	return false, e.ensure(cctx)
}

// collect deletes the tombstones that every transaction built before them can no longer
// pass (their epoch compare fails), a batch at a time, and the index keys of owners
// that allocated again since: those written under an earlier epoch key (ModRevision
// below its CreateRevision: every transaction built before it was made fails its
// compare), and those of this one whose u + epochSlack the epoch has reached. It
// collects all it may, unless a batch's transaction fails its compares (an owner
// allocated again since its record was read, another replica collected first, the epoch
// key was made anew): the next round reads them again. Every key read is deleted when
// its batch commits, so each read moves on. A round stops after e.budget
// (collectBudget) and leaves the rest to the next.
//
// The index keys of an earlier epoch key are found with a ModRevision filter, which
// makes etcd read every index key (it applies a limit only to the response): that is
// done until a read finds none (no later write can have a ModRevision below the key's
// CreateRevision), then not again until the key is made anew; every round, a mass
// release would cost a read of every waiting tombstone's key per batch.
func (e *epochs) collect(ctx context.Context) error {
	until := time.Now().Add(e.budget)
	ep := e.now()
	v, c := ep.version, ep.create
	for e.earlierSwept.Load() != c && time.Now().Before(until) {
		// A limit bounds the response (etcd ignores it while it reads, with a filter).
		resp, err := e.cli.Get(ctx, e.tombPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithMaxModRev(c-1), clientv3.WithLimit(tombstoneRead))
		if err != nil {
			return err
		}
		if len(resp.Kvs) == 0 {
			e.earlierSwept.Store(c)
			break
		}
		done, err := e.collectBatches(ctx, resp.Kvs, c, false, until)
		if err != nil {
			return err
		}
		if !done {
			break // read again next round; the collection by version goes on
		}
	}
	if v < epochSlack {
		return nil
	}
	end := e.tombPrefix + fmt.Sprintf("%020d", v-epochSlack+1)
	for time.Now().Before(until) {
		resp, err := e.cli.Get(ctx, e.tombPrefix, clientv3.WithRange(end), clientv3.WithKeysOnly(),
			clientv3.WithLimit(tombstoneRead))
		if err != nil || len(resp.Kvs) == 0 {
			return err
		}
		if done, err := e.collectBatches(ctx, resp.Kvs, c, true, until); !done || err != nil || !resp.More {
			return err
		}
	}
	return nil
}

// collectBatches is collectBatch over keys, tombstoneBatch at a time; it stops at the
// first batch whose transaction fails its compares, or at until, and reports whether it
// went through them all.
func (e *epochs) collectBatches(ctx context.Context, keys []*mvccpb.KeyValue, create int64,
	byVersion bool, until time.Time) (bool, error) {
	for len(keys) > 0 {
		if time.Now().After(until) {
			return false, nil
		}
		n := min(len(keys), tombstoneBatch)
		if ok, err := e.collectBatch(ctx, keys[:n], create, byVersion); !ok || err != nil {
			return false, err
		}
		keys = keys[n:]
	}
	return true, nil
}

// collectBatch deletes the tombstones of a batch of index keys (and the keys, each at
// the revision read: a key of the same name written since indexes another tombstone),
// under the epoch key of CreateRevision create and, with byVersion, at a version past
// every key's u + epochSlack; it reports whether the transaction's compares held. A
// key of no index key's form (allocd writes none) is deleted alone: left, it would be
// read again by every collection.
func (e *epochs) collectBatch(ctx context.Context, keys []*mvccpb.KeyValue, create int64,
	byVersion bool) (bool, error) {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(e.epochKey), "=", create)}
	var dels []clientv3.Op
	var uids []string
	var us, revs []int64
	for _, kv := range keys {
		k := string(kv.Key)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", kv.ModRevision))
		dels = append(dels, clientv3.OpDelete(k))
		us0, uid, ok := strings.Cut(strings.TrimPrefix(k, e.tombPrefix), "/")
		u, err := strconv.ParseInt(us0, 10, 64)
		if ok && err == nil {
			uids, us, revs = append(uids, uid), append(us, u), append(revs, kv.ModRevision)
		}
	}
	recs, err := e.readRecords(ctx, uids, 0)
	if err != nil {
		return false, err
	}
	maxU := int64(0)
	for i, uid := range uids {
		// The tombstone this key indexes was written with it, at its revision; a record
		// at another revision is another tombstone (indexed by its own key) or the
		// owner's allocations since: only the index key goes.
		st := recs[uid]
		if st.rec == nil || st.rec.items() > 0 || st.rev != revs[i] {
			continue
		}
		maxU = max(maxU, us[i])
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(e.ownerKey(uid)), "=", st.rev))
		dels = append(dels, clientv3.OpDelete(e.ownerKey(uid)))
	}
	if byVersion {
		cmps = append(cmps, clientv3.Compare(clientv3.Version(e.epochKey), ">", maxU+epochSlack-1))
	}
	resp, err := e.cli.Txn(ctx).If(cmps...).Then(dels...).Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}
