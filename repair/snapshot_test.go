package repair_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/allocd/allocd/internal/testing/etcdtest"
	"github.com/allocd/allocd/repair"
)

func TestSnapshotValidate(t *testing.T) {
	good := svc("uid-a", ips("10.0.0.1"), 30001)
	for _, tc := range []struct {
		name   string
		snap   repair.Snapshot
		fields []string // violated fields; nil = valid
	}{
		{"valid", repair.Snapshot{Revision: 1, Services: []repair.Service{good}}, nil},
		{"empty list", repair.Snapshot{Revision: 7}, nil},
		{"bad addresses are findings, not errors", repair.Snapshot{Revision: 1, Services: []repair.Service{
			svc("uid-a", ips("not-an-ip"), -1, 99999)}}, nil},
		{"zero revision", repair.Snapshot{Revision: 0}, []string{"snapshot.revision"}},
		{"negative revision", repair.Snapshot{Revision: -3}, []string{"snapshot.revision"}},
		{"missing names", repair.Snapshot{Revision: 1, Services: []repair.Service{good, {}}}, []string{
			"snapshot.services[1].namespace", "snapshot.services[1].name", "snapshot.services[1].uid"}},
		{"duplicate uid", repair.Snapshot{Revision: 1, Services: []repair.Service{good, good}}, []string{
			"snapshot.services[1].uid"}},
		{"protocol",
			repair.Snapshot{Revision: 1, Services: []repair.Service{{Namespace: "n", Name: "a", UID: "u",
				NodePorts: []repair.NodePort{{Port: 30001, Protocol: "TCP"},
					{Port: 30002, Protocol: "HTTP"}}}}},
			[]string{"snapshot.services[0].node_ports[1].protocol"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.snap.Validate()
			var inv *repair.InvalidSnapshotError
			if tc.fields == nil {
				if err != nil {
					t.Errorf("Validate(%v) = %v; want nil", tc.name, err)
				}
				return
			}
			if !errors.As(err, &inv) || !errors.Is(err, repair.ErrInvalidSnapshot) {
				t.Fatalf("Validate(%v) = %v; want an InvalidSnapshotError", tc.name, err)
			}
			var got []string
			for _, v := range inv.Violations {
				got = append(got, v.Field)
			}
			if !slices.Equal(got, tc.fields) {
				t.Errorf("Validate(%v) fields = %q; want %q", tc.name, got, tc.fields)
			}
		})
	}
}

func TestSnapshotValidateBounded(t *testing.T) {
	s := repair.Snapshot{Revision: 1, Services: make([]repair.Service, 1000)}
	var inv *repair.InvalidSnapshotError
	if err := s.Validate(); !errors.As(err, &inv) {
		t.Fatalf("Validate(1000 empty services) = %v; want an InvalidSnapshotError", err)
	}
	if got := len(inv.Violations) + inv.More; got != 3000 || len(inv.Violations) > 16 {
		t.Errorf(
			"Validate(1000 empty services) = %d violations + %d more; want at most 16 listed, 3000 in all",
			len(inv.Violations), inv.More)
	}
}

// TestSnapshotAccept: revisions only move forward, across replicas (the last accepted
// revision is in etcd); the same revision again is accepted.
func TestSnapshotAccept(t *testing.T) {
	e := etcdtest.New(t)
	r1 := newReplica(t, e.Client, opts{noRun: true}, "replica-1")
	r2 := newReplica(t, e.NewClient(), opts{noRun: true}, "replica-2")
	for _, tc := range []struct {
		r       *replica
		rev     int64
		stale   bool
		current int64 // snapshot revision kept by tc.r afterwards
	}{
		{r1, 5, false, 5},
		{r1, 5, false, 5},
		{r1, 4, true, 5},
		{r2, 4, true, 0}, // r2 never saw 5, etcd did
		{r2, 6, false, 6},
		{r1, 5, true, 5},
		{r1, 9, false, 9},
	} {
		err := tc.r.accept(tc.rev, svc("uid-a", nil))
		var se *repair.StaleSnapshotError
		if got := errors.As(err, &se); got != tc.stale || (!tc.stale && err != nil) {
			t.Errorf("%s Accept(revision %d) = %v; want stale %v", tc.r.id, tc.rev, err, tc.stale)
		}
		if se != nil && se.Revision != tc.rev {
			t.Errorf("%s Accept(revision %d): StaleSnapshotError.Revision = %d", tc.r.id, tc.rev, se.Revision)
		}
		if got := tc.r.status().SnapshotRevision; got != tc.current {
			t.Errorf("%s after Accept(revision %d): SnapshotRevision = %d; want %d", tc.r.id, tc.rev, got,
				tc.current)
		}
	}
	err := r1.accept(0)
	if !errors.Is(err, repair.ErrInvalidSnapshot) {
		t.Errorf("Accept(revision 0) = %v; want ErrInvalidSnapshot", err)
	}
}

