package allocator

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
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
//   - A full release (and repair's, and a forced one, when it empties a record) keeps
//     the owner record as a tombstone (no items) instead of deleting it: the compare of
//     any transaction built before it fails, whether it expected no record or the one
//     the release replaced. A full release that finds nothing held (no record, or a
//     tombstone) writes a tombstone anew all the same, for the same reason. An owner
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
	// fenceOps is how many compares fenceCmps adds to a transaction.
	fenceOps = 2
)

// processStart is the reading of the monotonic clock that monotonicNow counts from.
var processStart = time.Now()

// monotonicNow is the time since the process started, on the monotonic clock: a
// wall clock stepped back does not hold the epoch still.
func monotonicNow() time.Duration { return time.Since(processStart) }

// epochSeen records the epoch key as etcd holds it (a watch event, a read or a
// write): its version and CreateRevision, together (a fence never pairs the version of
// one key with the CreateRevision of the next). A version never goes back for one key;
// a key made anew (a larger CreateRevision) replaces the older one's state, and the
// key's absence (0, 0) replaces whatever was seen (a stale absence only makes calls
// fail their compare and read the key again).
func (a *Allocator) epochSeen(version, create int64) {
	for {
		cur := a.epoch.Load()
		if cur != nil {
			switch {
			case create != 0 && create < cur.create:
				return // an earlier key's
			case create == cur.create && version <= cur.version:
				return
			}
		}
		if a.epoch.CompareAndSwap(cur, &fence{version: version, create: create}) {
			a.epochAt.Store(int64(monotonicNow()))
			return
		}
	}
}

// ensureEpoch creates the epoch key unless it exists, and records it.
func (a *Allocator) ensureEpoch(ctx context.Context) error {
	resp, err := a.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(a.epochKey), "=", 0)).
		Then(clientv3.OpPut(a.epochKey, "")).Else(clientv3.OpGet(a.epochKey)).Commit()
	if err != nil {
		return fmt.Errorf("epoch key %s: %w", a.epochKey, err)
	}
	if resp.Succeeded {
		a.epochSeen(1, resp.Header.Revision)
		return nil
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		a.epochSeen(kvs[0].Version, kvs[0].CreateRevision)
	}
	return nil
}

// fence is the epoch a call began in: the epoch key's version and CreateRevision as
// its replica knew them.
type fence struct{ version, create int64 }

// fenceNow is the fence of a call that begins now.
func (a *Allocator) fenceNow() fence {
	if f := a.epoch.Load(); f != nil {
		return *f
	}
	return fence{}
}

// fenceCmps are the compares of a transaction fenced at f: it commits only while the
// epoch key is the same key and its version below f.version + epochSlack.
func (a *Allocator) fenceCmps(f fence) []clientv3.Cmp {
	return []clientv3.Cmp{versionBelow(a.epochKey, f.version+epochSlack), createdAt(a.epochKey, f.create)}
}

// fenceFailed reports whether the epoch key as read (kv, nil when absent) fails the
// fence f: the call is then too old to commit and must be begun again.
func (a *Allocator) fenceFailed(kv *mvccpb.KeyValue, f fence) bool {
	a.epochRead(kv)
	if kv == nil {
		return f.create != 0
	}
	return kv.Version >= f.version+epochSlack || kv.CreateRevision != f.create
}

// epochRead records the epoch key as read (kv nil: absent, deleted by a release
// while etcd was out of space). While it is absent, calls are fenced by its absence
// (CreateRevision 0): every transaction built before the delete compares a CreateRevision
// that is not 0, and fails; the epoch loop makes the key anew once etcd takes writes.
func (a *Allocator) epochRead(kv *mvccpb.KeyValue) {
	if kv == nil {
		a.epochGone.Store(true)
		a.epochSeen(0, 0)
		return
	}
	a.epochSeen(kv.Version, kv.CreateRevision)
}

