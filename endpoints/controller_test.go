package endpoints

import (
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/allocd/allocd/endpoints/kube"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	"github.com/allocd/allocd/leader"
)

// syncCase is one case of kube-controller-manager's endpoints_controller_test.go
// (pkg/controller/endpoint): objects stored before the term, the snapshots, and what
// etcd holds after the controller settled. writes counts etcd writes (revisions):
// "0 requests" upstream is 0 writes here.
type syncCase struct {
	name     string
	existing []*kube.Endpoints
	svcs     []*kube.Service
	pods     []*kube.Pod
	writes   int64
	// want: the objects after, by "ns/name"; a nil value means absent.
	want map[string]*kube.Endpoints
}

func TestSyncEndpoints(t *testing.T) {
	svc := testService("default")
	headlessNoPorts := testService("default")
	headlessNoPorts.ClusterIPs = []string{"None"}
	headlessNoPorts.Ports = nil
	headlessNoPorts.Labels = map[string]string{"a": "b"}
	withLabels := testService("other")
	withLabels.Ports = []kube.ServicePort{
		{Name: "port0", Port: 80, TargetPort: kube.TargetPort{Number: 8080}, Protocol: kube.ProtocolTCP},
		{Name: "port1", Port: 88, TargetPort: kube.TargetPort{Number: 8088}, Protocol: kube.ProtocolTCP},
	}
	withLabels.Labels = map[string]string{"foo": "bar"}
	udp, sctp := testService("default"), testService("default")
	udp.Ports[0].Protocol, sctp.Ports[0].Protocol = kube.ProtocolUDP, kube.ProtocolSCTP
	noSelector := testService("default")
	noSelector.Selector = nil
	emptySelector := testService("default")
	emptySelector.Selector = map[string]string{}
	failed, succeeded := testPod("default", 0, false, 1), testPod("default", 1, false, 1)
	failed.Phase, succeeded.Phase = kube.PhaseFailed, kube.PhaseSucceeded
	labelled := ours(svc)
	labelled.Labels["foo"] = "bar"
	pod0 := addr("1.2.3.4", "default", "pod0")
	pod1 := addr("1.2.3.5", "default", "pod1")

	cases := []syncCase{{
		name:     "ItemsPreserveNoSelector",
		existing: []*kube.Endpoints{handMade("default", "foo")},
		svcs:     []*kube.Service{noSelector},
		pods:     []*kube.Pod{testPod("default", 0, true, 1)},
		writes:   0,
		want:     map[string]*kube.Endpoints{"default/foo": handMade("default", "foo")},
	}, {
		name:     "ExistingNilSubsets",
		existing: []*kube.Endpoints{ours(svc)},
		svcs:     []*kube.Service{svc},
		writes:   0,
		want:     map[string]*kube.Endpoints{"default/foo": ours(svc)},
	}, {
		name:   "NewNoSubsets",
		svcs:   []*kube.Service{svc},
		writes: 1,
		want:   map[string]*kube.Endpoints{"default/foo": ours(svc)},
	}, {
		name:     "ProtocolTCP",
		existing: []*kube.Endpoints{handMade("default", "foo")},
		svcs:     []*kube.Service{svc},
		pods:     []*kube.Pod{testPod("default", 0, true, 1)},
		writes:   1,
		want: map[string]*kube.Endpoints{"default/foo": ours(svc,
			kube.Subset{Addresses: []kube.Address{pod0}, Ports: []kube.Port{tcp(8080)}})},
	}, {
		name:   "ProtocolUDP",
		svcs:   []*kube.Service{udp},
		pods:   []*kube.Pod{testPod("default", 0, true, 1)},
		writes: 1,
		want: map[string]*kube.Endpoints{"default/foo": ours(udp, kube.Subset{Addresses: []kube.Address{pod0},
			Ports: []kube.Port{{Port: 8080, Protocol: kube.ProtocolUDP}}})},
	}, {
		name:   "ProtocolSCTP",
		svcs:   []*kube.Service{sctp},
		pods:   []*kube.Pod{testPod("default", 0, true, 1)},
		writes: 1,
		want: map[string]*kube.Endpoints{"default/foo": ours(sctp,
			kube.Subset{Addresses: []kube.Address{pod0},
				Ports: []kube.Port{{Port: 8080, Protocol: kube.ProtocolSCTP}}})},
	}, {
		name:     "HeadlessServiceLabel",
		existing: []*kube.Endpoints{ours(svc)},
		svcs:     []*kube.Service{svc},
		writes:   0,
		want:     map[string]*kube.Endpoints{"default/foo": ours(svc)},
	}, {
		name: "ExternalNameType",
		svcs: []*kube.Service{
			{Namespace: "default", Name: "a", UID: "a", Type: kube.TypeExternalName,
				Selector: map[string]string{"foo": "bar"}, Ports: svc.Ports},
			{Namespace: "default", Name: "b", UID: "b", Type: kube.TypeExternalName, Ports: svc.Ports},
			{Namespace: "default", Name: "c", UID: "c", Type: kube.TypeExternalName,
				Selector: map[string]string{"foo": "bar"}},
			{Namespace: "default", Name: "d", UID: "d", Type: kube.TypeExternalName},
		},
		pods:   []*kube.Pod{testPod("default", 0, true, 1)},
		writes: 0,
		want: map[string]*kube.Endpoints{"default/a": nil, "default/b": nil, "default/c": nil,
			"default/d": nil},
	}, {
		name:   "EmptySelectorSelectsAllMixed",
		svcs:   []*kube.Service{emptySelector},
		pods:   []*kube.Pod{testPod("default", 0, true, 1), testPod("default", 1, false, 1)},
		writes: 1,
		want: map[string]*kube.Endpoints{"default/foo": ours(emptySelector,
			kube.Subset{Addresses: []kube.Address{pod0},
				NotReadyAddresses: []kube.Address{pod1}, Ports: []kube.Port{tcp(8080)}})},
	}, {
		name: "ItemsPreexistingIdentical",
		existing: []*kube.Endpoints{ours(svc, kube.Subset{Addresses: []kube.Address{pod0},
			Ports: []kube.Port{tcp(8080)}})},
		svcs:   []*kube.Service{svc},
		pods:   []*kube.Pod{testPod("default", 0, true, 1)},
		writes: 0,
		want: map[string]*kube.Endpoints{"default/foo": ours(svc,
			kube.Subset{Addresses: []kube.Address{pod0}, Ports: []kube.Port{tcp(8080)}})},
	}, {
		name: "ItemsWithLabels",
		svcs: []*kube.Service{withLabels},
		pods: []*kube.Pod{testPod("other", 0, true, 2), testPod("other", 1, true, 2),
			testPod("other", 2, true, 2),
			testPod("blah", 0, true, 2), testPod("blah", 1, true, 2), testPod("blah", 2, true, 2),
			testPod("blah", 3, true, 2), testPod("blah", 4, true, 2)},
		writes: 1,
		want: map[string]*kube.Endpoints{"other/foo": ours(withLabels, kube.Subset{
			Addresses: []kube.Address{addr("1.2.3.4", "other", "pod0"), addr("1.2.3.5", "other", "pod1"),
				addr("1.2.3.6", "other", "pod2")},
			Ports: []kube.Port{{Name: "port0", Port: 8080, Protocol: kube.ProtocolTCP},
				{Name: "port1", Port: 8088, Protocol: kube.ProtocolTCP}},
		})},
	}, {
		name:     "ItemsPreexistingLabelsChange",
		existing: []*kube.Endpoints{labelled},
		svcs: []*kube.Service{func() *kube.Service {
			s := testService("default")
			s.Labels = map[string]string{"baz": "blah"}
			return s
		}()},
		pods:   []*kube.Pod{testPod("default", 0, true, 1)},
		writes: 1,
		want: map[string]*kube.Endpoints{"default/foo": ours(func() *kube.Service {
			s := testService("default")
			s.Labels = map[string]string{"baz": "blah"}
			return s
		}(),
			kube.Subset{Addresses: []kube.Address{pod0}, Ports: []kube.Port{tcp(8080)}})},
	}, {
		name:     "HeadlessService",
		existing: []*kube.Endpoints{handMade("default", "foo")},
		svcs:     []*kube.Service{headlessNoPorts},
		pods:     []*kube.Pod{testPod("default", 0, true, 1)},
		writes:   1,
		want: map[string]*kube.Endpoints{"default/foo": ours(headlessNoPorts,
			kube.Subset{Addresses: []kube.Address{pod0}})},
	}, {
		name:     "ExcludeNotReadyPodsFailedSucceeded",
		existing: []*kube.Endpoints{labelled},
		svcs:     []*kube.Service{svc},
		pods:     []*kube.Pod{failed, succeeded},
		writes:   1,
		want:     map[string]*kube.Endpoints{"default/foo": ours(svc)},
	}, {
		name: "ServiceNotFound",
		existing: []*kube.Endpoints{ours(svc, kube.Subset{Addresses: []kube.Address{pod0},
			Ports: []kube.Port{tcp(8080)}})},
		writes: 1,
		want:   map[string]*kube.Endpoints{"default/foo": nil},
	}, {
		// allocd's deviation (#76164): an object no allocd controller wrote is not swept.
		name:     "LeftoverHandMadeKept",
		existing: []*kube.Endpoints{handMade("default", "foo")},
		writes:   0,
		want:     map[string]*kube.Endpoints{"default/foo": handMade("default", "foo")},
	}, {
		name: "LeftoverLeaderElectionKept",
		existing: []*kube.Endpoints{func() *kube.Endpoints {
			e := ours(svc)
			e.Annotations = map[string]string{kube.AnnotationLeader: "{}"}
			return e
		}()},
		writes: 0,
		want: map[string]*kube.Endpoints{"default/foo": func() *kube.Endpoints {
			e := ours(svc)
			e.Annotations = map[string]string{kube.AnnotationLeader: "{}"}
			return e
		}()},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{}, tc.existing...)
			before := h.rev()
			h.snapshots(10, tc.svcs, tc.pods)
			h.settle()
			if got := h.rev() - before; got != tc.writes {
				t.Errorf("writes = %d; want %d", got, tc.writes)
			}
			for key, want := range tc.want {
				ns, name, _ := cutKey(key)
				assertStored(t, key, h.get(ns, name), want)
			}
		})
	}
}

