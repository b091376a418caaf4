package compactor

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/etcd/embedded"
	"github.com/allocd/allocd/internal/testing/etcdtest"
)

const kib = 1 << 10

func newMember(t *testing.T, e *etcdtest.Server, c *Compactor, history, free int64) *Member {
	t.Helper()
	m, err := NewMember(e.Client,
		MemberConfig{Endpoint: e.Endpoint, HistoryBytes: history, DefragFreeBytes: free,
			// A floor of ten polls, as 2 s is two of a second.
			Compactor: c, Poll: 20 * time.Millisecond, HistoryFloor: 200 * time.Millisecond,
			Logger: quiet, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// overwrite writes n values of size bytes to one key, every pause: history only, the
// live data stays one value.
func overwrite(t *testing.T, cli *clientv3.Client, n, size int, pause time.Duration) int64 {
	t.Helper()
	v := strings.Repeat("x", size)
	var rev int64
	for range n {
		resp, err := cli.Put(etcdtest.Context(t), "k", v)
		if err != nil {
			t.Fatalf("Put: %v", err)
		}
		rev = resp.Header.Revision
		time.Sleep(pause)
	}
	return rev
}

func dbSize(t *testing.T, e *etcdtest.Server) (size, inUse int64) {
	t.Helper()
	st, err := e.Client.Status(etcdtest.Context(t), e.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	return st.DbSize, st.DbSizeInUse
}

// TestMemberKeepsHistoryWithinBudget writes 24 MiB of history at about 6 MiB/s with a
// compaction interval of an hour: the Member hurries the Compactor whenever the size in
// use has grown by the 1 MiB budget, and the database file stays a few MiB.
func TestMemberKeepsHistoryWithinBudget(t *testing.T) {
	e := etcdtest.New(t)
	c := newCompactor(t, e.Client, time.Hour)
	m := newMember(t, e, c, 1<<20, 8<<20)
	ctx, cancel := context.WithCancel(etcdtest.Context(t))
	done := make(chan struct{}, 2)
	go func() { c.Run(ctx); done <- struct{}{} }()
	go func() { m.Run(ctx); done <- struct{}{} }()
	defer func() { cancel(); <-done; <-done }()

	overwrite(t, e.Client, 24*4, 256*kib, 40*time.Millisecond)
	size, inUse := dbSize(t, e)
	t.Logf("database file %d bytes, %d in use, after 24 MiB of history", size, inUse)
	if size > 12<<20 {
		t.Errorf("database file %d bytes (%d in use) after 24 MiB of history; want under 12 MiB (24 MiB "+
			"without the hurry)", size, inUse)
	}
	if n := counter(t, c.m.steps.WithLabelValues("compacted")); n < 3 {
		t.Errorf("%.0f compactions; want the Member to have hurried several", n)
	}
}

// TestMemberDefragments: once compaction has freed most of the file, Run defragments
// the member and the file shrinks; Defragment does the same before Run, and only when
// it is worth it.
func TestMemberDefragments(t *testing.T) {
	e := etcdtest.New(t)
	m := newMember(t, e, nil, 0, 2<<20)
	ctx := etcdtest.Context(t)
	rev := overwrite(t, e.Client, 16, 256*kib, 0)
	if did, err := m.Defragment(ctx); err != nil || did {
		t.Fatalf("Defragment with nothing free = %v, %v; want false, nil", did, err)
	}
	if _, err := e.Client.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	before, _ := dbSize(t, e)
	// The pages compaction freed count as free once no read transaction holds them: in
	// etcd, after one more commit (a write).
	etcdtest.WaitFor(t, 5*time.Second, "Defragment of a file mostly free to defragment", func() bool {
		put(t, e.Client, "other")
		did, err := m.Defragment(ctx)
		if err != nil {
			t.Fatalf("Defragment: %v", err)
		}
		return did
	})
	if after, _ := dbSize(t, e); after > before/2 {
		t.Errorf("file %d bytes after Defragment, %d before; want under half", after, before)
	}

	// Run does it by itself.
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { m.Run(rctx); close(done) }()
	defer func() { cancel(); <-done }()
	rev = overwrite(t, e.Client, 16, 256*kib, 0)
	if _, err := e.Client.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 5*time.Second, "Run to defragment", func() bool {
		put(t, e.Client, "other")
		return counter(t, m.m.defrags.WithLabelValues("done")) == 2
	})
	if size, _ := dbSize(t, e); size > 2<<20 {
		t.Errorf("file %d bytes after Run defragmented; want under 2 MiB", size)
	}
}

// slowStatus is a Maintainer whose every fifth status read takes 100 ms longer: the
// Member's ticker then delivers the late tick at once, and two reads land milliseconds
// apart.
type slowStatus struct {
	Maintainer
	n atomic.Int64
}

func (s *slowStatus) Status(ctx context.Context, endpoint string) (*clientv3.StatusResponse, error) {
	if s.n.Add(1)%5 == 0 {
		time.Sleep(100 * time.Millisecond)
	}
	return s.Maintainer.Status(ctx, endpoint)
}

// TestMemberHurryKeepsFloor: a hurry compacts a revision at least the floor old, even
// when slow status reads bunch the ticks (two reads milliseconds apart), never the
// revision of the previous read. Keys are written every 2 ms, each over the budget; the
// test takes the Compactor's hurry requests itself and checks that the write that
// made each revision began at least the floor before the request.
func TestMemberHurryKeepsFloor(t *testing.T) {
	e := etcdtest.New(t)
	c := newCompactor(t, e.Client, time.Hour) // not run: the test takes its hurries
	const floor = 300 * time.Millisecond
	m, err := NewMember(&slowStatus{Maintainer: e.Client},
		MemberConfig{Endpoint: e.Endpoint, HistoryBytes: 32 * kib,
			DefragFreeBytes: 1 << 30, Compactor: c, Poll: 20 * time.Millisecond, HistoryFloor: floor,
			Logger:     quiet,
			Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(etcdtest.Context(t))
	var mu sync.Mutex
	began := map[int64]time.Time{} // revision: when the Put that made it began
	done := make(chan struct{}, 2)
	go func() { m.Run(ctx); done <- struct{}{} }()
	go func() {
		defer func() { done <- struct{}{} }()
		v := strings.Repeat("x", 16*kib)
		for ctx.Err() == nil {
			start := time.Now()
			if resp, err := e.Client.Put(ctx, "k", v); err == nil {
				mu.Lock()
				began[resp.Header.Revision] = start
				mu.Unlock()
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	defer func() { cancel(); <-done; <-done }()

	hurries := 0
	for deadline := time.After(2 * time.Second); ; {
		select {
		case <-deadline:
			if hurries < 3 {
				t.Errorf("%d hurries in 2 s; want several", hurries)
			}
			return
		case rev := <-c.hurry:
			at := time.Now()
			hurries++
			mu.Lock()
			b, ok := began[rev]
			mu.Unlock()
			if age := at.Sub(b); ok && age < floor {
				t.Errorf("hurry to revision %d, written %v before: want at least the floor, %v", rev,
					age.Round(time.Millisecond), floor)
			}
		}
	}
}

// TestMemberDefragCap: a member mostly free but with more in use than the cap is not
// defragmented automatically, neither by Defragment nor by Run; Run logs the
// recommendation to defragment by hand once, not at every read. Under the cap, the
// same member is defragmented.
func TestMemberDefragCap(t *testing.T) {
	e := etcdtest.New(t)
	var logs bytes.Buffer
	var logMu sync.Mutex
	m, err := NewMember(e.Client,
		MemberConfig{Endpoint: e.Endpoint, DefragFreeBytes: 1 << 20, Poll: 20 * time.Millisecond,
			Logger:     slog.New(slog.NewJSONHandler(lockedWriter{&logMu, &logs}, nil)),
			Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	m.maxDefragInUse = 1 << 20
	ctx := etcdtest.Context(t)
	v := strings.Repeat("x", 256*kib)
	for i := range 8 { // 2 MiB of live data
		if _, err := e.Client.Put(ctx, "live"+strconv.Itoa(i), v); err != nil {
			t.Fatal(err)
		}
	}
	rev := overwrite(t, e.Client, 24, 256*kib, 0)
	if _, err := e.Client.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 5*time.Second, "the file to be mostly free", func() bool {
		put(t, e.Client, "other")
		size, inUse := dbSize(t, e)
		return size-inUse >= inUse && inUse > m.maxDefragInUse
	})
	if did, err := m.Defragment(ctx); err != nil || did {
		t.Errorf("Defragment over the cap = %v, %v; want false, nil", did, err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { m.Run(rctx); close(done) }()
	time.Sleep(400 * time.Millisecond) // some 20 reads
	cancel()
	<-done
	if n := counter(t, m.m.defrags.WithLabelValues("done")); n != 0 {
		t.Errorf("%.0f defragmentations of a member over the cap; want none", n)
	}
	logMu.Lock()
	if n := strings.Count(logs.String(), "etcdctl defrag"); n != 1 {
		t.Errorf("%d log lines recommend etcdctl defrag; want 1:\n%s", n, logs.String())
	}
	logMu.Unlock()
	m.maxDefragInUse = DefragMaxInUseBytes
	if did, err := m.Defragment(ctx); err != nil || !did {
		t.Errorf("Defragment under the cap = %v, %v; want true, nil", did, err)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestMemberCompactsOutOfSpace fills an 8 MiB etcd with history until it raises its
// NOSPACE alarm, faster than the Member reads: the compaction key cannot be written,
// yet the Member's hurry compacts the history (the newest revision a floor old: all of
// it once the writes stop), and, once a deletion has made etcd count the freed pages,
// the defragmentation gives the file back. The alarm stays raised: disarming is the
// operator's (or allocd's at start).
func TestMemberCompactsOutOfSpace(t *testing.T) {
	e := etcdtest.New(t, func(c *embedded.Config) { c.QuotaBackendBytes = 8 << 20 })
	c := newCompactor(t, e.Client, time.Hour)
	m := newMember(t, e, c, 1<<20, 2<<20)
	ctx, cancel := context.WithCancel(etcdtest.Context(t))
	done := make(chan struct{}, 2)
	go func() { c.Run(ctx); done <- struct{}{} }()
	defer func() { cancel(); <-done; <-done }()
	if _, err := c.RunOnce(ctx); err != nil { // the compaction key's first write
		t.Fatal(err)
	}
	deletable := make([]string, 50)
	for i := range deletable {
		put(t, e.Client, "d"+strconv.Itoa(i))
	}
	v := strings.Repeat("x", 1<<20)
	for i := 0; ; i++ {
		_, err := e.Client.Put(ctx, "k", v)
		if errors.Is(err, rpctypes.ErrNoSpace) {
			break
		}
		if err != nil || i == 32 {
			t.Fatalf("Put %d of 1 MiB in an 8 MiB etcd: %v; want NOSPACE before 32", i, err)
		}
	}
	go func() { m.Run(ctx); done <- struct{}{} }()
	st, err := e.Client.Status(ctx, e.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(Alarms(st), "NOSPACE") {
		t.Fatalf("status errors %q: want the NOSPACE alarm", st.Errors)
	}
	end := st.Header.Revision
	etcdtest.WaitFor(t, 5*time.Second, "the history compacted",
		func() bool { return compacted(t, e.Client, end-1) })
	// The pages compaction freed count as free after etcd's next commit; under NOSPACE
	// that is a deletion (a Release, say), which etcd still accepts.
	i := 0
	etcdtest.WaitFor(t, 5*time.Second, "the file defragmented", func() bool {
		i++
		if _, err := e.Client.Delete(ctx, "d"+strconv.Itoa(i%len(deletable))); err != nil {
			t.Fatalf("Delete under NOSPACE: %v", err)
		}
		size, _ := dbSize(t, e)
		return size < 4<<20
	})
	if got := gaugeValue(t, c.m.compacted); got < float64(end) {
		t.Errorf("allocd_etcd_compacted_revision = %v; want at least %d", got, end)
	}
}