func (s *store) tombstoneKey(u int64, uid string) string {
	return s.tombPrefix + fmt.Sprintf("%020d", u) + "/" + uid
}

// noSpaceWrites rewrites the writes of a release for an etcd out of space, which
// refuses every put: the tombstones (and their index keys) become deletions of the
// records, and the epoch key is deleted, which fails every transaction built before
// the release as surely (their compare of its CreateRevision).
func (a *Allocator) noSpaceWrites(t *releaseTxn) ([]clientv3.Op, bool) {
	out := make([]clientv3.Op, 0, len(t.writes)+1)
	for _, w := range t.writes {
		switch k := string(w.KeyBytes()); {
		case !w.IsPut():
			out = append(out, w)
		case strings.HasPrefix(k, a.tombPrefix):
		case slices.Contains(t.tombs, k):
			out = append(out, clientv3.OpDelete(k))
		default:
			return nil, false // a record that keeps items: a put
		}
	}
	return append(out, clientv3.OpDelete(a.epochKey)), true
}

// tombstone returns the writes that turn uid's record (rec, as read) into a tombstone
// and index it for collection, in a transaction fenced at f: the epoch is below
// f.version + epochSlack when it commits.
func (a *Allocator) tombstone(uid string, rec *ownerRecord, f fence) []clientv3.Op {
	t := &ownerRecord{Namespace: rec.Namespace, Name: rec.Name, UID: uid}
	return []clientv3.Op{
		clientv3.OpPut(a.ownerKey(uid), string(appendOwnerRecord(nil, t))),
		clientv3.OpPut(a.tombstoneKey(f.version+epochSlack, uid), ""),
	}
}

// epochLoop moves the epoch on every epochInterval (when no replica has for that
// long) while tombstones wait to be collected, and collects those it makes old enough,
// until ctx ends. An idle allocd writes nothing. A deleted epoch key (a release while
// etcd is out of space deletes it) is made anew.
func (a *Allocator) epochLoop(ctx context.Context) {
	t := time.NewTicker(epochInterval / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if a.epochGone.Load() {
			if err := a.ensureEpoch(ctx); err != nil {
				a.log.Debug("epoch key not made anew", "err", err)
				continue
			}
			a.epochGone.Store(false)
		}
		if monotonicNow()-time.Duration(a.epochAt.Load()) < epochInterval {
			continue
		}
		if err := a.epochRound(ctx); err != nil {
			a.log.Debug("epoch round", "err", err)
		}
	}
}

// epochRound moves the epoch on and collects tombstones, when any wait.
func (a *Allocator) epochRound(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, epochInterval)
	defer cancel()
	resp, err := a.cli.Get(cctx, a.tombPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count == 0 {
		return err
	}
	bumped, err := a.bumpEpoch(ctx)
	if err != nil || !bumped {
		return err
	}
	return a.collectTombstones(ctx)
}

// bumpEpoch rewrites the epoch key if it is at the version this replica knows; it
// reports whether it did.
func (a *Allocator) bumpEpoch(ctx context.Context) (bool, error) {
	f := a.fenceNow()
	v, c := f.version, f.create
	cctx, cancel := context.WithTimeout(ctx, epochInterval)
	defer cancel()
	resp, err := a.cli.Txn(cctx).If(clientv3.Compare(clientv3.Version(a.epochKey), "=", v),
		clientv3.Compare(clientv3.CreateRevision(a.epochKey), "=", c)).
		Then(clientv3.OpPut(a.epochKey, "")).Else(clientv3.OpGet(a.epochKey)).Commit()
	if err != nil {
		return false, err
	}
	if resp.Succeeded {
		a.epochSeen(v+1, c)
		return true, nil
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		a.epochSeen(kvs[0].Version, kvs[0].CreateRevision)
		return false, nil
	}
	return false, a.ensureEpoch(cctx)
}

