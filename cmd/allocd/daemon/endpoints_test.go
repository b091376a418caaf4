package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// store is a shim's informer caches, as a client.Lister.
type store struct {
	mu   sync.Mutex
	rev  int64
	svcs map[string]*allocdv1.Service
	pods map[string]*allocdv1.Pod
}

func (s *store) ListServices() ([]*allocdv1.Service, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*allocdv1.Service
	for _, v := range s.svcs {
		out = append(out, v)
	}
	return out, s.rev, nil
}

func (s *store) ListPods() ([]*allocdv1.Pod, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*allocdv1.Pod
	for _, v := range s.pods {
		out = append(out, v)
	}
	return out, s.rev, nil
}

// ListNodes lists no Node: the Pods name none.
func (s *store) ListNodes() ([]*allocdv1.Node, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return nil, s.rev, nil
}

// setPod changes a Pod in the store and tells the feeder, as an informer would.
func (s *store) setPod(f *client.Feeder, p *allocdv1.Pod) {
	s.mu.Lock()
	s.rev++
	p.ResourceVersion = fmt.Sprint(s.rev)
	s.pods[p.Namespace+"/"+p.Name] = p
	rev := s.rev
	s.mu.Unlock()
	f.UpsertPod(p, rev)
}

func webPod(name, ip string, ready bool) *allocdv1.Pod {
	return &allocdv1.Pod{Namespace: "shop", Name: name, Uid: "uid-" + name,
		Labels: map[string]string{"app": "web"},
		PodIps: []string{ip}, Phase: "Running", Ready: ready,
		Containers: []*allocdv1.Container{{Name: "c",
			Ports: []*allocdv1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}}
}

// TestEndpointsLeaderChange: two replicas on one etcd, a Feeder talking to the one that
// does not lead (its feeds are forwarded). When the leader stops, the other leads, the
// Feeder learns from its heartbeat that the new term needs snapshots, pushes them, and
// the events after that land; the Endpoints were never deleted on the way.
func TestEndpointsLeaderChange(t *testing.T) {
	e := etcdtest.New(t)
	var ds []*Daemon
	for range 2 {
		ds = append(ds, StartForTest(t, func(c *Config) { c.EtcdServers = []string{e.Endpoint} }))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clients := make([]*client.Client, 2)
	for i, d := range ds {
		c, err := client.New(d.GRPCAddr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		clients[i] = c
	}
	var leader int
	etcdtest.WaitFor(t, 20*time.Second, "a repair leader", func() bool {
		st, err := clients[0].GetRepairStatus(ctx)
		if err != nil || st.GetLeader() == "" {
			return false
		}
		leader = map[bool]int{true: 0, false: 1}[st.GetLeader() == ds[0].GRPCAddr()]
		return true
	})
	other := 1 - leader

	// Every change of shop's Endpoints, seen from the replica that stays.
	var mu sync.Mutex
	var deleted int
	go clients[other].WatchServiceEndpoints(ctx, &allocdv1.WatchServiceEndpointsRequest{Namespace: "shop"},
		func(ev *allocdv1.WatchServiceEndpointsResponse) error {
			if ev.GetType() == allocdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED {
				mu.Lock()
				deleted++
				mu.Unlock()
			}
			return nil
		})

	st := &store{rev: 1,
		svcs: map[string]*allocdv1.Service{"shop/web": {Namespace: "shop", Name: "web", Uid: "uid-web",
			ClusterIps: []string{"10.0.0.50"},
			Selector:   &allocdv1.Selector{MatchLabels: map[string]string{"app": "web"}},
			Ports: []*allocdv1.ServicePortSpec{{Name: "http", Port: 80,
				TargetPort: &allocdv1.TargetPort{Value: &allocdv1.TargetPort_StrValue{StrValue: "http"}}}}}},
		pods: map[string]*allocdv1.Pod{}}
	for i := range 3 {
		p := webPod(fmt.Sprintf("web-%d", i), fmt.Sprintf("10.244.0.%d", i+1), true)
		p.ResourceVersion = "1"
		st.pods["shop/"+p.Name] = p
	}
	f := client.NewFeeder(clients[other], st, client.WithHeartbeat(100*time.Millisecond))
	fctx, fcancel := context.WithCancel(ctx)
	defer fcancel()
	go f.Run(fctx)

	ready := func(want int) func() bool {
		return func() bool {
			ep, err := clients[other].GetServiceEndpoints(ctx, "shop", "web")
			if err != nil || len(ep.GetSubsets()) != 1 {
				return want == 0 && err == nil && len(ep.GetSubsets()) == 0
			}
			return len(ep.GetSubsets()[0].GetAddresses()) == want
		}
	}
	etcdtest.WaitFor(t, 20*time.Second, "3 ready addresses", ready(3))
	st.setPod(f, webPod("web-0", "10.244.0.1", false))
	etcdtest.WaitFor(t, 10*time.Second, "2 ready addresses after a readiness event", ready(2))

	if err := ds[leader].Close(); err != nil {
		t.Fatalf("close the leader: %v", err)
	}
	// No event yet: the Feeder's heartbeat alone must learn that the new term needs
	// snapshots. Only a term with both snapshots re-creates an object deleted behind
	// its back, so the re-creation shows the heartbeat worked. (The delete is not
	// the controller's: the watch below counts it, so it is subtracted.)
	if _, err := e.Client.Delete(ctx, "/allocd/endpoints/shop/web"); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 20*time.Second, "the Endpoints re-created by the new leader after an idle heartbeat",
		ready(2))
	mu.Lock()
	deleted--
	mu.Unlock()
	st.setPod(f, webPod("web-1", "10.244.0.2", false))
	etcdtest.WaitFor(t, 30*time.Second, "1 ready address after the leader changed", ready(1))
	st.setPod(f, webPod("web-2", "10.244.0.3", false))
	etcdtest.WaitFor(t, 10*time.Second, "0 ready addresses", ready(0))
	mu.Lock()
	defer mu.Unlock()
	if deleted != 0 {
		t.Fatalf("the Endpoints were deleted %d times on the way; want never", deleted)
	}
}

// TestEndpointsBadInput: through gRPC, a malformed object anywhere in a message is
// INVALID_ARGUMENT naming its field and nothing of the message is applied; an event
// before its kind's snapshot is SNAPSHOT_REQUIRED; a watch from a compacted revision
// is ErrCompacted.
func TestEndpointsBadInput(t *testing.T) {
	d := StartForTest(t)
	c, err := client.New(d.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	etcdtest.WaitFor(t, 20*time.Second, "the controller's term", func() bool {
		_, err := c.PushEvents(ctx)
		return errors.Is(err, client.ErrSnapshotRequired)
	})
	pod := webPod("web-0", "10.244.0.1", true)
	if _, err := c.PushEvents(ctx, &allocdv1.PushEventsRequest{Revision: 2, Events: []*allocdv1.Event{{
		Type:   allocdv1.EventType_EVENT_TYPE_UPSERT,
		Object: &allocdv1.Event_Pod{Pod: pod}}}}); !errors.Is(err, client.ErrSnapshotRequired) {
		t.Fatalf("PushEvents before any snapshot = %v; want ErrSnapshotRequired", err)
	}

	svc := &allocdv1.Service{Namespace: "shop", Name: "web", Uid: "uid-web",
		ClusterIps: []string{"10.0.0.50"},
		Selector:   &allocdv1.Selector{MatchLabels: map[string]string{"app": "web"}},
		Ports: []*allocdv1.ServicePortSpec{{Port: 80,
			TargetPort: &allocdv1.TargetPort{Value: &allocdv1.TargetPort_StrValue{StrValue: "http"}}}}}
	badSvc := &allocdv1.Service{Namespace: "shop", Name: "bad", Uid: "uid-bad",
		Ports: []*allocdv1.ServicePortSpec{{Port: 80, Protocol: "HTTP"}}}
	_, err = c.PushServiceSnapshot(ctx,
		&allocdv1.ServiceSnapshot{Revision: 5, Services: []*allocdv1.Service{svc, badSvc}})
	assertInvalid(t, "PushServiceSnapshot", err, "snapshot.services[1].ports[0].protocol")
	if st, err := c.GetRepairStatus(ctx); err != nil || st.GetSnapshotRevision() != 0 {
		t.Fatalf("repair took a refused snapshot: revision %d, %v", st.GetSnapshotRevision(), err)
	}
	if _, err := c.PushServiceSnapshot(ctx,
		&allocdv1.ServiceSnapshot{Revision: 5, Services: []*allocdv1.Service{svc}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PushPodSnapshot(ctx,
		&allocdv1.PodSnapshot{Revision: 5, Pods: []*allocdv1.Pod{pod}}); err != nil {
		t.Fatal(err)
	}
	var before *allocdv1.ServiceEndpoints
	etcdtest.WaitFor(t, 10*time.Second, "web's Endpoints", func() bool {
		before, err = c.GetServiceEndpoints(ctx, "shop", "web")
		return err == nil && len(before.GetSubsets()) == 1
	})

	bad := webPod("web-1", "10.244.300.1", true)
	_, err = c.PushPodSnapshot(ctx,
		&allocdv1.PodSnapshot{Revision: 6, Pods: []*allocdv1.Pod{webPod("web-9", "10.244.0.9", true), bad}})
	assertInvalid(t, "PushPodSnapshot", err, "snapshot.pods[1].pod_ips[0]")
	_, err = c.PushEvents(ctx, &allocdv1.PushEventsRequest{Revision: 7, Events: []*allocdv1.Event{
		{Type: allocdv1.EventType_EVENT_TYPE_DELETE,
			Object: &allocdv1.Event_Pod{Pod: &allocdv1.Pod{Namespace: "shop", Name: "web-0"}}},
		{Type: allocdv1.EventType_EVENT_TYPE_UPSERT, Object: &allocdv1.Event_Pod{
			Pod: &allocdv1.Pod{Namespace: "shop", Name: "x", Uid: "x", Phase: "Runing"}}},
	}})
	assertInvalid(t, "PushEvents", err, "events[1].pod.phase")
	// The controller applies the feeds in order: once an event pushed after the refused
	// messages shows, whatever they had applied would show too.
	if _, err := c.PushEvents(ctx, &allocdv1.PushEventsRequest{Revision: 8, Events: []*allocdv1.Event{{
		Type:   allocdv1.EventType_EVENT_TYPE_UPSERT,
		Object: &allocdv1.Event_Pod{Pod: webPod("web-2", "10.244.0.2", true)}}}}); err != nil {
		t.Fatal(err)
	}
	var after *allocdv1.ServiceEndpoints
	etcdtest.WaitFor(t, 10*time.Second, "the event after the refused messages", func() bool {
		after, err = c.GetServiceEndpoints(ctx, "shop", "web")
		return err == nil && slices.Contains(readyIPs(after), "10.244.0.2")
	})
	if got, want := readyIPs(after), []string{"10.244.0.1", "10.244.0.2"}; !slices.Equal(got, want) ||
		after.GetRevision() <= before.GetRevision() {
		t.Fatalf("web's Endpoints after refused messages and one event = %v at revision %d (before: %d); "+
			"want %v, that event's only",
			got, after.GetRevision(), before.GetRevision(), want)
	}

	if _, err := d.Client().Compact(ctx, after.GetRevision()); err != nil {
		t.Fatal(err)
	}
	err = c.WatchServiceEndpoints(ctx, &allocdv1.WatchServiceEndpointsRequest{StartRevision: 1},
		func(*allocdv1.WatchServiceEndpointsResponse) error { return nil })
	if !errors.Is(err, client.ErrCompacted) {
		t.Fatalf("watch from a compacted revision = %v; want ErrCompacted", err)
	}
}

func assertInvalid(t *testing.T, call string, err error, field string) {
	t.Helper()
	var inv *client.InvalidError
	if !errors.As(err, &inv) || !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("%s = %v; want ErrInvalid", call, err)
	}
	for _, v := range inv.Violations {
		if v.Field == field {
			return
		}
	}
	t.Fatalf("%s violations = %+v; want one for %s", call, inv.Violations, field)
}

// TestServiceEventsReachRepair: one Service feed serves repair and the controller. A
// Service deleted by an event, sent to the replica that does not lead, empties its
// Endpoints and makes its address a leak candidate of the next repair pass, without a
// new snapshot.
func TestServiceEventsReachRepair(t *testing.T) {
	e := etcdtest.New(t)
	var cs []*client.Client
	var ds []*Daemon
	for range 2 {
		d := StartForTest(t, func(c *Config) { c.EtcdServers = []string{e.Endpoint} })
		c, err := client.New(d.GRPCAddr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		ds, cs = append(ds, d), append(cs, c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var follower *client.Client
	etcdtest.WaitFor(t, 20*time.Second, "a repair leader", func() bool {
		st, err := cs[0].GetRepairStatus(ctx)
		if err != nil || st.GetLeader() == "" {
			return false
		}
		follower = cs[map[bool]int{true: 1, false: 0}[st.GetLeader() == ds[0].GRPCAddr()]]
		return true
	})
	owner := &allocdv1.Owner{Namespace: "shop", Name: "web", Uid: "uid-web"}
	if _, err := follower.Allocate(ctx,
		&allocdv1.AllocateRequest{Owner: owner, ClusterIps: []string{"10.0.0.50"}}); err != nil {
		t.Fatal(err)
	}
	svc := &allocdv1.Service{Namespace: "shop", Name: "web", Uid: "uid-web",
		ClusterIps: []string{"10.0.0.50"},
		Selector:   &allocdv1.Selector{MatchLabels: map[string]string{"app": "web"}},
		Ports: []*allocdv1.ServicePortSpec{{Port: 80,
			TargetPort: &allocdv1.TargetPort{Value: &allocdv1.TargetPort_IntValue{IntValue: 8080}}}}}
	etcdtest.WaitFor(t, 20*time.Second, "the controller's term to take snapshots", func() bool {
		if _, err := follower.PushServiceSnapshot(ctx,
			&allocdv1.ServiceSnapshot{Revision: 5, Services: []*allocdv1.Service{svc}}); err != nil {
			return false
		}
		_, err := follower.PushPodSnapshot(ctx,
			&allocdv1.PodSnapshot{Revision: 5, Pods: []*allocdv1.Pod{webPod("web-0", "10.244.0.1", true)}})
		return err == nil
	})
	leaks := func() []string {
		t.Helper()
		rep, err := follower.RunRepair(ctx, &allocdv1.RunRepairRequest{DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, f := range rep.GetFindings() {
			if f.GetReason() == "LeakSuspected" {
				out = append(out, f.GetClusterIp())
			}
		}
		return out
	}
	if got := leaks(); len(got) != 0 {
		t.Fatalf("leak candidates with the Service in the snapshot = %v; want none", got)
	}
	if _, err := follower.PushEvents(ctx, &allocdv1.PushEventsRequest{Revision: 6, Events: []*allocdv1.Event{{
		Type: allocdv1.EventType_EVENT_TYPE_DELETE, Object: &allocdv1.Event_Service{
			Service: &allocdv1.Service{Namespace: "shop", Name: "web"}}}}}); err != nil {
		t.Fatalf("PushEvents(delete shop/web) = %v", err)
	}
	if got := leaks(); len(got) != 1 || got[0] != "10.0.0.50" {
		t.Errorf("leak candidates after the Service's delete event = %v; want [10.0.0.50]", got)
	}
	etcdtest.WaitFor(t, 10*time.Second, "shop/web's Endpoints deleted", func() bool {
		_, err := follower.GetServiceEndpoints(ctx, "shop", "web")
		return errors.Is(err, client.ErrNotFound)
	})
}
