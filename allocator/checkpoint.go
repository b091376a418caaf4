package allocator

import (
	"bytes"
	"compress/flate"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/bits-and-blooms/bitset"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Checkpoints of the index: each range's used bitset at one revision, so that a
// replica starts by reading a few keys and the watch's events since that revision
// instead of listing every allocation (a million keys: tens of seconds).
//
//	<prefix>/checkpoints/head                 {"rev":R,"id":..,"time":..,
//	                                           "ranges":[{"name","size","used","parts","crc32"}]}
//	<prefix>/checkpoints/data/<R, 20 digits>-<id>/<n, 6 digits>
//	                                          a part (at most 256 KiB) of the ranges' bitsets in
//	                                          the head's order, each the flate-compressed
//	                                          little-endian words of the set
//
// The watch goroutine takes the snapshot between two watch responses, when the index
// is exactly what etcd held at the revision it reflects; a goroutine of Run writes it:
// the parts first, then the head under a compare of the head's ModRevision (another
// replica's newer checkpoint wins), deleting the parts of older checkpoints in the
// same transaction. A replica that starts reads the whole prefix at one revision, the
// ServiceCIDRs at R, checks each range's size, count and CRC, and replays the item
// keys' events from R+1 to the revision it read; when R is compacted, or anything
// does not match, it lists every allocation instead (reload).

const (
	// checkpointEvery is how many item changes the index applies before it writes a
	// checkpoint; checkpointMaxAge how long it waits at most for fewer (one at least).
	checkpointEvery  = 20_000
	checkpointMaxAge = 30 * time.Second
	// checkpointMinGap spaces checkpoints of different replicas: a replica that reads
	// a head younger than that leaves it be.
	checkpointMinGap = 2 * time.Second
	// checkpointIdle is how old a checkpoint may grow while nothing changes, so that
	// its revision stays younger than etcd's compaction (allocd's default interval is
	// 5 minutes) and a restart can replay from it.
	checkpointIdle = 2 * time.Minute
	// checkpointPart bounds a data key's value (etcd takes requests up to 1.5 MiB).
	checkpointPart = 256 << 10
)

// indexSnapshot is the used sets of the index at rev, after changes item changes
// since the last one.
type indexSnapshot struct {
	rev     int64
	changes int
	// prev is the revision of this replica's snapshot before it: its changes are
	// those after prev.
	prev   int64
	ranges []snapRange
}

type snapRange struct {
	name string
	size uint64
	used *bitset.BitSet
}

// checkpointFormat is the format of the checkpoints this allocd writes and reads: the
// head's fields and each range's parts, the flate-compressed words of its used bitset.
// A replica reads only a checkpoint of its own format and lists every allocation
// otherwise, so that a rolling upgrade that changes the format never loads an index
// from bytes it misreads (a replica of one format may overwrite the other's checkpoint:
// the newest wins, and the other lists at its next start).
const checkpointFormat = 1

// checkpointHead is the JSON of the head key.
type checkpointHead struct {
	Format int               `json:"format"`
	Rev    int64             `json:"rev"`
	ID     string            `json:"id"` // of the writer: the parts' directory
	Time   time.Time         `json:"time"`
	Ranges []checkpointRange `json:"ranges"`
}

type checkpointRange struct {
	Name  string `json:"name"`
	Size  uint64 `json:"size"`
	Used  uint64 `json:"used"`
	Parts int    `json:"parts"`
	CRC   uint32 `json:"crc32"`
}

// checkpointDir is the prefix of the parts of the checkpoint at rev written by the
// writer id: two replicas that write one of the same revision at once never touch
// each other's parts.
func (s *store) checkpointDir(rev int64, id string) string {
	return fmt.Sprintf("%s%020d-%s/", s.cpDataPrefix, rev, id)
}

func (s *store) checkpointDataKey(rev int64, id string, n int) string {
	return fmt.Sprintf("%s%06d", s.checkpointDir(rev, id), n)
}

// snapshotIndex copies the used sets of every range. Only the goroutine that applies
// the watch's events (or New, before Run) calls it: the copy is then the index at
// a.progress.Rev().
func (a *Allocator) snapshotIndex() *indexSnapshot {
	t := a.tab.Load()
	snap := &indexSnapshot{rev: a.progress.Rev()}
	for _, r := range t.all {
		snap.ranges = append(snap.ranges, snapRange{name: r.name, size: r.Size(), used: r.CopyUsed()})
	}
	return snap
}

// encodeSnapshot returns the head and the data parts of snap.
func encodeSnapshot(snap *indexSnapshot, now time.Time) (checkpointHead, [][]byte, error) {
	head := checkpointHead{Format: checkpointFormat, Rev: snap.rev, Time: now}
	var parts [][]byte
	var raw []byte
	for _, sr := range snap.ranges {
		words := sr.used.Words()
		raw = slices.Grow(raw[:0], 8*len(words)) // at once: a /8 is 2 MiB of words
		for _, w := range words {
			raw = binary.LittleEndian.AppendUint64(raw, w)
		}
		var buf bytes.Buffer
		zw, err := flate.NewWriter(&buf, flate.BestSpeed)
		if err != nil {
			return head, nil, err
		}
		zw.Write(raw)
		if err := zw.Close(); err != nil {
			return head, nil, err
		}
		z := buf.Bytes()
		cr := checkpointRange{Name: sr.name, Size: sr.size, Used: uint64(sr.used.Count()),
			CRC: crc32.ChecksumIEEE(raw)}
		for len(z) > 0 || cr.Parts == 0 {
			n := min(len(z), checkpointPart)
			parts = append(parts, z[:n])
			z = z[n:]
			cr.Parts++
		}
		head.Ranges = append(head.Ranges, cr)
	}
	return head, parts, nil
}

// writeCheckpoint writes snap unless etcd holds one as new, or one younger than
// checkpointMinGap; it reports whether it wrote it.
func (a *Allocator) writeCheckpoint(ctx context.Context, snap *indexSnapshot) (bool, error) {
	resp, err := a.cli.Get(ctx, a.cpHeadKey)
	if err != nil {
		return false, fmt.Errorf("read checkpoint head: %w", err)
	}
	headCmp := clientv3.Compare(clientv3.CreateRevision(a.cpHeadKey), "=", 0)
	if len(resp.Kvs) > 0 {
		var old checkpointHead
		young := func(d time.Duration) bool { return time.Since(old.Time) < d && old.Time.Before(time.Now()) }
		if json.Unmarshal(resp.Kvs[0].Value, &old) == nil &&
			(old.Rev >= snap.rev || young(a.cpMinGap) || snap.changes == 0 && young(checkpointIdle)) {
			if old.Rev <= snap.prev || snap.prev == 0 && old.Rev < snap.rev {
				// Left for a head younger than the gap that has none of its changes (this
				// replica's own last one, typically): they count again, and the watch hands
				// a newer one after the gap (a burst of releases otherwise left the head
				// before it until checkpointMaxAge, and a restart replayed the whole burst).
				// A head another replica wrote since holds them: nothing to carry, or
				// every replica would write one checkpoint each. (A replica's first
				// snapshot carries unless the head is as new.)
				a.cpCarry.Add(int64(snap.changes))
			}
			return false, nil
		}
		headCmp = clientv3.Compare(clientv3.ModRevision(a.cpHeadKey), "=", resp.Kvs[0].ModRevision)
	}
	head, parts, err := encodeSnapshot(snap, time.Now())
	if err != nil {
		return false, err
	}
	head.ID = strconv.FormatUint(rand.Uint64(), 36)
	for i, p := range parts {
		if _, err := a.cli.Put(ctx, a.checkpointDataKey(snap.rev, head.ID, i), string(p)); err != nil {
			return false, fmt.Errorf("write checkpoint at %d: %w", snap.rev, err)
		}
	}
	hv, err := json.Marshal(head)
	if err != nil {
		return false, err
	}
	// Won: the parts of every older checkpoint go (and those of writers that lost);
	// lost: this writer's parts go.
	older := fmt.Sprintf("%s%020d", a.cpDataPrefix, snap.rev)
	tr, err := a.cli.Txn(ctx).If(headCmp).
		Then(clientv3.OpPut(a.cpHeadKey, string(hv)),
			clientv3.OpDelete(a.cpDataPrefix, clientv3.WithRange(older))).
		Else(clientv3.OpDelete(a.checkpointDir(snap.rev, head.ID), clientv3.WithPrefix())).Commit()
	if err != nil {
		return false, fmt.Errorf("write checkpoint head at %d: %w", snap.rev, err)
	}
	return tr.Succeeded, nil
}

// errNoCheckpoint says that a checkpoint cannot be used: the index is listed instead.
var errNoCheckpoint = errors.New("no usable checkpoint")

// loadCheckpoint builds the index from the checkpoint etcd holds and the events
// since, up to the revision of its first read. It fails with errNoCheckpoint (wrapped)
// when there is none, it does not match the ranges, or its revision is compacted.
func (a *Allocator) loadCheckpoint(ctx context.Context) error {
	resp, err := a.get(ctx, a.cpPrefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("read checkpoint: %w", err)
	}
	now := resp.Header.Revision
	var head checkpointHead
	data := map[string][]byte{}
	found := false
	for _, kv := range resp.Kvs {
		if string(kv.Key) == a.cpHeadKey {
			if err := json.Unmarshal(kv.Value, &head); err != nil {
				return fmt.Errorf("%w: head: %v", errNoCheckpoint, err)
			}
			found = true
			continue
		}
		data[string(kv.Key)] = kv.Value
	}
	if !found || head.Rev <= 0 {
		return errNoCheckpoint
	}
	if head.Format != checkpointFormat {
		return fmt.Errorf("%w: format %d, this allocd reads %d", errNoCheckpoint, head.Format,
			checkpointFormat)
	}
	if rev := a.progress.Rev(); rev > head.Rev {
		// An earlier try of the start brought the index past the checkpoint: the
		// catch-up from here would skip the events between the two.
		return fmt.Errorf("%w: the index is at %d, past the checkpoint's %d", errNoCheckpoint, rev, head.Rev)
	}
	used, err := a.decodeCheckpoint(head, data)
	if err != nil {
		return err
	}
	cresp, err := a.cli.Get(ctx, a.cidrPrefix, clientv3.WithPrefix(), clientv3.WithRev(head.Rev))
	if err != nil {
		if errors.Is(err, rpctypes.ErrCompacted) {
			return fmt.Errorf("%w: revision %d compacted", errNoCheckpoint, head.Rev)
		}
		return fmt.Errorf("load ServiceCIDRs at %d: %w", head.Rev, err)
	}
	t, _ := a.buildTable(a.decodeCIDRs(cresp.Kvs))
	for _, r := range t.all {
		u, ok := used[r.name]
		if !ok || u.Len() != uint(r.Size()) {
			return fmt.Errorf("%w: range %s not in the checkpoint at %d", errNoCheckpoint, r.name, head.Rev)
		}
		r.Replace(u)
	}
	a.tab.Store(t)
	a.advance(head.Rev)
	if err := a.catchUp(ctx, now); err != nil {
		return err
	}
	a.log.Info("index loaded from a checkpoint", "checkpoint_revision", head.Rev, "revision",
		a.progress.Rev())
	return nil
}

// decodeCheckpoint returns the used set of each range of head, checked against its
// size, count and CRC.
func (a *Allocator) decodeCheckpoint(head checkpointHead,
	data map[string][]byte) (map[string]*bitset.BitSet, error) {
	out := make(map[string]*bitset.BitSet, len(head.Ranges))
	n := 0
	for _, cr := range head.Ranges {
		var z []byte
		for range cr.Parts {
			p, ok := data[a.checkpointDataKey(head.Rev, head.ID, n)]
			if !ok {
				return nil, fmt.Errorf("%w: part %d of %d missing", errNoCheckpoint, n, head.Rev)
			}
			z = append(z, p...)
			n++
		}
		raw, err := io.ReadAll(flate.NewReader(bytes.NewReader(z)))
		if err != nil {
			return nil, fmt.Errorf("%w: range %s: %v", errNoCheckpoint, cr.Name, err)
		}
		words := (cr.Size + 63) / 64
		if uint64(len(raw)) != 8*words || crc32.ChecksumIEEE(raw) != cr.CRC {
			return nil, fmt.Errorf("%w: range %s: size or checksum differs", errNoCheckpoint, cr.Name)
		}
		ws := make([]uint64, words)
		for i := range ws {
			ws[i] = binary.LittleEndian.Uint64(raw[8*i:])
		}
		u := bitset.FromWithLength(uint(cr.Size), ws)
		if uint64(u.Count()) != cr.Used {
			return nil, fmt.Errorf("%w: range %s: count differs", errNoCheckpoint, cr.Name)
		}
		out[cr.Name] = u
	}
	return out, nil
}

// catchUp applies the item keys' events after the index's revision until it reaches
// target, asking etcd for progress notifications to get past writes elsewhere.
func (a *Allocator) catchUp(ctx context.Context, target int64) error {
	if a.progress.Rev() >= target {
		return nil
	}
	from := a.progress.Rev() + 1
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := a.cli.Watch(wctx, a.watchStart, clientv3.WithRange(a.watchEnd), clientv3.WithRev(from))
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for a.progress.Rev() < target {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			a.cli.RequestProgress(wctx)
		case resp, ok := <-wch:
			switch {
			case !ok:
				return fmt.Errorf("catch up from %d: watch closed", from)
			case resp.CompactRevision != 0:
				return fmt.Errorf("%w: revision %d compacted (at %d)", errNoCheckpoint, from,
					resp.CompactRevision)
			case resp.Err() != nil:
				return fmt.Errorf("catch up from %d: %w", from, resp.Err())
			case resp.IsProgressNotify():
				a.advance(resp.Header.Revision)
				continue
			}
			if err := a.apply(ctx, resp.Events); err != nil {
				return err
			}
		}
	}
	return nil
}