func cutKey(key string) (string, string, bool) {
	for i := range len(key) {
		if key[i] == '/' {
			return key[:i], key[i+1:], true
		}
	}
	return "", key, false
}

// assertStored compares what matters of a stored object: subsets, labels, annotations
// (but the trigger time), and allocd's ownership fields.
func assertStored(t *testing.T, key string, got, want *kube.Endpoints) {
	t.Helper()
	if (got == nil) != (want == nil) {
		t.Fatalf("%s: stored = %v; want %v", key, got, want)
	}
	if got == nil {
		return
	}
	if !subsetsEqual(got.Subsets, want.Subsets) {
		t.Errorf("%s: subsets = %+v; want %+v", key, got.Subsets, want.Subsets)
	}
	if !maps.Equal(got.Labels, want.Labels) {
		t.Errorf("%s: labels = %v; want %v", key, got.Labels, want.Labels)
	}
	ga := maps.Clone(got.Annotations)
	delete(ga, kube.AnnotationTriggerTime)
	if len(ga) != 0 || len(want.Annotations) != 0 {
		if !maps.Equal(ga, want.Annotations) {
			t.Errorf("%s: annotations = %v; want %v", key, ga, want.Annotations)
		}
	}
	if got.ManagedBy != want.ManagedBy || got.ServiceUID != want.ServiceUID {
		t.Errorf("%s: managed by %q for %q; want %q for %q", key, got.ManagedBy, got.ServiceUID,
			want.ManagedBy, want.ServiceUID)
	}
}

