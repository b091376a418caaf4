package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// feedStore is a shim's informer caches: the Services and Pods, as a client.Lister.
type feedStore struct {
	mu   sync.Mutex
	rev  int64
	svcs []*allocdv1.Service
	pods map[string]*allocdv1.Pod
}

func (s *feedStore) ListServices() ([]*allocdv1.Service, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.svcs, s.rev, nil
}

func (s *feedStore) ListPods() ([]*allocdv1.Pod, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*allocdv1.Pod, 0, len(s.pods))
	for _, p := range s.pods {
		out = append(out, p)
	}
	return out, s.rev, nil
}

// ListNodes lists the one Node the Pods run on.
func (s *feedStore) ListNodes() ([]*allocdv1.Node, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return []*allocdv1.Node{{Name: "node-a", Ready: true,
		Labels: map[string]string{"topology.kubernetes.io/zone": "zone-a"}}}, s.rev, nil
}

// flip changes the readiness of one Pod and tells f, as an informer's update.
func (s *feedStore) flip(f *client.Feeder, name string) {
	s.mu.Lock()
	s.rev++
	p := proto.Clone(s.pods[name]).(*allocdv1.Pod)
	p.Ready = !p.Ready
	p.ResourceVersion = fmt.Sprint(s.rev)
	s.pods[name] = p
	rev := s.rev
	s.mu.Unlock()
	f.UpsertPod(p, rev)
}

func (s *feedStore) readyCount() (ready, notReady int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.pods {
		if p.Ready {
			ready++
		} else {
			notReady++
		}
	}
	return ready, notReady
}

