package endpoints

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/testing/etcdtest"

	"github.com/allocd/allocd/endpoints/kube"
	"github.com/allocd/allocd/leader"
)

// harness runs a Controller leading one term on a real etcd.
type harness struct {
	t      *testing.T
	etcd   *etcdtest.Server
	cli    *clientv3.Client
	c      *Controller
	fence  leader.Fence
	cancel context.CancelFunc
	done   chan error
}

const testPrefix = "/allocd"

// newHarness starts etcd and the Endpoints controller alone (newSliceHarness runs
// the EndpointSlice controller); existing objects are stored before the term starts
// (as an earlier leader or a person left them).
func newHarness(t *testing.T, cfg Config, existing ...*kube.Endpoints) *harness {
	t.Helper()
	cfg.DisableEndpointSlices = true
	e := etcdtest.New(t)
	h := &harness{t: t, etcd: e, cli: e.Client}
	for _, ep := range existing {
		h.store(ep)
	}
	cfg.Prefix = testPrefix
	c, err := New(e.Client, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.c = c
	h.lead()
	return h
}

// lead starts a term fenced by a fresh election key.
func (h *harness) lead() {
	h.t.Helper()
	ctx := etcdtest.Context(h.t)
	key := testPrefix + "/repair/leader/" + strconv.FormatInt(time.Now().UnixNano(), 16)
	resp, err := h.cli.Put(ctx, key, "test")
	if err != nil {
		h.t.Fatalf("put election key: %v", err)
	}
	h.fence = leader.Fence{Key: key, Rev: resp.Header.Revision}
	lctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- h.c.Lead(lctx, h.fence) }()
	h.t.Cleanup(func() { h.stop() })
	etcdtest.WaitFor(h.t, 5*time.Second, "term started", h.c.Leading)
}

// stop ends the term and returns Lead's error.
func (h *harness) stop() error {
	if h.cancel == nil {
		return nil
	}
	h.cancel()
	h.cancel = nil
	select {
	case err := <-h.done:
		return err
	case <-time.After(10 * time.Second):
		h.t.Fatalf("Lead did not return within 10 s of its context's end")
		return nil
	}
}

// store writes ep as it is into etcd (an object the controller did not write now).
func (h *harness) store(ep *kube.Endpoints) {
	h.t.Helper()
	b := encodeEndpoints(ep)
	if _, err := h.cli.Put(etcdtest.Context(h.t), testPrefix+"/endpoints/"+ep.Key(), string(b)); err != nil {
		h.t.Fatal(err)
	}
}

// snapshots pushes a Service and a Pod snapshot.
func (h *harness) snapshots(rev int64, svcs []*kube.Service, pods []*kube.Pod) {
	h.t.Helper()
	ctx := etcdtest.Context(h.t)
	if err := h.c.ApplyServiceSnapshot(ctx, rev, svcs); err != nil {
		h.t.Fatalf("ApplyServiceSnapshot: %v", err)
	}
	if err := h.c.ApplyPodSnapshot(ctx, rev, pods); err != nil {
		h.t.Fatalf("ApplyPodSnapshot: %v", err)
	}
}

// events applies events and fails the test on an error.
func (h *harness) events(evs ...Event) EventsResult {
	h.t.Helper()
	res, err := h.c.ApplyEvents(etcdtest.Context(h.t), evs)
	if err != nil {
		h.t.Fatalf("ApplyEvents: %v", err)
	}
	return res
}

// settle waits until the term has nothing left to do.
func (h *harness) settle() {
	h.t.Helper()
	t, err := h.c.currentTerm()
	if err != nil {
		h.t.Fatalf("no term: %v", err)
	}
	etcdtest.WaitFor(h.t, 10*time.Second, "controller idle", func() bool {
		for _, c := range []chan struct{}{t.storedEndpoints.listed, t.storedSlices.listed} {
			select {
			case <-c:
			default:
				return false
			}
		}
		return t.idle()
	})
	// A key handed out and finished between two looks is done; one more look after a
	// pause catches a key queued by the watch of the last write.
	time.Sleep(20 * time.Millisecond)
	etcdtest.WaitFor(h.t, 10*time.Second, "controller idle", t.idle)
}

