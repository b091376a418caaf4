package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// logBuffer collects the daemon's JSON log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// records returns the log records that have every attribute of match.
func (l *logBuffer) records(match map[string]string) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(l.b.Bytes()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) != nil {
			continue
		}
		ok := true
		for k, v := range match {
			ok = ok && rec[k] == v
		}
		if ok {
			out = append(out, rec)
		}
	}
	return out
}

// gauge returns the value of the metric name with the label pair (label "": of a
// gauge without labels), or -1.
func gauge(t *testing.T, d *Daemon, name, label, value string) float64 {
	t.Helper()
	mfs, err := d.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" && len(m.GetLabel()) == 0 {
				return m.GetGauge().GetValue()
			}
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

// counterSum returns the sum of the counters name with the label pair.
func counterSum(t *testing.T, d *Daemon, name, label, value string) float64 {
	t.Helper()
	mfs, err := d.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// wantNoSpace checks that err is allocd's answer to a write while etcd is out of space.
func wantNoSpace(t *testing.T, call string, err error) {
	t.Helper()
	st := status.Convert(err)
	var info *errdetails.ErrorInfo
	var help *errdetails.Help
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.Help:
			help = d
		}
	}
	if st.Code() != codes.ResourceExhausted ||
		info.GetReason() != allocdv1.ErrorReason_ETCD_NO_SPACE.String() ||
		info.GetDomain() != "allocd.io" || len(help.GetLinks()) == 0 {
		t.Errorf("%s while etcd is out of space = %v (details %v); want RESOURCE_EXHAUSTED, ErrorInfo "+
			"ETCD_NO_SPACE, a Help link", call, err, st.Details())
	}
}

