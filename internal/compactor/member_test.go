package compactor

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/etcdtest"
)

const kib = 1 << 10

func newMember(t *testing.T, e *etcdtest.Server, c *Compactor, history, free int64) *Member {
	t.Helper()
	m, err := NewMember(e.Client, MemberConfig{Endpoint: e.Endpoint, HistoryBytes: history, DefragFreeBytes: free,
		Compactor: c, Poll: 20 * time.Millisecond, Logger: quiet, Registerer: prometheus.NewRegistry()})
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
		t.Errorf("database file %d bytes (%d in use) after 24 MiB of history; want under 12 MiB (24 MiB without the hurry)", size, inUse)
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