// TestWaitsForBothSnapshots: nothing is written before the term has a snapshot of
// each kind (upstream's WaitsForAllInformersToBeSynced).
func TestWaitsForBothSnapshots(t *testing.T) {
	h := newHarness(t, Config{})
	before := h.rev()
	ctx := etcdtest.Context(t)
	if err := h.c.ApplyServiceSnapshot(ctx, 1, []*kube.Service{testService("default")}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.ApplyEvents(ctx, []Event{{Type: Upsert, Revision: 2,
		Pod: testPod("default", 0, true, 1)}}); !errors.Is(err, ErrSnapshotRequired) {
		t.Fatalf("ApplyEvents(pod) before a Pod snapshot = %v; want ErrSnapshotRequired", err)
	}
	// Only the workers write Endpoints of Services, and they start with the term's
	// syncing: not started, nothing was or will be written before the Pod snapshot.
	if h.syncing() {
		t.Fatal("the term syncs with only a Service snapshot")
	}
	if got := h.rev(); got != before {
		t.Fatalf("wrote %d times with only a Service snapshot; want 0", got-before)
	}
	if err := h.c.ApplyPodSnapshot(ctx, 1, []*kube.Pod{testPod("default", 0, true, 1)}); err != nil {
		t.Fatal(err)
	}
	h.settle()
	if got := h.rev() - before; got != 1 {
		t.Fatalf("writes after both snapshots = %d; want 1", got)
	}
}

// TestPodEvents: a Pod event changes exactly the Endpoints of the Services selecting
// it; an update of nothing the Endpoints depend on writes nothing.
func TestPodEvents(t *testing.T) {
	h := newHarness(t, Config{})
	a, b := testService("default"), testService("default")
	b.Name, b.UID, b.Selector = "other", "uid-other", map[string]string{"app": "other"}
	h.snapshots(1, []*kube.Service{a, b}, []*kube.Pod{testPod("default", 0, true, 1)})
	h.settle()
	bRev := h.get("default", "other").Revision

	before := h.rev()
	notReady := testPod("default", 0, false, 1)
	notReady.ResourceVersion = "2"
	h.events(Event{Type: Upsert, Revision: 2, Pod: notReady})
	h.settle()
	if got := h.rev() - before; got != 1 {
		t.Fatalf("writes after a readiness flip = %d; want 1", got)
	}
	got := h.get("default", "foo")
	want := ours(a,
		kube.Subset{NotReadyAddresses: []kube.Address{addr("1.2.3.4", "default", "pod0")},
			Ports: []kube.Port{tcp(8080)}})
	assertStored(t, "default/foo", got, want)
	if r := h.get("default", "other").Revision; r != bRev {
		t.Errorf("Endpoints of a Service not selecting the Pod rewritten: revision %d -> %d", bRev, r)
	}

	before = h.rev()
	same := testPod("default", 0, false, 1)
	same.ResourceVersion = "3"
	same.NodeName = "ignored-by-upstream-filter"
	res := h.events(Event{Type: Upsert, Revision: 3, Pod: same})
	h.settle()
	if got := h.rev() - before; got != 0 || res.Ignored != 1 {
		t.Fatalf("an update changing nothing the controller watches: %d writes, %+v; "+
			"want 0 writes, 1 ignored", got, res)
	}

	before = h.rev()
	h.events(Event{Type: Delete, Revision: 4, Pod: &kube.Pod{Namespace: "default", Name: "pod0"}})
	h.settle()
	assertStored(t, "default/foo", h.get("default", "foo"), ours(a))
	if got := h.rev() - before; got != 1 {
		t.Fatalf("writes after a Pod delete = %d; want 1", got)
	}
	// A replay of an old event is ignored.
	res = h.events(Event{Type: Upsert, Revision: 2, Pod: notReady})
	if res.Ignored != 1 || res.Applied != 0 {
		t.Fatalf("replayed event: %+v; want ignored", res)
	}

	// Events of one message sharing its revision are each applied, in order; the
	// same message again is a replay.
	p0, p1 := testPod("default", 0, true, 1), testPod("default", 1, true, 1)
	p0.ResourceVersion, p1.ResourceVersion = "5", "5"
	msg := []Event{{Type: Upsert, Revision: 5, Pod: p0}, {Type: Upsert, Revision: 5, Pod: p1}}
	if res := h.events(msg...); res.Applied != 2 || res.Ignored != 0 {
		t.Fatalf("two events at one revision: %+v; want both applied", res)
	}
	h.settle()
	if got := h.get("default", "foo"); len(got.Subsets) != 1 || len(got.Subsets[0].Addresses) != 2 {
		t.Fatalf("Endpoints after two events at one revision = %+v; want 2 ready addresses", got.Subsets)
	}
	if res := h.events(msg...); res.Applied != 0 || res.Ignored != 2 {
		t.Fatalf("the same message again: %+v; want both ignored", res)
	}
}

// TestMultipleServiceChanges: add, delete and re-add a Service (upstream's test of the
// same name, without its stale informer cache: writes are compared against etcd).
func TestMultipleServiceChanges(t *testing.T) {
	h := newHarness(t, Config{})
	svc := testService("default")
	h.snapshots(1, nil, []*kube.Pod{testPod("default", 0, true, 1)})
	h.events(Event{Type: Upsert, Revision: 2, Service: svc})
	h.settle()
	if h.get("default", "foo") == nil {
		t.Fatal("Endpoints not created for a new Service")
	}
	h.events(Event{Type: Delete, Revision: 3, Service: &kube.Service{Namespace: "default", Name: "foo"}})
	h.settle()
	if e := h.get("default", "foo"); e != nil {
		t.Fatalf("Endpoints of a deleted Service still stored: %+v", e)
	}
	h.events(Event{Type: Upsert, Revision: 4, Service: svc})
	h.settle()
	if h.get("default", "foo") == nil {
		t.Fatal("Endpoints not re-created for a re-added Service")
	}
}

// TestEndpointsDeletedBySomeone: an object deleted behind the controller's back is
// re-created while its Service wants it.
func TestEndpointsDeletedBySomeone(t *testing.T) {
	h := newHarness(t, Config{})
	h.snapshots(1, []*kube.Service{testService("default")}, []*kube.Pod{testPod("default", 0, true, 1)})
	h.settle()
	if _, err := h.cli.Delete(etcdtest.Context(t), testPrefix+"/endpoints/default/foo"); err != nil {
		t.Fatal(err)
	}
	waitStored(t, h, "default", "foo")
}

// TestUndecodableWrittenOver: a stored Endpoints value that does not decode is written
// over by the sync that wants the object there: of a Service with a selector, or of
// the master leases (default/kubernetes). The view keeps it as an object nobody wrote,
// at the value's ModRevision, which the write compares; before, the view left it out,
// the write was a create that compares ModRevision 0, and it conflicted for ever.
func TestUndecodableWrittenOver(t *testing.T) {
	master := &kube.Endpoints{Subsets: []kube.Subset{{Addresses: []kube.Address{{IP: "10.0.0.1"}},
		Ports: []kube.Port{{Name: "https", Port: 6443, Protocol: kube.ProtocolTCP}}}}}
	for _, tc := range []struct {
		name      string
		key       string
		sync      func(h *harness)
		managedBy string // of the object written
	}{
		{name: "a Service's", key: "default/foo", managedBy: kube.ManagedByController,
			sync: func(h *harness) {
				h.snapshots(1, []*kube.Service{testService("default")},
					[]*kube.Pod{testPod("default", 0, true, 1)})
			}},
		{name: "the master leases'", key: masterKey, managedBy: kube.ManagedByMasterLease,
			sync: func(h *harness) { h.c.SetMasterEndpoints(master) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{})
			if _, err := h.cli.Put(etcdtest.Context(t), h.c.etcdKey(tc.key), "\xff\xff"); err != nil {
				t.Fatal(err)
			}
			tc.sync(h)
			ns, name, _ := strings.Cut(tc.key, "/")
			written := func() bool {
				resp, err := h.cli.Get(etcdtest.Context(t), h.c.etcdKey(tc.key))
				if err != nil || len(resp.Kvs) != 1 {
					return false
				}
				_, err = decodeEndpoints(resp.Kvs[0].Value, 0, 0)
				return err == nil
			}
			if !etcdtest.Eventually(5*time.Second, written) {
				t.Fatalf("%s still holds the undecodable value after 5 s", tc.key)
			}
			if e := h.get(ns, name); e.ManagedBy != tc.managedBy || len(e.Subsets) != 1 {
				t.Errorf("%s written over with %+v; want the object of %s", tc.key, e, tc.managedBy)
			}
		})
	}
}