// TestNoSpace fills a 16 MiB embedded etcd with history (compaction off, as in the
// issue) until etcd raises its NOSPACE alarm. Allocate and Renew (of a lease or a new
// one) then fail at once with RESOURCE_EXHAUSTED, reason ETCD_NO_SPACE; reads work, and
// so does a Release of everything an owner holds (etcd accepts deletions); health is
// NOT_SERVING, the metric and an error log line say NOSPACE. After an operator's
// compact, defrag and alarm disarm, the same allocd allocates and renews again, and
// serves.
func TestNoSpace(t *testing.T) {
	if testing.Short() {
		t.Skip("fills etcd to its quota and frees it: seconds")
	}
	var logs logBuffer
	d := StartForTest(t, func(c *Config) {
		c.QuotaBackendBytes = 16 << 20
		c.EtcdCompactionInterval = 0
		c.LogFormat, c.LogOutput = "json", &logs
	})
	conn := dial(t, d.GRPCAddr())
	alloc, lease := allocdv1.NewAllocatorServiceClient(conn), allocdv1.NewLeaseServiceClient(conn)
	ctx := etcdtest.Context(t)
	held, err := alloc.Allocate(ctx, &allocdv1.AllocateRequest{Owner: owner("before")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alloc.Allocate(ctx, &allocdv1.AllocateRequest{Owner: owner("released")}); err != nil {
		t.Fatal(err)
	}
	if _, err := lease.Renew(ctx, &allocdv1.RenewRequest{Ip: "192.0.2.1", TtlSeconds: 30}); err != nil {
		t.Fatal(err)
	}

	fill(t, d.Client())
	writes := map[string]func() error{
		"Allocate": func() error {
			_, err := alloc.Allocate(ctx, &allocdv1.AllocateRequest{Owner: owner("during")})
			return err
		},
		"Renew of a lease": func() error {
			_, err := lease.Renew(ctx, &allocdv1.RenewRequest{Ip: "192.0.2.1", TtlSeconds: 30})
			return err
		},
		"Renew of a new lease": func() error {
			_, err := lease.Renew(ctx, &allocdv1.RenewRequest{Ip: "192.0.2.2", TtlSeconds: 30})
			return err
		},
	}
	for name, write := range writes {
		start := time.Now()
		wantNoSpace(t, name, write())
		if took := time.Since(start); took > time.Second {
			t.Errorf("%s took %v to fail; want it to fail fast", name, took)
		}
	}
	checkReads(t, alloc, lease, held.GetClusterIps()[0])
	// etcd accepts deletions while out of space (they are how space is freed): a
	// Release of all an owner holds deletes its keys and owner record.
	if _, err := alloc.Release(ctx, &allocdv1.ReleaseRequest{Owner: owner("released")}); err != nil {
		t.Errorf("Release of all of an owner's allocations while etcd is out of space: %v; want it done", err)
	}
	etcdtest.WaitFor(t, 5*time.Second, "health NOT_SERVING, the NOSPACE metric and log line", func() bool {
		s, err := healthStatus(t, conn)
		return err == nil && s == healthpb.HealthCheckResponse_NOT_SERVING &&
			gauge(t, d, "allocd_etcd_alarm", "alarm", "NOSPACE") == 1 &&
			len(logs.records(map[string]string{"level": "ERROR", "alarm": "NOSPACE"})) == 1
	})

	// The operator frees space and disarms; allocd is not restarted.
	disarmed := freeSpace(t, d)
	etcdtest.WaitFor(t, 10*time.Second, "an Allocate to succeed", func() bool {
		_, err := alloc.Allocate(ctx, &allocdv1.AllocateRequest{Owner: owner("after")})
		return err == nil
	})
	allocAfter := time.Since(disarmed)
	etcdtest.WaitFor(t, 10*time.Second, "health SERVING", func() bool {
		s, err := healthStatus(t, conn)
		return err == nil && s == healthpb.HealthCheckResponse_SERVING
	})
	t.Logf("after the alarm was disarmed: Allocate succeeded after %v, health SERVING after %v", allocAfter,
		time.Since(disarmed))
	for name, write := range writes {
		if err := write(); err != nil {
			t.Errorf("%s after the alarm was disarmed: %v", name, err)
		}
	}
	if v := gauge(t, d, "allocd_etcd_alarm", "alarm", "NOSPACE"); v != 0 {
		t.Errorf("allocd_etcd_alarm{alarm=NOSPACE} = %v after the alarm was disarmed; want 0", v)
	}
}

// fill overwrites one key with 1 MiB values until etcd refuses for lack of space: history
// only, the live data is one value.
func fill(t *testing.T, cli *clientv3.Client) {
	t.Helper()
	v := strings.Repeat("x", 1<<20)
	for i := 0; ; i++ {
		_, err := cli.Put(etcdtest.Context(t), "/filler", v)
		if errors.Is(err, rpctypes.ErrNoSpace) {
			// etcd refuses the write at once and raises its alarm through raft a moment
			// later: a member closed before that restarts without it.
			etcdtest.WaitFor(t, 10*time.Second, "the NOSPACE alarm", func() bool {
				resp, err := cli.AlarmList(etcdtest.Context(t))
				return err == nil && slices.ContainsFunc(resp.Alarms, func(a *etcdserverpb.AlarmMember) bool {
					return a.Alarm == etcdserverpb.AlarmType_NOSPACE
				})
			})
			return
		}
		if err != nil || i == 64 {
			t.Fatalf("Put %d of 1 MiB in a 16 MiB etcd: %v; want NOSPACE before 64", i, err)
		}
	}
}

// checkReads reads what was written before etcd ran out of space.
func checkReads(t *testing.T, alloc allocdv1.AllocatorServiceClient, lease allocdv1.LeaseServiceClient,
	ip string) {
	t.Helper()
	ctx := etcdtest.Context(t)
	if _, err := alloc.ListRanges(ctx, &allocdv1.ListRangesRequest{}); err != nil {
		t.Errorf("ListRanges while etcd is out of space: %v", err)
	}
	a, err := alloc.GetAllocation(ctx,
		&allocdv1.GetAllocationRequest{Target: &allocdv1.GetAllocationRequest_ClusterIp{ClusterIp: ip}})
	if err != nil || a.GetAllocation().GetOwner().GetUid() != "before" {
		t.Errorf("GetAllocation(%s) while etcd is out of space = %v, %v; want held by before", ip, a, err)
	}
	ls, err := lease.ListLeases(ctx, &allocdv1.ListLeasesRequest{})
	if err != nil || len(ls.GetLeases()) != 1 {
		t.Errorf("ListLeases while etcd is out of space = %v, %v; want one lease", ls, err)
	}
}

// freeSpace does what docs/operators/etcd.md tells an operator: compact, defragment, disarm. It
// returns when the alarm was disarmed.
func freeSpace(t *testing.T, d *Daemon) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := d.Client()
	resp, err := cli.Get(ctx, "/filler")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("compact: %v", err)
	}
	if _, err := cli.Defragment(ctx, "http://"+d.cfg.EmbeddedEtcdClientAddress); err != nil {
		t.Fatalf("defragment: %v", err)
	}
	if _, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{}); err != nil {
		t.Fatalf("disarm: %v", err)
	}
	return time.Now()
}