// TestEndpointsLeaderKill (make fault): two allocd processes on one etcd; a Feeder
// talking to the replica that does not lead pushes readiness flips every 20 ms; the
// leading process is killed with SIGKILL. The other leads once the dead one's election
// lease expires, the Feeder pushes snapshots again, and the Endpoints and the
// EndpointSlices end equal to the store. On the way neither was deleted, and at no
// revision was a Pod in two slices.
func TestEndpointsLeaderKill(t *testing.T) {
	if os.Getenv("ALLOCD_FAULT_TESTS") == "" {
		t.Skip("a fault test (about 20 s): make fault runs it")
	}
	e := etcdtest.New(t)
	bin := buildAllocd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var procs []*exec.Cmd
	var clients []*client.Client
	for range 2 {
		addr := free(t)
		cmd := exec.Command(bin, "--etcd-servers", e.Endpoint, "--grpc-address", addr,
			"--metrics-address", "", "--data-dir", t.TempDir())
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		procs = append(procs, cmd)
		c, err := client.New(addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	leader := -1
	etcdtest.WaitFor(t, 30*time.Second, "a repair leader", func() bool {
		st, err := clients[0].GetRepairStatus(ctx)
		if err != nil || st.GetLeader() == "" {
			return false
		}
		for i, p := range procs {
			if st.GetLeader() == p.Args[4] {
				leader = i
			}
		}
		return leader >= 0
	})
	other := 1 - leader

	st := &feedStore{rev: 1, pods: map[string]*allocdv1.Pod{},
		svcs: []*allocdv1.Service{{Namespace: "shop", Name: "web", Uid: "uid-web",
			ClusterIps: []string{"10.0.0.50"},
			Selector:   &allocdv1.Selector{MatchLabels: map[string]string{"app": "web"}},
			Ports: []*allocdv1.ServicePortSpec{{Name: "http", Port: 80,
				TargetPort: &allocdv1.TargetPort{Value: &allocdv1.TargetPort_IntValue{IntValue: 8080}}}}}}}
	for i := range 50 {
		name := fmt.Sprintf("web-%d", i)
		st.pods[name] = &allocdv1.Pod{Namespace: "shop", Name: name, Uid: "uid-" + name, ResourceVersion: "1",
			Labels: map[string]string{"app": "web"}, PodIps: []string{fmt.Sprintf("10.244.1.%d", i+1)},
			Phase: "Running", Ready: true,
			NodeName: "node-a"}
	}
	f := client.NewFeeder(clients[other], st, client.WithHeartbeat(200*time.Millisecond))
	go f.Run(ctx)

	var mu sync.Mutex
	deleted := 0
	go clients[other].WatchServiceEndpoints(ctx, &allocdv1.WatchServiceEndpointsRequest{Namespace: "shop"},
		func(ev *allocdv1.WatchServiceEndpointsResponse) error {
			if ev.GetType() == allocdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED {
				mu.Lock()
				deleted++
				mu.Unlock()
			}
			return nil
		})

	slices := watchSlices(ctx, t, clients[other])

	flipping, stopFlips := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for flipping.Err() == nil {
			st.flip(f, fmt.Sprintf("web-%d", rand.IntN(50)))
			time.Sleep(20 * time.Millisecond)
		}
	})
	time.Sleep(2 * time.Second)
	if err := procs[leader].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	time.Sleep(13 * time.Second) // past the dead leader's election lease (10 s)
	stopFlips()
	wg.Wait()

	wantReady, wantNotReady := st.readyCount()
	etcdtest.WaitFor(t, 30*time.Second, "Endpoints equal to the store after the leader was killed",
		func() bool {
			ep, err := clients[other].GetServiceEndpoints(ctx, "shop", "web")
			if err != nil || len(ep.GetSubsets()) != 1 {
				return false
			}
			return len(ep.GetSubsets()[0].GetAddresses()) == wantReady &&
				len(ep.GetSubsets()[0].GetNotReadyAddresses()) == wantNotReady
		})
	etcdtest.WaitFor(t, 30*time.Second, "EndpointSlices equal to the store after the leader was killed",
		func() bool {
			ready, notReady := slices.counts()
			return ready == wantReady && notReady == wantNotReady
		})
	t.Logf("converged %.1f s after the kill: %d ready, %d not ready", time.Since(killed).Seconds(), wantReady,
		wantNotReady)
	if err := slices.failure(); err != "" {
		t.Error(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if deleted != 0 {
		t.Fatalf("the Endpoints were deleted %d times; want never", deleted)
	}
}

// sliceView follows the slices of shop on a watch and checks every revision: no
// slice deleted, no Pod in two slices.
type sliceView struct {
	mu     sync.Mutex
	slices map[string]*allocdv1.EndpointSlice
	rev    int64
	err    string
}

func watchSlices(ctx context.Context, t *testing.T, c *client.Client) *sliceView {
	v := &sliceView{slices: map[string]*allocdv1.EndpointSlice{}}
	go func() {
		from := int64(0)
		for ctx.Err() == nil {
			err := c.WatchEndpointSlices(ctx,
				&allocdv1.WatchEndpointSlicesRequest{Namespace: "shop", StartRevision: from},
				func(ev *allocdv1.WatchEndpointSlicesResponse) error {
					v.apply(ev)
					from = ev.GetRevision()
					return nil
				})
			if err != nil && ctx.Err() == nil {
				time.Sleep(100 * time.Millisecond) // the replica restarts its watch after etcd trouble
			}
		}
	}()
	return v
}

// apply folds one change in; the revision before it is complete when a later one starts.
func (v *sliceView) apply(ev *allocdv1.WatchEndpointSlicesResponse) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if ev.GetRevision() != v.rev {
		v.check()
		v.rev = ev.GetRevision()
	}
	s := ev.GetEndpointSlice()
	if ev.GetType() == allocdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED {
		if v.err == "" {
			v.err = fmt.Sprintf("slice %s deleted at revision %d", s.GetName(), ev.GetRevision())
		}
		delete(v.slices, s.GetName())
		return
	}
	v.slices[s.GetName()] = s
}

// check records a Pod in two slices of one address type.
func (v *sliceView) check() {
	seen := map[string]string{}
	for name, s := range v.slices {
		for _, e := range s.GetEndpoints() {
			k := s.GetAddressType() + "/" + e.GetTargetRef().GetName()
			if other, dup := seen[k]; dup && v.err == "" {
				v.err = fmt.Sprintf("at revision %d %s is in slices %s and %s", v.rev, k, other, name)
			}
			seen[k] = name
		}
	}
}

func (v *sliceView) counts() (ready, notReady int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, s := range v.slices {
		for _, e := range s.GetEndpoints() {
			if e.GetConditions().GetReady() {
				ready++
			} else {
				notReady++
			}
		}
	}
	return ready, notReady
}

func (v *sliceView) failure() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.check()
	return v.err
}