func waitStored(t *testing.T, h *harness, ns, name string) {
	t.Helper()
	etcdtest.WaitFor(t, 5*time.Second, ns+"/"+name+" stored", func() bool { return h.get(ns, name) != nil })
}

// TestOverCapacity: 1,500 ready Pods give 1,000 addresses and the annotation; a sync
// with nothing changed does not rewrite the truncated object (allocd's deviation).
func TestOverCapacity(t *testing.T) {
	h := newHarness(t, Config{})
	var pods []*kube.Pod
	for i := range 1500 {
		p := testPod("default", i, true, 1)
		p.PodIPs = []string{"10.1." + itoa(i/250) + "." + itoa(i%250+1)}
		pods = append(pods, p)
	}
	h.snapshots(1, []*kube.Service{testService("default")}, pods)
	h.settle()
	e := h.get("default", "foo")
	if ready, notReady := CountAddresses(e.Subsets); ready != MaxAddresses || notReady != 0 {
		t.Fatalf("stored %d ready, %d not ready; want %d, 0", ready, notReady, MaxAddresses)
	}
	if e.Annotations[kube.AnnotationOverCapacity] != kube.Truncated || e.AddressCount != 1500 {
		t.Fatalf("annotation %q, address count %d; want %q, 1500", e.Annotations[kube.AnnotationOverCapacity],
			e.AddressCount, kube.Truncated)
	}
	before := h.rev()
	h.snapshots(2, []*kube.Service{testService("default")}, pods)
	h.settle()
	if got := h.rev() - before; got != 0 {
		t.Fatalf("a truncated object with nothing changed was rewritten %d times; want 0", got)
	}
}

