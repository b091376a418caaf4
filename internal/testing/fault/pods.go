package fault

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// pods is a shim's informer caches for one headless Service selecting 20 Pods, as a
// client.Lister, whose Pods flip readiness every 100 ms while a client.Feeder pushes
// them to allocd through any replica.
type pods struct {
	mu   sync.Mutex
	rev  int64
	pods map[string]*allocdv1.Pod
	sent atomic.Int64
	// errs are the Feeder's errors, with when they came (the last 20).
	errs []string
	h    *history
}

var webService = &allocdv1.Service{Namespace: "shop", Name: "web", Uid: "uid-web",
	ClusterIps: []string{"None"},
	Selector:   &allocdv1.Selector{MatchLabels: map[string]string{"app": "web"}},
	Ports: []*allocdv1.ServicePortSpec{{Name: "http", Port: 80,
		TargetPort: &allocdv1.TargetPort{Value: &allocdv1.TargetPort_IntValue{IntValue: 8080}}}}}

func newPods() *pods {
	p := &pods{rev: 1, pods: map[string]*allocdv1.Pod{}}
	for i := range 20 {
		p.pods[fmt.Sprintf("web-%d", i)] = webPod(i, true, 1)
	}
	return p
}

func webPod(i int, ready bool, rev int64) *allocdv1.Pod {
	return &allocdv1.Pod{Namespace: "shop", Name: fmt.Sprintf("web-%d", i), Uid: fmt.Sprintf("uid-web-%d", i),
		ResourceVersion: fmt.Sprint(rev), Labels: map[string]string{"app": "web"},
		PodIps: []string{fmt.Sprintf("10.244.0.%d", i+1)}, Phase: "Running", Ready: ready, NodeName: "node-a"}
}

func (p *pods) ListServices() ([]*allocdv1.Service, int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return []*allocdv1.Service{webService}, p.rev, nil
}

func (p *pods) ListPods() ([]*allocdv1.Pod, int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*allocdv1.Pod, 0, len(p.pods))
	for _, v := range p.pods {
		out = append(out, v)
	}
	return out, p.rev, nil
}

// ListNodes lists the one Node the Pods run on.
func (p *pods) ListNodes() ([]*allocdv1.Node, int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return []*allocdv1.Node{{Name: "node-a", Ready: true,
		Labels: map[string]string{"topology.kubernetes.io/zone": "zone-a"}}}, p.rev, nil
}

// run flips Pods until events ends, feeds them until ctx ends, and counts the DELETED
// events of shop/web on a watch from another replica (there must be none: the Service
// never goes away).
func (p *pods) run(events, ctx context.Context, feed, watch *client.Client, deleted *atomic.Int64) {
	f := client.NewFeeder(feed, p, client.WithHeartbeat(200*time.Millisecond),
		client.WithPushTimeout(5*time.Second),
		client.WithFeedErrors(func(err error) {
			p.mu.Lock()
			defer p.mu.Unlock()
			if len(p.errs) == 20 {
				p.errs = p.errs[1:]
			}
			p.errs = append(p.errs, fmt.Sprintf("%v: %v", p.h.now().Round(time.Millisecond), err))
		}))
	go f.Run(ctx)
	go func() {
		for ctx.Err() == nil {
			watch.WatchServiceEndpoints(ctx, &allocdv1.WatchServiceEndpointsRequest{Namespace: "shop"},
				func(ev *allocdv1.WatchServiceEndpointsResponse) error {
					if ev.GetType() == allocdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED {
						deleted.Add(1)
					}
					return nil
				})
			time.Sleep(100 * time.Millisecond)
		}
	}()
	r := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	for events.Err() == nil {
		i := r.IntN(20)
		p.mu.Lock()
		p.rev++
		old := p.pods[fmt.Sprintf("web-%d", i)]
		pod := webPod(i, !old.GetReady(), p.rev)
		p.pods[pod.Name] = pod
		rev := p.rev
		p.mu.Unlock()
		f.UpsertPod(pod, rev)
		p.sent.Add(1)
		time.Sleep(100 * time.Millisecond)
	}
}

// want is the ready and not-ready addresses the Endpoints must end with.
func (p *pods) want() (ready, notReady []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, v := range p.pods {
		if v.GetReady() {
			ready = append(ready, v.GetPodIps()[0])
		} else {
			notReady = append(notReady, v.GetPodIps()[0])
		}
	}
	slices.Sort(ready)
	slices.Sort(notReady)
	return ready, notReady
}

// converged reports whether shop/web's stored Endpoints show the last Pod states.
func (p *pods) converged(ctx context.Context, c *client.Client) bool {
	ep, err := c.GetServiceEndpoints(ctx, "shop", "web")
	if err != nil {
		return false
	}
	var ready, notReady []string
	for _, s := range ep.GetSubsets() {
		for _, a := range s.GetAddresses() {
			ready = append(ready, a.GetIp())
		}
		for _, a := range s.GetNotReadyAddresses() {
			notReady = append(notReady, a.GetIp())
		}
	}
	slices.Sort(ready)
	slices.Sort(notReady)
	wr, wn := p.want()
	return slices.Equal(ready, wr) && slices.Equal(notReady, wn)
}