// TestHistoryBudget writes four times the quota of a 16 MiB embedded etcd as history
// (one key overwritten) with the default compaction interval (5 minutes: no compaction
// by time in this test): the history budget makes allocd compact sooner, so etcd never
// runs out of space, and Allocate still works at the end.
func TestHistoryBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 64 MiB against the daemon's real-time space poll: seconds")
	}
	d := StartForTest(t, func(c *Config) {
		c.QuotaBackendBytes = 16 << 20
		c.etcdSpacePoll = 50 * time.Millisecond
	})
	ctx := etcdtest.Context(t)
	v := strings.Repeat("x", 256<<10)
	for i := range 4 * 64 {
		if _, err := d.Client().Put(ctx, "/filler", v); err != nil {
			t.Fatalf("Put %d of 256 KiB (%d MiB written): %v; want the history compacted before "+
				"etcd runs out of space", i, i/4, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	conn := dial(t, d.GRPCAddr())
	if _, err := allocdv1.NewAllocatorServiceClient(conn).Allocate(ctx,
		&allocdv1.AllocateRequest{Owner: owner("after")}); err != nil {
		t.Errorf("Allocate after 64 MiB of history: %v", err)
	}
	st, err := d.Client().Status(ctx, "http://"+d.cfg.EmbeddedEtcdClientAddress)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("database file %d bytes, %d in use, after 64 MiB of history in a 16 MiB quota", st.DbSize,
		st.DbSizeInUse)
}

// TestNoSpaceAtStart: etcd keeps its NOSPACE alarm across restarts, and allocd writes
// to etcd as it starts. With compaction off, an allocd restarted on an embedded etcd
// full of history refuses to start and says what to do; with compaction on, it
// compacts, defragments, disarms the alarm and serves.
func TestNoSpaceAtStart(t *testing.T) {
	cfg := TestConfig(t.TempDir(), func() string { return freeAddr(t) })
	cfg.QuotaBackendBytes = 16 << 20
	cfg.EtcdCompactionInterval = 0
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	// etcd raises NOSPACE once its file, free pages included, would pass the quota:
	// filled until what a defragmentation leaves is more than allocd's start accepts
	// (twice the history budget under the quota), else the start rightly frees it.
	endpoint := "http://" + cfg.EmbeddedEtcdClientAddress
	for i := 0; ; i++ {
		fill(t, d.Client())
		if _, err := d.Client().Defragment(ctx, endpoint); err != nil {
			t.Fatal(err)
		}
		st, err := d.Client().Status(ctx, endpoint)
		if err != nil {
			t.Fatal(err)
		}
		if st.DbSize > cfg.QuotaBackendBytes-2*historyBudget(cfg.QuotaBackendBytes) {
			break
		}
		if i == 5 {
			t.Fatalf("etcd holds %d bytes after 5 fills and defragmentations; want more than %d", st.DbSize,
				cfg.QuotaBackendBytes-2*historyBudget(cfg.QuotaBackendBytes))
		}
		if _, err := d.Client().AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: st.Header.MemberId,
			Alarm: etcdserverpb.AlarmType_NOSPACE}); err != nil {
			t.Fatal(err)
		}
	}
	d.Close()

	if d, err := Start(ctx, cfg); !refuses(err, "--quota-backend-bytes", ErrFlagValue) ||
		!refuses(err, "--etcd-compaction-interval", ErrFlagValue) {
		if err == nil {
			d.Close()
		}
		t.Fatalf("Start on a full etcd with compaction off = %v; want an error naming "+
			"--quota-backend-bytes and --etcd-compaction-interval", err)
	}
	cfg.EtcdCompactionInterval = 5 * time.Minute
	d, err = Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start on a full etcd with compaction on: %v; want it to free space and start", err)
	}
	defer d.Close()
	conn := dial(t, d.GRPCAddr())
	if _, err := allocdv1.NewAllocatorServiceClient(conn).Allocate(ctx,
		&allocdv1.AllocateRequest{Owner: owner("after")}); err != nil {
		t.Errorf("Allocate after a start on a full etcd: %v", err)
	}
	alarms, err := d.Client().AlarmList(ctx)
	if err != nil || len(alarms.Alarms) != 0 {
		t.Errorf("etcd alarms after the start = %v, %v; want none", alarms, err)
	}
}

