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

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/internal/etcd/embedded"
	"github.com/allocd/allocd/internal/testing/etcdtest"
)

const kib = 1 << 10

// polled is the Maintainer of a test Member: it counts the status reads, so that a
// test can advance the Member's fake clock one poll and wait for the read it makes,
// and can hold a read (hold, then release) as a slow etcd would.
type polled struct {
	Maintainer
	reads atomic.Int64
	read  chan struct{} // a token per read, dropped when full
	mu    sync.Mutex
	gate  chan struct{} // the next read waits until it is closed; nil: none
	held  atomic.Bool   // a read is waiting at the gate
}

func (p *polled) Status(ctx context.Context, endpoint string) (*clientv3.StatusResponse, error) {
	p.mu.Lock()
	gate := p.gate
	p.gate = nil
	p.mu.Unlock()
	if gate != nil {
		p.held.Store(true)
		<-gate
	}
	defer func() {
		p.reads.Add(1)
		select {
		case p.read <- struct{}{}:
		default:
		}
	}()
	return p.Maintainer.Status(ctx, endpoint)
}

func newPolled(m Maintainer) *polled { return &polled{Maintainer: m, read: make(chan struct{}, 1)} }

// waitReads waits until n status reads were made in all.
func (p *polled) waitReads(t *testing.T, n int64) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for p.reads.Load() < n {
		select {
		case <-p.read:
		case <-timeout:
			t.Fatalf("%d status reads after 10s; want %d", p.reads.Load(), n)
		}
	}
}

// newEtcd starts the member of a Member test. Its backend commits every millisecond:
// the size in use that a Member reads moves only when etcd's backend commits (every
// 100 ms by default), a few times only in a test's real time on a fast machine, and the
// hurries came late or not at all (2 in 100 writes; a file of 16 MiB against 12).
func newEtcd(t *testing.T, opts ...etcdtest.Option) *etcdtest.Server {
	t.Helper()
	return etcdtest.New(t, append([]etcdtest.Option{func(c *embedded.Config) {
		c.BackendBatchInterval = time.Millisecond
	}}, opts...)...)
}

// testMember is a Member on a fake clock, polling every 20 ms of it.
type testMember struct {
	*Member
	t     *testing.T
	clock *clockwork.FakeClock
	p     *polled
}

func newMember(t *testing.T, e *etcdtest.Server, c *Compactor, history, free int64) *testMember {
	t.Helper()
	tm := &testMember{t: t, clock: clockwork.NewFakeClock(), p: newPolled(e.Client)}
	m, err := NewMember(tm.p, MemberConfig{Endpoint: e.Endpoint, HistoryBytes: history, DefragFreeBytes: free,
		// HistoryFloor: ten polls, as 2 s is two of a second.
		Compactor: c, Poll: 20 * time.Millisecond, HistoryFloor: 200 * time.Millisecond,
		Logger: quiet, Registerer: prometheus.NewRegistry(), Clock: tm.clock})
	if err != nil {
		t.Fatal(err)
	}
	tm.Member = m
	return tm
}

// run runs the Member until the test ends.
func (m *testMember) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	m.t.Cleanup(func() { cancel(); <-done })
}

// pollOnce advances the clock one poll, once Run's ticker is there, and waits for the
// status read it makes.
func (m *testMember) pollOnce() {
	m.t.Helper()
	if err := m.clock.BlockUntilContext(etcdtest.Context(m.t), 1); err != nil {
		m.t.Fatal(err)
	}
	n := m.p.reads.Load()
	m.clock.Advance(m.poll)
	m.p.waitReads(m.t, n+1)
}

