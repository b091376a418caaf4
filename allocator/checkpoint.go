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
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/bits-and-blooms/bitset"
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

// checkpointer writes checkpoints of the index and reads the last one back. The watch
// goroutine counts the item changes it applies (count) and, at its ticks, hands it a
// snapshot when enough changed or enough time passed (maybe); run writes the snapshots
// handed over; read reads and checks the checkpoint etcd holds, for the index's load.
type checkpointer struct {
	*store
	log   *slog.Logger
	fails *failures
	// ch hands the watch's snapshots of the index to run; changes counts the item
	// changes applied since the last one, taken at last, of revision rev (changes, last
	// and rev are the watch goroutine's alone).
	ch      chan *indexSnapshot
	changes int
	last    time.Time
	rev     int64
	// carry holds the changes of snapshots run left for a younger head; maybe adds them
	// back to changes.
	carry atomic.Int64
	// every, maxAge and minGap are checkpointEvery, checkpointMaxAge and
	// checkpointMinGap (smaller in tests).
	every          int
	maxAge, minGap time.Duration
}

func newCheckpointer(st *store, log *slog.Logger, fails *failures) *checkpointer {
	return &checkpointer{store: st, log: log, fails: fails, ch: make(chan *indexSnapshot, 1),
		last: time.Now(), every: checkpointEvery, maxAge: checkpointMaxAge, minGap: checkpointMinGap}
}

// count records one item change applied to the index.
func (c *checkpointer) count() { c.changes++ }

// due makes the next maybe hand a snapshot (the index was listed anew).
func (c *checkpointer) due() { c.changes = c.every }

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