func itoa(i int) string {
	return string(rune('0'+i/100%10)) + string(rune('0'+i/10%10)) + string(rune('0'+i%10))
}

// TestFence: once the election key is gone (another replica may lead), the term's
// writes are refused by etcd and the term ends; nothing it computed lands.
func TestFence(t *testing.T) {
	h := newHarness(t, Config{})
	h.snapshots(1, []*kube.Service{testService("default")}, []*kube.Pod{testPod("default", 0, true, 1)})
	h.settle()
	// A new leader's election key replaces ours.
	if _, err := h.cli.Delete(etcdtest.Context(t), h.fence.Key); err != nil {
		t.Fatal(err)
	}
	stored := h.get("default", "foo")
	notReady := testPod("default", 0, false, 1)
	notReady.ResourceVersion = "2"
	h.events(Event{Type: Upsert, Revision: 2, Pod: notReady})
	select {
	case err := <-h.done:
		if !errors.Is(err, leader.ErrFenceLost) {
			t.Fatalf("Lead = %v; want leader.ErrFenceLost", err)
		}
		h.cancel = nil
	case <-time.After(5 * time.Second):
		t.Fatal("the term did not end after its fence was lost")
	}
	if got := h.get("default", "foo"); got.Revision != stored.Revision {
		t.Fatalf("a deposed leader wrote: revision %d -> %d", stored.Revision, got.Revision)
	}
	if h.c.Leading() {
		t.Fatal("Leading() after the term ended")
	}
	if _, err := h.c.ApplyEvents(etcdtest.Context(t), nil); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("ApplyEvents after the term = %v; want ErrNotLeader", err)
	}
}