// overwrite writes n values of size bytes to one key: history only, the live data
// stays one value. Between two writes, between is called (nil: nothing).
func overwrite(t *testing.T, cli *clientv3.Client, n, size int, between func()) int64 {
	t.Helper()
	v := strings.Repeat("x", size)
	var rev int64
	for range n {
		resp, err := cli.Put(etcdtest.Context(t), "k", v)
		if err != nil {
			t.Fatalf("Put: %v", err)
		}
		rev = resp.Header.Revision
		if between != nil {
			between()
		}
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

// TestMemberKeepsHistoryWithinBudget writes 24 MiB of history, 256 KiB every two polls
// (40 ms: about 6 MiB/s), with a compaction interval of an hour: the Member hurries the
// Compactor whenever the size in use has grown by the 1 MiB budget, and the database
// file stays a few MiB. The test makes each hurried step itself, as Run would, before
// the next write (TestHurry runs them through Run): on a loaded machine, a compaction
// running behind the writes would measure the machine, not the Member.
func TestMemberKeepsHistoryWithinBudget(t *testing.T) {
	e := newEtcd(t)
	c := newCompactor(t, e.Client, time.Hour)
	m := newMember(t, e, c, 1<<20, 8<<20)
	ctx := etcdtest.Context(t)
	m.run(ctx)

	overwrite(t, e.Client, 24*4, 256*kib, func() {
		m.pollOnce()
		m.pollOnce()
		select {
		case rev := <-c.hurry:
			if _, err := c.step(ctx, rev); err != nil {
				t.Fatalf("hurried step to %d: %v", rev, err)
			}
		default:
		}
	})
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
	e := newEtcd(t)
	m := newMember(t, e, nil, 0, 2<<20)
	ctx := etcdtest.Context(t)
	rev := overwrite(t, e.Client, 16, 256*kib, nil)
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
	m.run(ctx)
	rev = overwrite(t, e.Client, 16, 256*kib, nil)
	if _, err := e.Client.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 5*time.Second, "Run to defragment", func() bool {
		put(t, e.Client, "other")
		m.pollOnce()
		return counter(t, m.m.defrags.WithLabelValues("done")) == 2
	})
	if size, _ := dbSize(t, e); size > 2<<20 {
		t.Errorf("file %d bytes after Run defragmented; want under 2 MiB", size)
	}
}

// TestMemberHurryKeepsFloor: a hurry compacts a revision at least the floor old, even
// when a slow status read bunches the ticks (the ticker delivers the late tick at once:
// two reads at the same time), never the revision of the previous read. A key is
// written every poll, each over the budget; every fifth read is held while five polls
// pass. The test takes the Compactor's hurry requests itself and checks that the write
// that made each revision was at least the floor before the request.
func TestMemberHurryKeepsFloor(t *testing.T) {
	e := newEtcd(t)
	c := newCompactor(t, e.Client, time.Hour) // not run: the test takes its hurries
	const floor = 300 * time.Millisecond
	clock := clockwork.NewFakeClock()
	p := newPolled(e.Client)
	mm, err := NewMember(p,
		MemberConfig{Endpoint: e.Endpoint, HistoryBytes: 32 * kib, DefragFreeBytes: 1 << 30,
			Compactor: c, Poll: 20 * time.Millisecond, HistoryFloor: floor, Logger: quiet,
			Registerer: prometheus.NewRegistry(), Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	m := &testMember{Member: mm, t: t, clock: clock, p: p}
	m.run(etcdtest.Context(t))

	written := map[int64]time.Time{} // revision: when the Put that made it was written
	v := strings.Repeat("x", 16*kib)
	hurries := 0
	for i := range 100 {
		resp, err := e.Client.Put(etcdtest.Context(t), "k", v)
		if err != nil {
			t.Fatal(err)
		}
		written[resp.Header.Revision] = clock.Now()
		if i%5 == 4 {
			p.mu.Lock()
			p.gate = make(chan struct{})
			gate := p.gate
			p.mu.Unlock()
			n := p.reads.Load()
			m.clock.Advance(m.poll)
			etcdtest.WaitFor(t, 10*time.Second, "a read held", p.held.Load)
			clock.Advance(5 * m.poll) // the late tick waits in the ticker
			p.held.Store(false)
			close(gate)
			p.waitReads(t, n+2)
		} else {
			m.pollOnce()
		}
		select {
		case rev := <-c.hurry:
			hurries++
			if age := clock.Since(written[rev]); age < floor {
				t.Errorf("hurry to revision %d, written %v before: want at least the floor, %v", rev, age,
					floor)
			}
		default:
		}
	}
	if hurries < 3 {
		t.Errorf("%d hurries in 100 writes; want several", hurries)
	}
}

// TestMemberDefragCap: a member mostly free but with more in use than the cap is not
// defragmented automatically, neither by Defragment nor by Run; Run logs the
// recommendation to defragment by hand once, not at every read. Under the cap, the
// same member is defragmented.
func TestMemberDefragCap(t *testing.T) {
	e := newEtcd(t)
	var logs bytes.Buffer
	var logMu sync.Mutex
	clock, p := clockwork.NewFakeClock(), newPolled(e.Client)
	mm, err := NewMember(p,
		MemberConfig{Endpoint: e.Endpoint, DefragFreeBytes: 1 << 20, Poll: 20 * time.Millisecond,
			Logger:     slog.New(slog.NewJSONHandler(lockedWriter{&logMu, &logs}, nil)),
			Registerer: prometheus.NewRegistry(),
			Clock:      clock})
	if err != nil {
		t.Fatal(err)
	}
	m := &testMember{Member: mm, t: t, clock: clock, p: p}
	m.maxDefragInUse = 1 << 20
	ctx := etcdtest.Context(t)
	v := strings.Repeat("x", 256*kib)
	for i := range 8 { // 2 MiB of live data
		if _, err := e.Client.Put(ctx, "live"+strconv.Itoa(i), v); err != nil {
			t.Fatal(err)
		}
	}
	rev := overwrite(t, e.Client, 24, 256*kib, nil)
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
	for range 20 {
		m.pollOnce()
	}
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
	e := newEtcd(t, func(c *embedded.Config) { c.QuotaBackendBytes = 8 << 20 })
	c := newCompactor(t, e.Client, time.Hour)
	m := newMember(t, e, c, 1<<20, 2<<20)
	ctx, cancel := context.WithCancel(etcdtest.Context(t))
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
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
	m.run(ctx)
	st, err := e.Client.Status(ctx, e.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(Alarms(st), "NOSPACE") {
		t.Fatalf("status errors %q: want the NOSPACE alarm", st.Errors)
	}
	end := st.Header.Revision
	// The hurry compacts the newest revision read at least the floor (ten polls) ago.
	etcdtest.WaitFor(t, 5*time.Second, "the history compacted", func() bool {
		m.pollOnce()
		return compacted(t, e.Client, end-1)
	})
	// The pages compaction freed count as free after etcd's next commit; under NOSPACE
	// that is a deletion (a Release, say), which etcd still accepts.
	i := 0
	etcdtest.WaitFor(t, 5*time.Second, "the file defragmented", func() bool {
		i++
		if _, err := e.Client.Delete(ctx, "d"+strconv.Itoa(i%len(deletable))); err != nil {
			t.Fatalf("Delete under NOSPACE: %v", err)
		}
		m.pollOnce()
		size, _ := dbSize(t, e)
		return size < 4<<20
	})
	if got := gaugeValue(t, c.m.compacted); got < float64(end) {
		t.Errorf("allocd_etcd_compacted_revision = %v; want at least %d", got, end)
	}
}

// TestHistoryBudgetGrowsWithStore: with a HistoryShare, the budget is that share of
// what the last compaction left in use, at least HistoryBytes, and at most a quarter of
// the room left under the quota; a store four times as large is compacted after four
// times the history (a compaction walks every key: its cost per write stays the same).
func TestHistoryBudgetGrowsWithStore(t *testing.T) {
	const mib = 1 << 20
	c, err := New(nil, Config{Key: "/k", Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		share      float64
		low, quota int64
		want       int64
	}{
		{0, 400 * mib, 2048 * mib, 16 * mib},   // a fixed budget
		{0.25, 10 * mib, 2048 * mib, 16 * mib}, // a small store: the least budget
		{0.25, 400 * mib, 2048 * mib, 100 * mib},
		{0.25, 1600 * mib, 2048 * mib, 112 * mib}, // a quarter of the room left
		{0.25, 2040 * mib, 2048 * mib, 2 * mib},
		{0.25, 2047 * mib, 2048 * mib, 1 * mib}, // never under 1 MiB
		{0.25, 400 * mib, 0, 100 * mib},         // quota unknown
	}
	for _, tt := range tests {
		m, err := NewMember(nil, MemberConfig{HistoryBytes: 16 * mib, HistoryShare: tt.share,
			DefragFreeBytes: 32 * mib, Compactor: c, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		m.low = tt.low
		if got := m.budget(tt.quota); got != tt.want {
			t.Errorf("budget(share %v, low %d MiB, quota %d MiB) = %.1f MiB; want %d MiB", tt.share,
				tt.low/mib, tt.quota/mib, float64(got)/mib, tt.want/mib)
		}
	}
	// Hurries: a 400 MiB store is hurried after 100 MiB of growth, not 16.
	m, err := NewMember(nil, MemberConfig{HistoryBytes: 16 * mib, HistoryShare: 0.25,
		DefragFreeBytes: 32 * mib, Compactor: c, Logger: quiet, Clock: clockwork.NewFakeClock()})
	if err != nil {
		t.Fatal(err)
	}
	var hurried []int64
	for i, inUse := range []int64{400, 420, 480, 499, 501, 510} {
		m.floor = 0 // every read is old enough to compact
		m.hurry(&clientv3.StatusResponse{Header: &etcdserverpb.ResponseHeader{Revision: int64(i + 1)},
			DbSizeInUse: inUse * mib, DbSizeQuota: 2048 * mib})
		select {
		case rev := <-c.hurry:
			hurried = append(hurried, rev)
		default:
		}
	}
	if !slices.Equal(hurried, []int64{5}) {
		t.Errorf("hurries at revisions %v; want one, at 5 (501 MiB: 101 MiB over 400)", hurried)
	}
}

// TestMemberHurriesAgainAfterFailure: a hurried compaction that fails (here the first
// Compact is refused as by a member that stopped answering) frees nothing; the Member
// hurries again at its next reads, with the budget still counted from before the
// failed hurry, and no more history written, rather than letting the store grow by
// another budget (another share of the store, with HistoryShare) first.
func TestMemberHurriesAgainAfterFailure(t *testing.T) {
	e := newEtcd(t)
	var failed atomic.Bool
	failFirst := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if _, ok := req.(*etcdserverpb.CompactionRequest); ok && failed.CompareAndSwap(false, true) {
			return status.Error(codes.Unavailable, "the member stopped answering")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Client.Endpoints(), Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(failFirst)}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	c := newCompactor(t, cli, time.Hour)
	ctx, cancel := context.WithCancel(etcdtest.Context(t))
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	m := newMember(t, e, c, 1<<20, 1<<30)
	m.run(ctx)
	for range 11 { // the history floor: ten polls
		m.pollOnce()
	}

	// 1.5 MiB: over the budget; then no more history. Poll until a step compacted.
	overwrite(t, e.Client, 6, 256*kib, m.pollOnce)
	for i := 0; counter(t, c.m.steps.WithLabelValues("compacted")) == 0; i++ {
		if i == 500 {
			t.Fatalf("no compaction after 500 polls; %.0f hurried steps failed",
				counter(t, c.m.steps.WithLabelValues("failed")))
		}
		m.pollOnce()
		time.Sleep(time.Millisecond) // the step runs in Run's goroutine
	}
	if n := counter(t, c.m.steps.WithLabelValues("failed")); n != 1 {
		t.Errorf("%.0f failed steps; want 1 (the first Compact)", n)
	}
}