// load builds the index: from the checkpoint when one can be used, else by listing
// every allocation; it says which in the log.
func (a *Allocator) load(ctx context.Context) error {
	start := time.Now()
	err := a.loadCheckpoint(ctx)
	if err == nil {
		a.loadedFrom = "checkpoint"
		a.log.Info("index loaded", "from", "checkpoint", "took", time.Since(start).Round(time.Millisecond))
		return nil
	}
	if !errors.Is(err, errNoCheckpoint) {
		return err
	}
	a.log.Info("listing every allocation", "reason", err.Error())
	if err := a.reload(ctx); err != nil {
		return err
	}
	// As many changes as items listed: a large store writes a checkpoint at once, a
	// small one after its first changes.
	for _, r := range a.tab.Load().all {
		used, _ := r.Counts()
		a.cpChanges += int(used)
	}
	a.loadedFrom = "list"
	a.log.Info("index loaded", "from", "list", "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// maybeCheckpoint hands a snapshot of the index to the checkpoint writer when enough
// changed, or anything changed long enough ago. The watch goroutine calls it.
func (a *Allocator) maybeCheckpoint() {
	if a.cpCh == nil {
		return
	}
	a.cpChanges += int(a.cpCarry.Swap(0))
	age := time.Since(a.cpLast)
	idle := age >= checkpointIdle && a.progress.Rev() > a.cpRev // keep its revision young
	if a.cpChanges < a.cpEvery && (a.cpChanges == 0 || age < a.cpMaxAge) && !idle {
		return
	}
	if age < a.cpMinGap {
		return // the last one may have been left for a younger head: not again so soon
	}
	snap := a.snapshotIndex()
	snap.changes, snap.prev = a.cpChanges, a.cpRev
	select {
	case a.cpCh <- snap:
		a.cpChanges, a.cpLast, a.cpRev = 0, time.Now(), snap.rev
	default: // the writer is busy with the last one
	}
}

// checkpointLoop writes the snapshots the watch hands over, until ctx ends.
func (a *Allocator) checkpointLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case snap := <-a.cpCh:
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			start := time.Now()
			wrote, err := a.writeCheckpoint(wctx, snap)
			cancel()
			switch {
			case err != nil:
				a.log.Warn("checkpoint not written", "revision", snap.rev, "err", err)
			case wrote:
				a.log.Info("checkpoint written", "revision", snap.rev, "took",
					time.Since(start).Round(time.Millisecond))
			}
		}
	}
}

// checkpointRevision is the revision of the checkpoint etcd holds, 0 when none (for
// tests and metrics).
func (a *Allocator) checkpointRevision(ctx context.Context) (int64, error) {
	resp, err := a.cli.Get(ctx, a.cpHeadKey)
	if err != nil || len(resp.Kvs) == 0 {
		return 0, err
	}
	var head checkpointHead
	if err := json.Unmarshal(resp.Kvs[0].Value, &head); err != nil {
		return 0, err
	}
	return head.Rev, nil
}
