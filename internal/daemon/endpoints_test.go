package daemon

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/internal/etcdtest"
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
	return &allocdv1.Pod{Namespace: "shop", Name: name, Uid: "uid-" + name, Labels: map[string]string{"app": "web"},
		PodIps: []string{ip}, Phase: "Running", Ready: ready,
		Containers: []*allocdv1.Container{{Name: "c", Ports: []*allocdv1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}}
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

	st := &store{rev: 1, svcs: map[string]*allocdv1.Service{"shop/web": {Namespace: "shop", Name: "web", Uid: "uid-web",
		ClusterIps: []string{"10.0.0.50"}, Selector: &allocdv1.Selector{MatchLabels: map[string]string{"app": "web"}},
		Ports: []*allocdv1.ServicePortSpec{{Name: "http", Port: 80, TargetPort: &allocdv1.TargetPort{Value: &allocdv1.TargetPort_StrValue{StrValue: "http"}}}}}},
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