// TestBadQuotaConfig: a --quota-backend-bytes below 16 MiB (but 0) is refused (a
// *FlagError of the flag); 0, 16 MiB and more are taken.
func TestBadQuotaConfig(t *testing.T) {
	for _, q := range []int64{1, 7, 1 << 20, 16<<20 - 1} {
		c := DefaultConfig()
		c.QuotaBackendBytes = q
		if err := c.Validate(); !refuses(err, "--quota-backend-bytes", ErrFlagValue) {
			t.Errorf("Validate() with --quota-backend-bytes %d = %v; want a *FlagError of the flag", q, err)
		}
	}
	for _, q := range []int64{0, 16 << 20, 9 << 30} {
		c := DefaultConfig()
		c.QuotaBackendBytes = q
		if err := c.Validate(); err != nil {
			t.Errorf("Validate() with --quota-backend-bytes %d = %v; want nil", q, err)
		}
	}
}

// TestLargeQuotaWarning: an embedded etcd's quota above etcd's recommended 8 GiB starts,
// with a warning; the default quota starts without one.
func TestLargeQuotaWarning(t *testing.T) {
	for _, q := range []int64{9 << 30, DefaultQuotaBackendBytes} {
		var logs logBuffer
		StartForTest(t, func(c *Config) { c.QuotaBackendBytes = q; c.LogFormat, c.LogOutput = "json", &logs })
		n := 0
		for _, r := range logs.records(map[string]string{"level": "WARN"}) {
			if v, ok := r["quota_backend_bytes"].(float64); ok && int64(v) == q {
				n++
			}
		}
		if want := map[bool]int{true: 1, false: 0}[q > 8<<30]; n != want {
			t.Errorf("--quota-backend-bytes %d: %d warnings about it; want %d", q, n, want)
		}
	}
}

// requests counts allocd's etcd requests of method (Maintenance/Alarm, say).
func requests(t *testing.T, d *Daemon, method string) uint64 {
	t.Helper()
	mfs, err := d.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != "allocd_etcd_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "method" && lp.GetValue() == method {
					n += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return n
}

// TestHealthCheckWritesNothing: the health check, every second, reads etcd's alarms
// from a member's status, not with AlarmList, which etcd runs through raft (a log
// entry and an fsync on every member each time): an idle allocd adds nothing to etcd's
// raft log.
func TestHealthCheckWritesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("watches two seconds of the real-time health check")
	}
	d := StartForTest(t)
	ctx := etcdtest.Context(t)
	endpoint := "http://" + d.cfg.EmbeddedEtcdClientAddress
	// The last write of the start is the repair election's.
	etcdtest.WaitFor(t, 10*time.Second, "repair leadership",
		func() bool { return gauge(t, d, "allocd_repair_leader", "", "") == 1 })
	before, err := d.Client().Status(ctx, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	alarms, statuses := requests(t, d, "Maintenance/Alarm"), requests(t, d, "Maintenance/Status")
	// The health check's and the Member's, one a second each: two seconds of both.
	etcdtest.WaitFor(t, 10*time.Second, "four status reads", func() bool {
		return requests(t, d, "Maintenance/Status")-statuses >= 4
	})
	after, err := d.Client().Status(ctx, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	if n := requests(t, d, "Maintenance/Alarm") - alarms; n != 0 {
		t.Errorf("%d AlarmList calls over four status reads; want none", n)
	}
	if grown := after.RaftIndex - before.RaftIndex; grown > 1 {
		t.Errorf("etcd's raft index grew by %d over four status reads of an idle allocd; want at most 1",
			grown)
	}
}