// TestSnapshotFile: the file is re-read at each pass; a bad file is a clear error; a
// newer file replaces the snapshot.
func TestSnapshotFile(t *testing.T) {
	file := writeSnapshotFile(t, `{"revision": "1", "services": [
		{"namespace": "ns", "name": "a", "uid": "uid-a", "clusterIps": ["192.168.1.2"],
		 "nodePorts": [{"port": 30001, "protocol": "TCP"}], "healthCheckNodePort": 30002}]}`)
	r := newEnv(t, opts{file: file})
	etcdtest.WaitFor(t, 10*time.Second, "the first pass", func() bool { return r.status().LastReport != nil })
	for _, tc := range []struct {
		content string
		err     bool
		rev     int64 // snapshot revision after the pass
	}{
		{`{"revision": "1", "services": []}`, false, 1}, // same revision: the kept one stays
		{`{not json`, true, 1},
		{`{"revision": "2", "services": [{"namespace": "ns", "name": "a"}]}`, true, 1}, // no uid
		{`{"revision": "2", "services": [], "extra": 1}`, true, 1},
		{`{"revision": "3", "services": []}`, false, 3},
		{`{"revision": "2", "services": []}`, false, 3}, // older than the kept: the kept one is used
	} {
		if err := os.WriteFile(file, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := r.ctl.RunRepair(context.Background(), true)
		if got := errors.Is(err, repair.ErrSnapshotFile); got != tc.err || (!tc.err && err != nil) {
			t.Errorf("RunRepair with file %s = %v; want a snapshot file error: %v", tc.content, err, tc.err)
		}
		if got := r.status().SnapshotRevision; got != tc.rev {
			t.Errorf("SnapshotRevision after file %s = %d; want %d", tc.content, got, tc.rev)
		}
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ctl.RunRepair(context.Background(), false); !errors.Is(err, repair.ErrSnapshotFile) {
		t.Errorf("RunRepair with the file gone = %v; want ErrSnapshotFile", err)
	}
	if got := r.status().LastReport.Err; !errors.Is(got, repair.ErrSnapshotFile) {
		t.Errorf("last report error = %v; want the snapshot file error", got)
	}
}

// TestNoSnapshot: a pass without any snapshot is refused.
func TestNoSnapshot(t *testing.T) {
	r := newEnv(t, opts{})
	if _, err := r.ctl.RunRepair(context.Background(), false); !errors.Is(err, repair.ErrNoSnapshot) {
		t.Errorf("RunRepair() without a snapshot = %v; want ErrNoSnapshot", err)
	}
	if st := r.status(); st.LastReport != nil {
		t.Errorf("LastReport = %v; want nil", st.LastReport)
	}
}

func TestReceiptEarlier(t *testing.T) {
	t1 := time.Unix(100, 0)
	t2 := time.Unix(200, 0)
	for _, tc := range []struct {
		a, b, want repair.Receipt
	}{
		{repair.Receipt{Revision: 5, Time: t2}, repair.Receipt{Revision: 3, Time: t1},
			repair.Receipt{Revision: 3, Time: t1}},
		{repair.Receipt{Revision: 3, Time: t1}, repair.Receipt{Revision: 5, Time: t2},
			repair.Receipt{Revision: 3, Time: t1}},
		{repair.Receipt{Revision: 5, Time: t1}, repair.Receipt{Revision: 3, Time: t2},
			repair.Receipt{Revision: 3, Time: t1}},
		{repair.Receipt{Revision: 5, Time: t2}, repair.Receipt{}, repair.Receipt{Revision: 5, Time: t2}},
		{repair.Receipt{}, repair.Receipt{Revision: 5, Time: t2}, repair.Receipt{Revision: 5, Time: t2}},
	} {
		if got := tc.a.Earlier(tc.b); got != tc.want {
			t.Errorf("%v.Earlier(%v) = %v; want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestServiceEvents: Service events after the kept snapshot change what passes judge
// against: a deleted Service's address becomes a leak candidate, a Service added by
// an event holds its address, events not newer than what was applied are ignored,
// and a newer snapshot replaces them all.
func TestServiceEvents(t *testing.T) {
	r := newEnv(t, opts{})
	r.assign("uid-a", ip("192.168.1.10"))
	r.assign("uid-b", ip("192.168.1.11"))
	r.assign("uid-c", ip("192.168.1.12"))
	if n := r.ctl.ApplyServiceEvents(
		[]repair.ServiceEvent{{Revision: 5, Service: svc("uid-a", ips("192.168.1.10"))}}); n != 0 {
		t.Errorf("ApplyServiceEvents without a snapshot = %d; want 0", n)
	}
	r.push(10, svc("uid-a", ips("192.168.1.10")), svc("uid-b", ips("192.168.1.11")))
	if got, want := summary(r.pass(true).Findings), []string{
		"LeakSuspected 192.168.1.12 uid-c"}; !slices.Equal(got, want) {
		t.Fatalf("findings after the snapshot = %q; want %q", got, want)
	}

	b := svc("uid-b", nil)
	n := r.ctl.ApplyServiceEvents([]repair.ServiceEvent{
		{Revision: 9, Deleted: true, Service: svc("uid-a", nil)}, // older than the snapshot
		{Revision: 11, Deleted: true, Service: b},
		{Revision: 12, Service: svc("uid-c", ips("192.168.1.12"))},
	})
	if n != 2 {
		t.Errorf("ApplyServiceEvents = %d applied; want 2", n)
	}
	// A call again with the last revision applied is a replay.
	if n := r.ctl.ApplyServiceEvents(
		[]repair.ServiceEvent{{Revision: 12, Deleted: true, Service: svc("uid-c", nil)}}); n != 0 {
		t.Errorf("ApplyServiceEvents(replay) = %d applied; want 0", n)
	}
	if got, want := summary(r.pass(true).Findings), []string{
		"LeakSuspected 192.168.1.11 uid-b"}; !slices.Equal(got, want) {
		t.Errorf("findings after the events = %q; want %q", got, want)
	}
	if got := r.status().SnapshotRevision; got != 10 {
		t.Errorf("SnapshotRevision after events = %d; want 10 (events do not make a snapshot)", got)
	}
	// Delete and re-create in one call, sharing the call's revision: the new state holds.
	if n := r.ctl.ApplyServiceEvents([]repair.ServiceEvent{
		{Revision: 15, Deleted: true, Service: svc("uid-c", nil)},
		{Revision: 15, Service: svc("uid-c", ips("192.168.1.12"))},
		{Revision: 15, Service: svc("uid-b", ips("192.168.1.11"))},
	}); n != 3 {
		t.Errorf("ApplyServiceEvents(three at one revision) = %d applied; want 3", n)
	}
	if got := summary(r.pass(true).Findings); len(got) != 0 {
		t.Errorf("findings after re-creating = %q; want none", got)
	}

	r.push(20, svc("uid-a", ips("192.168.1.10")))
	want := []string{"LeakSuspected 192.168.1.11 uid-b", "LeakSuspected 192.168.1.12 uid-c"}
	if got := summary(r.pass(true).Findings); !slices.Equal(got, want) {
		t.Errorf("findings after a newer snapshot = %q; want %q", got, want)
	}
}