// syncing reports whether a controller of the term has the snapshots it needs and
// runs its workers, which write the objects of Services (and delete leftovers).
func (h *harness) syncing() bool {
	h.t.Helper()
	t, err := h.c.currentTerm()
	if err != nil {
		h.t.Fatalf("no term: %v", err)
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, half := range []*half{t.eps, t.slices} {
		if half != nil && half.started {
			return true
		}
	}
	return false
}

// masterSynced sets the master leases' Endpoints to ep and returns once the term has
// synced them: keepMaster takes one signal at a time, so once it has taken a second
// one, the sync of the first is over.
func (h *harness) masterSynced(ep *kube.Endpoints) {
	h.t.Helper()
	t, err := h.c.currentTerm()
	if err != nil {
		h.t.Fatalf("no term: %v", err)
	}
	for range 2 {
		h.c.SetMasterEndpoints(ep)
		etcdtest.WaitFor(h.t, 10*time.Second, "the master endpoints taken",
			func() bool { return len(t.masterc) == 0 })
	}
}

// rev returns etcd's current revision: unchanged means nothing was written.
func (h *harness) rev() int64 {
	h.t.Helper()
	resp, err := h.cli.Get(etcdtest.Context(h.t), "/none")
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.Header.Revision
}

// get reads a stored object, nil when absent.
func (h *harness) get(ns, name string) *kube.Endpoints {
	h.t.Helper()
	resp, err := h.cli.Get(etcdtest.Context(h.t), testPrefix+"/endpoints/"+ns+"/"+name)
	if err != nil {
		h.t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	e, err := decodeEndpoints(resp.Kvs[0].Value, resp.Kvs[0].ModRevision, resp.Kvs[0].CreateRevision)
	if err != nil {
		h.t.Fatal(err)
	}
	return e
}

// testPod is upstream's test pod "podN": IP 1.2.3.(4+N), label foo=bar, nPorts container
// ports "portJ" = 8080+J.
func testPod(ns string, n int, ready bool, nPorts int) *kube.Pod {
	p := &kube.Pod{
		Namespace:       ns,
		Name:            "pod" + strconv.Itoa(n),
		UID:             "uid-" + ns + "-" + strconv.Itoa(n),
		ResourceVersion: "1",
		Labels:          map[string]string{"foo": "bar"},
		PodIPs:          []string{fmt.Sprintf("1.2.3.%d", 4+n)},
		Phase:           kube.PhaseRunning,
		Ready:           ready,
	}
	ct := kube.Container{Name: "c"}
	for j := range nPorts {
		ct.Ports = append(ct.Ports, kube.ContainerPort{Name: "port" + strconv.Itoa(j),
			ContainerPort: int32(8080 + j), Protocol: kube.ProtocolTCP})
	}
	p.Containers = []kube.Container{ct}
	return p
}

// testService is a Service "foo" with selector foo=bar and no cluster IP (so its
// Endpoints carry the headless label), port 80 -> 8080 TCP.
func testService(ns string) *kube.Service {
	return &kube.Service{
		Namespace: ns,
		Name:      "foo",
		UID:       "svc-uid-" + ns,
		Type:      kube.TypeClusterIP,
		Selector:  map[string]string{"foo": "bar"},
		Ports: []kube.ServicePort{{Port: 80, TargetPort: kube.TargetPort{Number: 8080},
			Protocol: kube.ProtocolTCP}},
	}
}

// ours is an object as this controller would have stored it for svc.
func ours(svc *kube.Service, subsets ...kube.Subset) *kube.Endpoints {
	labels := map[string]string{kube.LabelManagedBy: kube.ControllerName}
	for k, v := range svc.Labels {
		labels[k] = v
	}
	if ip := svc.ClusterIP(); ip == "" || ip == "None" {
		labels[kube.LabelHeadless] = ""
	}
	return &kube.Endpoints{Namespace: svc.Namespace, Name: svc.Name, Labels: labels, Subsets: subsets,
		ServiceUID: svc.UID, ManagedBy: kube.ManagedByController}
}

func addr(ip, ns, pod string) kube.Address {
	return kube.Address{IP: ip,
		TargetRef: &kube.ObjectRef{Kind: "Pod", Namespace: ns, Name: pod, UID: "uid-" + ns + "-" + pod[3:]}}
}

func tcp(port int32) kube.Port { return kube.Port{Port: port, Protocol: kube.ProtocolTCP} }

// handMade is an Endpoints object with 6.7.8.9:1000 that nobody in allocd wrote.
func handMade(ns, name string) *kube.Endpoints {
	return &kube.Endpoints{Namespace: ns, Name: name,
		Subsets: []kube.Subset{{Addresses: []kube.Address{{IP: "6.7.8.9", NodeName: "n1"}},
			Ports: []kube.Port{tcp(1000)}}}}
}