// encodeSnapshot returns the head and the data parts of snap.
func encodeSnapshot(snap *indexSnapshot, now time.Time) (checkpointHead, [][]byte, error) {
	head := checkpointHead{Format: checkpointFormat, Rev: snap.rev, Time: now}
	var parts [][]byte
	var raw []byte
	// One writer for every range, Reset for each: a flate writer takes about 600 KiB
	// of heap to make, and 1,000 ServiceCIDRs made 1,000 of them per checkpoint.
	zw, err := flate.NewWriter(nil, flate.BestSpeed)
	if err != nil {
		return head, nil, err
	}
	for _, sr := range snap.ranges {
		words := sr.used.Words()
		raw = slices.Grow(raw[:0], 8*len(words)) // at once: a /8 is 2 MiB of words
		for _, w := range words {
			raw = binary.LittleEndian.AppendUint64(raw, w)
		}
		var buf bytes.Buffer
		zw.Reset(&buf)
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

// write writes snap unless etcd holds one as new, or one younger than
// checkpointMinGap; it reports whether it wrote it.
func (c *checkpointer) write(ctx context.Context, snap *indexSnapshot) (bool, error) {
	resp, err := c.cli.Get(ctx, c.cpHeadKey)
	if err != nil {
		return false, fmt.Errorf("read checkpoint head: %w", err)
	}
	headCmp := clientv3.Compare(clientv3.CreateRevision(c.cpHeadKey), "=", 0)
	if len(resp.Kvs) > 0 {
		var old checkpointHead
		young := func(d time.Duration) bool { return time.Since(old.Time) < d && old.Time.Before(time.Now()) }
		if json.Unmarshal(resp.Kvs[0].Value, &old) == nil &&
			(old.Rev >= snap.rev || young(c.minGap) || snap.changes == 0 && young(checkpointIdle)) {
			if old.Rev <= snap.prev || snap.prev == 0 && old.Rev < snap.rev {
				// Left for a head younger than the gap that has none of its changes (this
				// replica's own last one, typically): they count again, and the watch hands
				// a newer one after the gap (a burst of releases otherwise left the head
				// before it until checkpointMaxAge, and a restart replayed the whole burst).
				// A head another replica wrote since holds them: nothing to carry, or
				// every replica would write one checkpoint each. (A replica's first
				// snapshot carries unless the head is as new.)
				c.carry.Add(int64(snap.changes))
			}
			return false, nil
		}
		headCmp = clientv3.Compare(clientv3.ModRevision(c.cpHeadKey), "=", resp.Kvs[0].ModRevision)
	}
	head, parts, err := encodeSnapshot(snap, time.Now())
	if err != nil {
		return false, err
	}
	head.ID = strconv.FormatUint(rand.Uint64(), 36)
	for i, p := range parts {
		if _, err := c.cli.Put(ctx, c.checkpointDataKey(snap.rev, head.ID, i), string(p)); err != nil {
			return false, fmt.Errorf("write checkpoint at %d: %w", snap.rev, err)
		}
	}
	hv, err := json.Marshal(head)
	if err != nil {
		return false, err
	}
	// Won: the parts of every older checkpoint go (and those of writers that lost);
	// lost: this writer's parts go.
	older := fmt.Sprintf("%s%020d", c.cpDataPrefix, snap.rev)
	tr, err := c.cli.Txn(ctx).If(headCmp).
		Then(clientv3.OpPut(c.cpHeadKey, string(hv)),
			clientv3.OpDelete(c.cpDataPrefix, clientv3.WithRange(older))).
		Else(clientv3.OpDelete(c.checkpointDir(snap.rev, head.ID), clientv3.WithPrefix())).Commit()
	if err != nil {
		return false, fmt.Errorf("write checkpoint head at %d: %w", snap.rev, err)
	}
	return tr.Succeeded, nil
}

// decode returns the used set of each range of head, checked against its size, count
// and CRC.
func (c *checkpointer) decode(head checkpointHead,
	data map[string][]byte) (map[string]*bitset.BitSet, error) {
	out := make(map[string]*bitset.BitSet, len(head.Ranges))
	n := 0
	for _, cr := range head.Ranges {
		var z []byte
		for range cr.Parts {
			p, ok := data[c.checkpointDataKey(head.Rev, head.ID, n)]
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

// maybe hands a snapshot of the index (at revision at, taken by take) to run when
// enough changed, or anything changed long enough ago. The watch goroutine calls it.
func (c *checkpointer) maybe(at int64, take func() *indexSnapshot) {
	if c.ch == nil {
		return
	}
	c.changes += int(c.carry.Swap(0))
	age := time.Since(c.last)
	idle := age >= checkpointIdle && at > c.rev // keep its revision young
	if c.changes < c.every && (c.changes == 0 || age < c.maxAge) && !idle {
		return
	}
	if age < c.minGap {
		return // the last one may have been left for a younger head: not again so soon
	}
	snap := take()
	snap.changes, snap.prev = c.changes, c.rev
	select {
	case c.ch <- snap:
		c.changes, c.last, c.rev = 0, time.Now(), snap.rev
	default: // run is busy with the last one
	}
}

// run writes the snapshots the watch hands over, until ctx ends. A checkpoint that
// fails is recorded (a restart then replays more events, or lists everything).
func (c *checkpointer) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case snap := <-c.ch:
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			start := time.Now()
			wrote, err := c.write(wctx, snap)
			cancel()
			switch {
			case err != nil && ctx.Err() == nil:
				c.fails.fail(stepCheckpoint, "checkpoint not written", err, "revision", snap.rev)
			case err == nil:
				c.fails.ok(stepCheckpoint)
			}
			if wrote {
				c.log.Info("checkpoint written", "revision", snap.rev, "took",
					time.Since(start).Round(time.Millisecond))
			}
		}
	}
}

// read reads the checkpoint etcd holds and decodes its ranges' used sets, checked; it
// also returns the revision of the read, up to which the index catches up after it. It
// fails with errNoCheckpoint (wrapped) when there is none, or none this index can load:
// of another format, older than after (the index's revision: an earlier try of the start
// brought it past the checkpoint, and the catch-up from there would skip the events
// between the two), or that does not check.
func (c *checkpointer) read(ctx context.Context, after int64) (checkpointHead, map[string]*bitset.BitSet,
	int64, error) {
	resp, err := c.get(ctx, c.cpPrefix, clientv3.WithPrefix())
	if err != nil {
		return checkpointHead{}, nil, 0, fmt.Errorf("read checkpoint: %w", err)
	}
	var head checkpointHead
	data := map[string][]byte{}
	found := false
	for _, kv := range resp.Kvs {
		if string(kv.Key) == c.cpHeadKey {
			if err := json.Unmarshal(kv.Value, &head); err != nil {
				return head, nil, 0, fmt.Errorf("%w: head: %v", errNoCheckpoint, err)
			}
			found = true
			continue
		}
		data[string(kv.Key)] = kv.Value
	}
	switch {
	case !found || head.Rev <= 0:
		return head, nil, 0, errNoCheckpoint
	case head.Format != checkpointFormat:
		return head, nil, 0, fmt.Errorf("%w: format %d, this allocd reads %d", errNoCheckpoint, head.Format,
			checkpointFormat)
	case after > head.Rev:
		return head, nil, 0, fmt.Errorf("%w: the index is at %d, past the checkpoint's %d", errNoCheckpoint,
			after, head.Rev)
	}
	used, err := c.decode(head, data)
	return head, used, resp.Header.Revision, err
}

// errNoCheckpoint says that a checkpoint cannot be used: the index is listed instead.
var errNoCheckpoint = errors.New("no usable checkpoint")

// revision is the revision of the checkpoint etcd holds, 0 when none (for tests).
func (c *checkpointer) revision(ctx context.Context) (int64, error) {
	resp, err := c.cli.Get(ctx, c.cpHeadKey)
	if err != nil || len(resp.Kvs) == 0 {
		return 0, err
	}
	var head checkpointHead
	if err := json.Unmarshal(resp.Kvs[0].Value, &head); err != nil {
		return 0, err
	}
	return head.Rev, nil
}