// TestNewTermNeedsFreshSnapshots: a second term starts from nothing: events are refused
// until snapshots come, and an object is never deleted for want of inputs.
func TestNewTermNeedsFreshSnapshots(t *testing.T) {
	h := newHarness(t, Config{})
	h.snapshots(1, []*kube.Service{testService("default")}, []*kube.Pod{testPod("default", 0, true, 1)})
	h.settle()
	if err := h.stop(); err != nil {
		t.Fatalf("Lead = %v", err)
	}
	h.lead()
	before := h.rev()
	if _, err := h.c.ApplyEvents(etcdtest.Context(t), []Event{{Type: Upsert, Revision: 5,
		Service: testService("default")}}); !errors.Is(err, ErrSnapshotRequired) {
		t.Fatalf("ApplyEvents in a new term = %v; want ErrSnapshotRequired", err)
	}
	if err := h.c.ApplyServiceSnapshot(etcdtest.Context(t), 5, nil); err != nil {
		t.Fatal(err)
	}
	if h.syncing() {
		t.Fatal("a term without a Pod snapshot syncs")
	}
	if h.get("default", "foo") == nil || h.rev() != before {
		t.Fatal("a term without a Pod snapshot deleted or wrote an object")
	}
}

// TestPodBatching ports upstream's TestPodUpdatesBatching: three IP changes 100 ms apart
// make three writes without batching and one inside a batch period.
func TestPodBatching(t *testing.T) {
	for _, tc := range []struct {
		name   string
		period time.Duration
		writes int64
	}{{"none", 0, 3}, {"1s", time.Second, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			h := newHarness(t, Config{BatchPeriod: tc.period, Clock: clock})
			h.snapshots(1, []*kube.Service{testService("default")},
				[]*kube.Pod{testPod("default", 0, true, 1)})
			h.settle()
			before := h.rev()
			for i := range 3 {
				p := testPod("default", 0, true, 1)
				p.ResourceVersion = itoa(10 + i)
				p.PodIPs = []string{"10.0.0." + itoa(10+i)}
				h.events(Event{Type: Upsert, Revision: int64(10 + i), Pod: p})
				if tc.period == 0 {
					h.settle() // synced before the next change, as 100 ms later
				}
				clock.Advance(100 * time.Millisecond)
			}
			if tc.period > 0 {
				if got := h.rev() - before; got != 0 {
					t.Fatalf("writes inside the batch period = %d; want 0", got)
				}
				clock.Advance(tc.period) // the period ends
			}
			h.settle()
			if got := h.rev() - before; got != tc.writes {
				t.Fatalf("writes = %d; want %d", got, tc.writes)
			}
		})
	}
}

