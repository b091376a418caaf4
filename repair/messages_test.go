package repair_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allocd/allocd/allocator"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	"github.com/allocd/allocd/repair"
)

// TestFindingMessages pins every finding a pass can report, field by field: reason,
// item, Service, repaired, range and message (the text operators read in the logs and
// in `allocd repair`). In a wanted message, {} stands for a value the test cannot know
// in advance (a revision, an age).
func TestFindingMessages(t *testing.T) {
	const kubePort = 30443
	errDisk := errors.New("disk on fire")
	for _, tc := range []struct {
		name string
		o    opts
		// before runs before the snapshot is pushed, after once it is (so that what it
		// writes is newer than the snapshot's receipt).
		before, after func(r *replica, hs *hookStore)
		snap          []repair.Service
		dry           bool
		// stale: another replica accepts a newer snapshot before the pass.
		stale bool
		// full: the pass stops on a full range.
		full bool
		want []string
	}{{
		name: "bad input, duplicates, repairs and a leak",
		o:    opts{strikes: 2},
		before: func(r *replica, _ *hookStore) {
			r.assign("uid-a", ip("192.168.1.10"))
			r.assign("uid-old", ip("192.168.1.12"))
			r.assign("uid-old2", ip("192.168.1.13"))
			r.assign("uid-leak", ip("192.168.1.50"), port(30600))
		},
		snap: []repair.Service{
			svc("uid-bad", ips("10.0.0.zz")),
			svc("uid-v6", ips("fd00::1")),
			svc("uid-out", ips("10.9.0.1")),
			svc("uid-np", nil, 80),
			svc("uid-a", ips("192.168.1.10")), svc("uid-b", ips("192.168.1.10")),
			svc("uid-c", ips("192.168.1.11"), 30500),
			svc("uid-d", ips("192.168.1.12")),
			svc("uid-e", ips("192.168.1.13")), svc("uid-f", ips("192.168.1.13")),
		},
		want: []string{
			"ClusterIPNotValid 10.0.0.zz uid-bad |  | Cluster IP 10.0.0.zz is not a valid IP; please " +
				"recreate service",
			"ClusterIPNotValid fd00::1 uid-v6 |  | Cluster IP fd00::1 is not a valid IP: no service CIDR " +
				"of its family; please recreate service",
			"ClusterIPOutOfRange 10.9.0.1 uid-out | 192.168.1.0/24 | Cluster IP 10.9.0.1 is not within the " +
				"service CIDR 192.168.1.0/24; please recreate service",
			"PortOutOfRange 80 uid-np | 30000-32767 | Port 80 is not within the port range 30000-32767; " +
				"please recreate service",
			"ClusterIPAlreadyAllocated 192.168.1.10 uid-b | 192.168.1.0/24 | Cluster IP 192.168.1.10 was " +
				"assigned to multiple services (also ns/a); please recreate service",
			"ClusterIPNotAllocated 192.168.1.11 uid-c repaired | 192.168.1.0/24 | Cluster IP 192.168.1.11 " +
				"is not allocated; repairing",
			"PortNotAllocated 30500 uid-c repaired | 30000-32767 | Port 30500 is not allocated; repairing",
			"ClusterIPWrongOwner 192.168.1.12 uid-d repaired | 192.168.1.0/24 | Cluster IP 192.168.1.12 is " +
				"allocated to ns/old uid-old, not to the service that uses it; repairing",
			"ClusterIPWrongOwner 192.168.1.13 uid-e | 192.168.1.0/24 | Cluster IP 192.168.1.13 is " +
				"allocated to ns/old2 uid-old2 and used by several services; not reassigned",
			"ClusterIPAlreadyAllocated 192.168.1.13 uid-f | 192.168.1.0/24 | Cluster IP 192.168.1.13 was " +
				"assigned to multiple services (also ns/e); please recreate service",
			"LeakSuspected 192.168.1.50 uid-leak | 192.168.1.0/24 | Cluster IP 192.168.1.50 of ns/leak " +
				"uid-leak may have leaked: flagging for later clean up (strike 1 of 2)",
			"LeakSuspected 30600 uid-leak | 30000-32767 | Port 30600 of ns/leak uid-leak may have leaked: " +
				"flagging for later clean up (strike 1 of 2)",
		},
	}, {
		name: "allocated after the snapshot was received",
		o:    opts{kubeNodePort: kubePort},
		after: func(r *replica, _ *hookStore) {
			r.assign("uid-old", ip("192.168.1.12"))
			r.release(ip("192.168.1.1"))
			r.assign("uid-gone", ip("192.168.1.1"))
		},
		snap: []repair.Service{kubeSvc(ips("192.168.1.1")), svc("uid-d", ips("192.168.1.12"))},
		want: []string{
			"ClusterIPWrongOwner 192.168.1.12 uid-d | 192.168.1.0/24 | Cluster IP 192.168.1.12 is " +
				"allocated to ns/old uid-old, which is newer (revision {}) than the snapshot (received at " +
				"revision {}); not corrected",
			"ClusterIPWrongOwner 192.168.1.1 kube-uid | 192.168.1.0/24 | Cluster IP 192.168.1.1, reserved " +
				"for the default/kubernetes service, is allocated to ns/gone uid-gone, which is newer " +
				"(revision {}) than the snapshot (received at revision {}); not corrected",
		},
	}, {
		name: "released after the snapshot was received, its revision compacted",
		before: func(r *replica, _ *hookStore) {
			r.assign("uid-t", ip("192.168.1.31"))
			r.assign("uid-u", ip("192.168.1.32"))
		},
		after: func(r *replica, _ *hookStore) {
			r.releaseBy("uid-u", ip("192.168.1.32")) // before the oldest revision kept
			r.compact()
			r.releaseBy("uid-t", ip("192.168.1.31")) // after it
		},
		snap: []repair.Service{svc("uid-t", ips("192.168.1.31")), svc("uid-u", ips("192.168.1.32"))},
		want: []string{
			"ClusterIPNotAllocated 192.168.1.31 uid-t | 192.168.1.0/24 | Cluster IP 192.168.1.31 is not " +
				"allocated; not repaired: released after the snapshot was received (revision {}, " +
				"compacted; held by ns/t uid-t at revision {}, the oldest etcd keeps)",
			"ClusterIPNotAllocated 192.168.1.32 uid-u repaired | 192.168.1.0/24 | Cluster IP 192.168.1.32 " +
				"is not allocated; repairing (not held at revision {}, the oldest etcd keeps: the " +
				"snapshot's, {}, is compacted)",
		},
	}, {
		name: "released after the snapshot was received, history kept",
		before: func(r *replica, _ *hookStore) {
			r.assign("uid-s", ip("192.168.1.30"), port(30030))
		},
		after: func(r *replica, _ *hookStore) { r.releaseBy("uid-s", ip("192.168.1.30"), port(30030)) },
		snap:  []repair.Service{svc("uid-s", ips("192.168.1.30"), 30030)},
		want: []string{
			"ClusterIPNotAllocated 192.168.1.30 uid-s | 192.168.1.0/24 | Cluster IP 192.168.1.30 is not " +
				"allocated; not repaired: released after the snapshot was received (held by ns/s uid-s " +
				"at revision {})",
			"PortNotAllocated 30030 uid-s | 30000-32767 | Port 30030 is not allocated; not repaired: " +
				"released after the snapshot was received (held by ns/s uid-s at revision {})",
		},
	}, {
		name: "dry run",
		o:    opts{strikes: 1},
		before: func(r *replica, _ *hookStore) {
			r.assign("uid-old", ip("192.168.1.12"))
			r.assign("uid-leak", ip("192.168.1.50"))
			r.release(ip("192.168.1.1"))
		},
		snap: []repair.Service{kubeSvc(ips("192.168.1.1")),
			svc("uid-c", ips("192.168.1.11")), svc("uid-d", ips("192.168.1.12"))},
		dry: true,
		want: []string{
			"ClusterIPNotAllocated 192.168.1.1 kube-uid | 192.168.1.0/24 | Cluster IP 192.168.1.1, " +
				"reserved for the default/kubernetes service, is not allocated; would repair (dry run)",
			"ClusterIPNotAllocated 192.168.1.11 uid-c | 192.168.1.0/24 | Cluster IP 192.168.1.11 is not " +
				"allocated; would repair (dry run)",
			"ClusterIPWrongOwner 192.168.1.12 uid-d | 192.168.1.0/24 | Cluster IP 192.168.1.12 is " +
				"allocated to ns/old uid-old, not to ns/d uid-d; would reassign (dry run)",
			"LeakReleased 192.168.1.50 uid-leak | 192.168.1.0/24 | Cluster IP 192.168.1.50 of ns/leak " +
				"uid-leak appears to have leaked: would clean up (dry run)",
		},
	}, {
		name: "stale snapshot",
		o:    opts{kubeNodePort: kubePort},
		before: func(r *replica, _ *hookStore) {
			r.assign("uid-old", ip("192.168.1.12"))
			r.release(ip("192.168.1.1"), port(kubePort))
			r.assign("uid-gone", port(kubePort))
		},
		snap: []repair.Service{kubeSvc(ips("192.168.1.1"), kubePort),
			svc("uid-c", ips("192.168.1.11")), svc("uid-d", ips("192.168.1.12"))},
		stale: true,
		want: []string{
			"SnapshotStale   |  | service snapshot revision 1 is older than revision 2, accepted by " +
				"another replica: no Service repaired and no leak judged until that snapshot (or a newer " +
				"one) is pushed here",
			"ClusterIPNotAllocated 192.168.1.1 kube-uid repaired | 192.168.1.0/24 | Cluster IP " +
				"192.168.1.1, reserved for the default/kubernetes service, is not allocated; repairing",
			"PortWrongOwner 30443 kube-uid | 30000-32767 | Port 30443 is allocated to ns/gone uid-gone, " +
				"not to default/kubernetes default/kubernetes; not reassigned: the snapshot is stale",
			"ClusterIPNotAllocated 192.168.1.11 uid-c | 192.168.1.0/24 | Cluster IP 192.168.1.11 is not " +
				"allocated; not repaired: the snapshot is stale",
			"ClusterIPWrongOwner 192.168.1.12 uid-d | 192.168.1.0/24 | Cluster IP 192.168.1.12 is " +
				"allocated to ns/old uid-old, not to ns/d uid-d; not reassigned: the snapshot is stale",
		},
	}, {
		name: "reserved for the kubernetes Service",
		o:    opts{kubeNodePort: kubePort},
		before: func(r *replica, _ *hookStore) {
			r.release(ip("192.168.1.1"), port(kubePort))
			r.assign("uid-gone", port(kubePort))
		},
		snap: []repair.Service{kubeSvc(ips("192.168.1.1"), kubePort), svc("uid-b", ips("192.168.1.1"))},
		want: []string{
			"ClusterIPAlreadyAllocated 192.168.1.1 uid-b | 192.168.1.0/24 | Cluster IP 192.168.1.1 is " +
				"reserved for the default/kubernetes service; please recreate service",
			"ClusterIPNotAllocated 192.168.1.1 kube-uid repaired | 192.168.1.0/24 | Cluster IP " +
				"192.168.1.1, reserved for the default/kubernetes service, is not allocated; repairing",
			"PortWrongOwner 30443 kube-uid repaired | 30000-32767 | Port 30443, reserved for the " +
				"default/kubernetes service, is allocated to ns/gone uid-gone; repairing",
		},
	}, {
		name: "repairs and releases that fail",
		o:    opts{strikes: 1},
		before: func(r *replica, hs *hookStore) {
			r.assign("uid-old", ip("192.168.1.22"), ip("192.168.1.23"))
			r.assign("uid-leak", ip("192.168.1.50"), ip("192.168.1.51"), ip("192.168.1.52"))
			hs.beforeAssign = func(_ allocator.Owner, it allocator.Item) error {
				switch it {
				case ip("192.168.1.20"):
					r.assign("uid-thief", it)
				case ip("192.168.1.21"):
					return errDisk
				}
				return nil
			}
			hs.beforeReassign = func(al allocator.Allocation, _ allocator.Owner) error {
				if al.Item == ip("192.168.1.22") {
					return fmt.Errorf("reassign %v: %w", al.Item, allocator.ErrConflict)
				}
				return errDisk
			}
			hs.beforeRelease = func(al allocator.Allocation) error {
				switch al.Item {
				case ip("192.168.1.51"):
					return errDisk
				case ip("192.168.1.52"):
					if _, err := r.alloc.Reassign(context.Background(), al, owner("uid-new")); err != nil {
						r.t.Errorf("Reassign(%v) = %v", al.Item, err)
					}
				}
				return nil
			}
		},
		snap: []repair.Service{svc("uid-t", ips("192.168.1.20")), svc("uid-u", ips("192.168.1.21")),
			svc("uid-w", ips("192.168.1.22")), svc("uid-x", ips("192.168.1.23"))},
		want: []string{
			"ClusterIPNotAllocated 192.168.1.20 uid-t | 192.168.1.0/24 | Cluster IP 192.168.1.20 is not " +
				"allocated, but was allocated to ns/thief uid-thief since the pass read etcd; not repaired",
			"ClusterIPNotAllocated 192.168.1.21 uid-u | 192.168.1.0/24 | Cluster IP 192.168.1.21 is not " +
				"allocated, and allocating it to ns/u uid-u failed; not repaired: disk on fire",
			"ClusterIPWrongOwner 192.168.1.22 uid-w | 192.168.1.0/24 | Cluster IP 192.168.1.22 is " +
				"allocated to ns/old uid-old, but changed since the pass read it, or kept changing; not " +
				"reassigned: reassign 192.168.1.22: conflict: changed since read",
			"ClusterIPWrongOwner 192.168.1.23 uid-x | 192.168.1.0/24 | Cluster IP 192.168.1.23 is " +
				"allocated to ns/old uid-old, and reassigning it to ns/x uid-x failed; not " +
				"reassigned: disk on fire",
			"LeakReleased 192.168.1.50 uid-leak repaired | 192.168.1.0/24 | Cluster IP 192.168.1.50 of " +
				"ns/leak uid-leak appears to have leaked: cleaned up",
			"LeakSuspected 192.168.1.51 uid-leak | 192.168.1.0/24 | Cluster IP 192.168.1.51 of ns/leak " +
				"uid-leak appears to have leaked, but cleaning it up failed: kept: disk on fire",
			"LeakSuspected 192.168.1.52 uid-leak | 192.168.1.0/24 | Cluster IP 192.168.1.52 of ns/leak " +
				"uid-leak appeared to have leaked, but changed since the pass read it: kept",
		},
	}, {
		name:   "leak within its grace",
		o:      opts{strikes: 1, grace: time.Hour},
		before: func(r *replica, _ *hookStore) { r.assign("uid-leak", ip("192.168.1.50")) },
		want: []string{
			"LeakSuspected 192.168.1.50 uid-leak | 192.168.1.0/24 | Cluster IP 192.168.1.50 of ns/leak " +
				"uid-leak appears to have leaked, but was only {} old when the snapshot was received " +
				"(grace 1h0m0s): kept",
		},
	}, {
		name: "service CIDR full",
		before: func(_ *replica, hs *hookStore) {
			hs.beforeAssign = func(allocator.Owner, allocator.Item) error {
				return &allocator.FullError{Range: "192.168.1.0/24"}
			}
		},
		snap: []repair.Service{svc("uid-c", ips("192.168.1.11"))},
		full: true,
		want: []string{
			"ClusterIPNotAllocated 192.168.1.11 uid-c | 192.168.1.0/24 | Cluster IP 192.168.1.11 is not " +
				"allocated; repairing",
			"ServiceCIDRFull 192.168.1.11 uid-c | 192.168.1.0/24 | Service CIDR 192.168.1.0/24 is full; " +
				"you must widen the CIDR in order to create new services",
		},
	}, {
		name: "port range full",
		before: func(_ *replica, hs *hookStore) {
			hs.beforeAssign = func(allocator.Owner, allocator.Item) error {
				return fmt.Errorf("assign: %w", allocator.ErrFull)
			}
		},
		snap: []repair.Service{svc("uid-c", nil, 30500)},
		full: true,
		want: []string{
			"PortNotAllocated 30500 uid-c | 30000-32767 | Port 30500 is not allocated; repairing",
			"PortRangeFull 30500 uid-c | 30000-32767 | Port range 30000-32767 is full; you must widen the " +
				"port range in order to create new services",
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := etcdtest.New(t)
			var hs *hookStore
			tc.o.wrap = hooked(&hs)
			r := newReplica(t, e.Client, tc.o, "replica-0")
			r.waitLeader()
			var other *replica // started first: its allocator reserves the kubernetes address
			if tc.stale {
				other = newReplica(t, e.NewClient(), opts{noRun: true}, "replica-1")
			}
			if tc.before != nil {
				tc.before(r, hs)
			}
			r.push(1, tc.snap...)
			if tc.stale {
				other.push(2, tc.snap...)
			}
			if tc.after != nil {
				tc.after(r, hs)
			}
			rep, err := r.ctl.RunRepair(context.Background(), tc.dry)
			if err != nil {
				t.Fatalf("RunRepair() = %v; want a report", err)
			}
			if tc.full != errors.Is(rep.Err, allocator.ErrFull) {
				t.Errorf("RunRepair() report error = %v; want a full range: %v", rep.Err, tc.full)
			}
			got := details(rep.Findings)
			want := sorted(tc.want...)
			if len(got) != len(want) {
				t.Fatalf("findings =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			for i := range got {
				if !matches(want[i], got[i]) {
					t.Errorf("finding %d = %q; want %q", i, got[i], want[i])
				}
			}
		})
	}
}

// details lists findings as "Reason item uid [repaired] | range | message", sorted.
func details(fs []repair.Finding) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = summary([]repair.Finding{f})[0] + " | " + f.Range + " | " + f.Message
	}
	slices.Sort(out)
	return out
}

// matches reports whether s is want, where each {} in want stands for one or more
// characters other than a space.
func matches(want, s string) bool {
	parts := strings.Split(want, "{}")
	for i := range parts {
		parts[i] = regexp.QuoteMeta(parts[i])
	}
	return regexp.MustCompile("^" + strings.Join(parts, "[^ ]+") + "$").MatchString(s)
}

// release frees items whoever holds them (a forced Release).
func (r *replica) release(items ...allocator.Item) {
	r.t.Helper()
	if _, _, err := r.alloc.Release(context.Background(), allocator.Owner{}, items, true); err != nil {
		r.t.Fatalf("Release(%v, force) = %v", items, err)
	}
}