// collectTombstones deletes the tombstones whose every earlier transaction is fenced
// off, a batch at a time, and the index keys of owners that allocated again since:
// those written under an earlier epoch key (ModRevision below its CreateRevision:
// every transaction built before it was made fails its compare), and those of this
// one whose u + epochSlack the epoch has reached. It collects all it may, unless a
// batch's transaction fails its compares (an owner allocated again since its record was
// read, another replica collected first, the epoch key was made anew): the next round
// reads them again. Every key read is deleted when its batch commits, so each read
// moves on. A round stops after a.collectBudget (collectBudget) and leaves the rest to
// the next.
//
// The index keys of an earlier epoch key are found with a ModRevision filter, which
// makes etcd read every index key (it applies a limit only to the response): that is
// done until a read finds none (no later write can have a ModRevision below the key's
// CreateRevision), then not again until the key is made anew; every round, a mass
// release would cost a read of every waiting tombstone's key per batch.
func (a *Allocator) collectTombstones(ctx context.Context) error {
	until := time.Now().Add(a.collectBudget)
	f := a.fenceNow()
	v, c := f.version, f.create
	for a.earlierSwept.Load() != c && time.Now().Before(until) {
		// A limit bounds the response (etcd ignores it while it reads, with a filter).
		resp, err := a.cli.Get(ctx, a.tombPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithMaxModRev(c-1), clientv3.WithLimit(tombstoneRead))
		if err != nil {
			return err
		}
		if len(resp.Kvs) == 0 {
			a.earlierSwept.Store(c)
			break
		}
		done, err := a.collectBatches(ctx, resp.Kvs, c, false, until)
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
	end := a.tombPrefix + fmt.Sprintf("%020d", v-epochSlack+1)
	for time.Now().Before(until) {
		resp, err := a.cli.Get(ctx, a.tombPrefix, clientv3.WithRange(end), clientv3.WithKeysOnly(),
			clientv3.WithLimit(tombstoneRead))
		if err != nil || len(resp.Kvs) == 0 {
			return err
		}
		if done, err := a.collectBatches(ctx, resp.Kvs, c, true, until); !done || err != nil || !resp.More {
			return err
		}
	}
	return nil
}

// collectBatches is collectBatch over keys, tombstoneBatch at a time; it stops at the
// first batch whose transaction fails its compares, or at until, and reports whether it
// went through them all.
func (a *Allocator) collectBatches(ctx context.Context, keys []*mvccpb.KeyValue, create int64,
	byVersion bool, until time.Time) (bool, error) {
	for len(keys) > 0 {
		if time.Now().After(until) {
			return false, nil
		}
		n := min(len(keys), tombstoneBatch)
		if ok, err := a.collectBatch(ctx, keys[:n], create, byVersion); !ok || err != nil {
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
func (a *Allocator) collectBatch(ctx context.Context, keys []*mvccpb.KeyValue, create int64,
	byVersion bool) (bool, error) {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(a.epochKey), "=", create)}
	var dels []clientv3.Op
	var uids []string
	var us, revs []int64
	for _, kv := range keys {
		k := string(kv.Key)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", kv.ModRevision))
		dels = append(dels, clientv3.OpDelete(k))
		us0, uid, ok := strings.Cut(strings.TrimPrefix(k, a.tombPrefix), "/")
		u, err := strconv.ParseInt(us0, 10, 64)
		if ok && err == nil {
			uids, us, revs = append(uids, uid), append(us, u), append(revs, kv.ModRevision)
		}
	}
	recs, err := a.readRecords(ctx, uids, 0)
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
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(a.ownerKey(uid)), "=", st.rev))
		dels = append(dels, clientv3.OpDelete(a.ownerKey(uid)))
	}
	if byVersion {
		cmps = append(cmps, clientv3.Compare(clientv3.Version(a.epochKey), ">", maxU+epochSlack-1))
	}
	resp, err := a.cli.Txn(ctx).If(cmps...).Then(dels...).Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}