// TestMasterEndpoints: the master leases' Endpoints are stored as default/kubernetes,
// whatever the feeds say, and an empty state is written only over a stored one.
func TestMasterEndpoints(t *testing.T) {
	h := newHarness(t, Config{})
	before := h.rev()
	h.masterSynced(&kube.Endpoints{})
	if h.get("default", "kubernetes") != nil || h.rev() != before {
		t.Fatal("an empty kubernetes Endpoints was created")
	}
	h.c.SetMasterEndpoints(
		&kube.Endpoints{Subsets: []kube.Subset{{Addresses: []kube.Address{{IP: "10.0.0.2"}, {IP: "10.0.0.1"}},
			Ports: []kube.Port{{Name: "https", Port: 6443, Protocol: kube.ProtocolTCP}}}}})
	waitStored(t, h, "default", "kubernetes")
	e := h.get("default", "kubernetes")
	if e.ManagedBy != kube.ManagedByMasterLease || len(e.Subsets) != 1 ||
		e.Subsets[0].Addresses[0].IP != "10.0.0.1" {
		t.Fatalf("stored %+v", e)
	}
	// A selectorless kubernetes Service in the feed leaves it alone.
	h.snapshots(1, []*kube.Service{{Namespace: "default", Name: "kubernetes", UID: "k",
		Type: kube.TypeClusterIP, ClusterIPs: []string{"10.0.0.1"}}}, nil)
	h.settle()
	if got := h.get("default", "kubernetes"); got.Revision != e.Revision {
		t.Fatalf("the feed rewrote the master leases' Endpoints")
	}
}

