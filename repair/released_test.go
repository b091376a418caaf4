package repair_test

import (
	"context"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/allocator"
)

// TestRepairReleasedAfterSnapshot: an item a Service of the snapshot uses, held when the
// snapshot was received and released since (its Service deleted, the deletion not yet
// in the snapshot), is not allocated again; an item nobody held then is, as in
// Kubernetes' runOnce, which lists the Services after reading the allocations. When
// etcd compacted the receipt revision, the pass judges from the oldest revision etcd
// keeps.
func TestRepairReleasedAfterSnapshot(t *testing.T) { bothPaths(t, testRepairReleasedAfterSnapshot) }

func testRepairReleasedAfterSnapshot(t *testing.T, listFirst bool) {
	x, xp := ip("192.168.1.30"), port(30030)
	for _, tc := range []struct {
		name string
		// held: uid-s holds x and xp when the snapshot is pushed.
		held bool
		// after runs once the snapshot is pushed: releases, compactions.
		after func(r *replica)
		// holder of x and xp after the pass: "uid-s" when repaired, "" when not.
		holder string
		want   []string
	}{{
		name:   "released after the snapshot was received",
		held:   true,
		after:  func(r *replica) { r.releaseBy("uid-s", x, xp) },
		holder: "",
		want: []string{
			"ClusterIPNotAllocated 192.168.1.30 uid-s | 192.168.1.0/24 | Cluster IP 192.168.1.30 is not " +
				"allocated; not repaired: released after the snapshot was received (held by ns/s uid-s " +
				"at revision {})",
			"PortNotAllocated 30030 uid-s | 30000-32767 | Port 30030 is not allocated; not repaired: " +
				"released after the snapshot was received (held by ns/s uid-s at revision {})",
		},
	}, {
		name:   "never held",
		holder: "uid-s",
		want: []string{
			"ClusterIPNotAllocated 192.168.1.30 uid-s repaired | 192.168.1.0/24 | Cluster IP 192.168.1.30 " +
				"is not allocated; repairing",
			"PortNotAllocated 30030 uid-s repaired | 30000-32767 | Port 30030 is not allocated; repairing",
		},
	}, {
		name: "receipt compacted, released since the oldest revision kept",
		held: true,
		after: func(r *replica) {
			r.compact()
			r.releaseBy("uid-s", x, xp)
		},
		holder: "",
		want: []string{
			"ClusterIPNotAllocated 192.168.1.30 uid-s | 192.168.1.0/24 | Cluster IP 192.168.1.30 is not " +
				"allocated; not repaired: released after the snapshot was received (revision {}, " +
				"compacted; held by ns/s uid-s at revision {}, the oldest etcd keeps)",
			"PortNotAllocated 30030 uid-s | 30000-32767 | Port 30030 is not allocated; not repaired: " +
				"released after the snapshot was received (revision {}, compacted; held by ns/s uid-s at " +
				"revision {}, the oldest etcd keeps)",
		},
	}, {
		name: "receipt compacted, released before the oldest revision kept",
		held: true,
		after: func(r *replica) {
			r.releaseBy("uid-s", x, xp)
			r.compact()
		},
		holder: "uid-s",
		want: []string{
			"ClusterIPNotAllocated 192.168.1.30 uid-s repaired | 192.168.1.0/24 | Cluster IP 192.168.1.30 " +
				"is not allocated; repairing (not held at revision {}, the oldest etcd keeps: the " +
				"snapshot's, {}, is compacted)",
			"PortNotAllocated 30030 uid-s repaired | 30000-32767 | Port 30030 is not allocated; " +
				"repairing (not held at revision {}, the oldest etcd keeps: the snapshot's, {}, is " +
				"compacted)",
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newEnv(t, opts{listFirst: listFirst})
			if tc.held {
				r.assign("uid-s", x, xp)
			}
			r.push(1, svc("uid-s", ips("192.168.1.30"), 30030))
			if tc.after != nil {
				tc.after(r)
			}
			rep := r.pass(false)
			got, want := details(rep.Findings), sorted(tc.want...)
			if len(got) != len(want) {
				t.Fatalf("findings =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			for i := range got {
				if !matches(want[i], got[i]) {
					t.Errorf("finding %d = %q; want %q", i, got[i], want[i])
				}
			}
			for _, it := range []allocator.Item{x, xp} {
				if got := r.holder(it); got != tc.holder {
					t.Errorf("holder(%v) after the pass = %q; want %q", it, got, tc.holder)
				}
			}
		})
	}
}

// TestRepairReleasedDryRun: a dry run says what a pass would do with an item released
// after the snapshot was received (not repair it) and with one nobody held (repair it),
// and writes neither.
func TestRepairReleasedDryRun(t *testing.T) {
	r := newEnv(t, opts{})
	r.assign("uid-s", ip("192.168.1.30"))
	r.push(1, svc("uid-s", ips("192.168.1.30")), svc("uid-t", ips("192.168.1.31")))
	r.releaseBy("uid-s", ip("192.168.1.30"))
	got := details(r.pass(true).Findings)
	want := []string{
		"ClusterIPNotAllocated 192.168.1.30 uid-s | 192.168.1.0/24 | Cluster IP 192.168.1.30 is not " +
			"allocated; not repaired: released after the snapshot was received (held by ns/s uid-s " +
			"at revision {})",
		"ClusterIPNotAllocated 192.168.1.31 uid-t | 192.168.1.0/24 | Cluster IP 192.168.1.31 is not " +
			"allocated; would repair (dry run)",
	}
	if len(got) != len(want) || !matches(want[0], got[0]) || !matches(want[1], got[1]) {
		t.Errorf("dry run findings =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, a := range []string{"192.168.1.30", "192.168.1.31"} {
		if h := r.holder(ip(a)); h != "" {
			t.Errorf("holder(%s) after a dry run = %q; want none", a, h)
		}
	}
}

// releaseBy releases items as their owner uid does (a Service deleted: the shim's
// release).
func (r *replica) releaseBy(uid string, items ...allocator.Item) {
	r.t.Helper()
	if _, _, err := r.alloc.Release(context.Background(), owner(uid), items, false); err != nil {
		r.t.Fatalf("Release(%s, %v) = %v", uid, items, err)
	}
}

// compact compacts etcd's history up to its current revision, after one more write so
// that the revision compacted is newer than any read before it.
func (r *replica) compact() {
	r.t.Helper()
	ctx := context.Background()
	resp, err := r.cli.Put(ctx, "/compact-test", "x")
	if err != nil {
		r.t.Fatalf("Put = %v", err)
	}
	if _, err := r.cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		r.t.Fatalf("Compact(%d) = %v", resp.Header.Revision, err)
	}
}