// TestHeartbeat: an empty batch answers SnapshotRequired until the term has both
// snapshots: that is how an idle feeder learns that a new leader needs them.
func TestHeartbeat(t *testing.T) {
	h := newHarness(t, Config{})
	ctx := etcdtest.Context(t)
	if _, err := h.c.ApplyEvents(ctx, nil); !errors.Is(err, ErrSnapshotRequired) {
		t.Fatalf("heartbeat with no snapshot = %v; want ErrSnapshotRequired", err)
	}
	if err := h.c.ApplyServiceSnapshot(ctx, 1, nil); err != nil {
		t.Fatal(err)
	}
	var sr *SnapshotRequiredError
	if _, err := h.c.ApplyEvents(ctx, nil); !errors.As(err, &sr) || sr.Kind != KindPod {
		t.Fatalf("heartbeat with only a Service snapshot = %v; want a Pod SnapshotRequiredError", err)
	}
	if err := h.c.ApplyPodSnapshot(ctx, 1, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.ApplyEvents(ctx, nil); err != nil {
		t.Fatalf("heartbeat with both snapshots = %v; want nil", err)
	}
}

// TestMasterResync: a hand edit of the stored default/kubernetes Endpoints is put
// right within MasterResync (--endpoint-reconciler-interval), as kube-apiserver's
// reconciler does, without a change of the leases.
func TestMasterResync(t *testing.T) {
	clock := clockwork.NewFakeClock()
	h := newHarness(t, Config{MasterResync: time.Minute, Clock: clock})
	h.c.SetMasterEndpoints(&kube.Endpoints{Subsets: []kube.Subset{{
		Addresses: []kube.Address{{IP: "10.0.0.1"}},
		Ports:     []kube.Port{{Name: "https", Port: 6443, Protocol: kube.ProtocolTCP}}}}})
	waitStored(t, h, "default", "kubernetes")
	edited := h.get("default", "kubernetes")
	edited.Subsets[0].Addresses[0].IP = "10.9.9.9"
	h.store(edited)
	fixed := func() bool {
		e := h.get("default", "kubernetes")
		return e != nil && len(e.Subsets) == 1 && e.Subsets[0].Addresses[0].IP == "10.0.0.1"
	}
	// The resync, retry and queue timers.
	if err := clock.BlockUntilContext(etcdtest.Context(t), 3); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute - time.Millisecond)
	if fixed() {
		t.Fatal("default/kubernetes put right before MasterResync")
	}
	// Each resync compares with the stored object as the term's watch last saw it: one
	// that ran before the watch saw the edit found nothing to do, the next one does.
	etcdtest.WaitFor(t, 10*time.Second, "default/kubernetes put right by a resync", func() bool {
		clock.Advance(time.Minute)
		return fixed()
	})
}
