package main

import (
	"context"
	"sync"
	"time"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// tracker follows one kind of object on a watch opened before the pushes: per
// Service, the ready endpoints of each of its objects (one Endpoints object, or its
// slices by name). It times the initial sync (every Service showing all its Pods
// ready) and, during the churn, the acknowledgement of each flip to the first watch
// event that shows its Service's new ready count.
type tracker struct {
	name  string
	index map[string]int
	want  int // ready endpoints of a synced Service

	mu      sync.Mutex
	objects []map[string]int // per Service: object name → ready endpoints
	ready   []int            // per Service: the sum
	synced  int              // Services showing want ready endpoints, until allIn
	allIn   time.Time
	allInC  chan struct{}
	err     error // the watch's end, when it ended early

	churning bool
	events   int               // watch events since the churn started
	pending  map[int]int       // Service → ready count its last flip implies
	acked    map[int]time.Time // Service → acknowledgement of that flip
	early    map[int]bool      // Service → the change came before the ack
	lat      []time.Duration   // ack → watch
	stale    int               // changes that showed another count than the pending one
}

func newTracker(name string, index map[string]int, want int) *tracker {
	n := len(index)
	t := &tracker{name: name, index: index, want: want, objects: make([]map[string]int, n),
		ready: make([]int, n), allInC: make(chan struct{}), pending: map[int]int{},
		acked: map[int]time.Time{}, early: map[int]bool{}}
	for i := range t.objects {
		t.objects[i] = map[string]int{}
	}
	return t
}

// observe records one watch event: the object name of Service key now has ready
// endpoints (gone: it was deleted).
func (t *tracker) observe(key, name string, ready int, gone bool, at time.Time) {
	s, ok := t.index[key]
	if !ok {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if gone {
		delete(t.objects[s], name)
	} else {
		t.objects[s][name] = ready
	}
	before := t.ready[s]
	total := 0
	for _, n := range t.objects[s] {
		total += n
	}
	t.ready[s] = total
	if t.allIn.IsZero() {
		switch {
		case before != t.want && total == t.want:
			t.synced++
		case before == t.want && total != t.want:
			t.synced--
		}
		if t.synced == len(t.index) {
			t.allIn = at
			close(t.allInC)
		}
	}
	if !t.churning {
		return
	}
	t.events++
	t.churnEvent(s, total, at)
}

// churnEvent matches a change of Service s to its pending flip. Called with t.mu held.
func (t *tracker) churnEvent(s, total int, at time.Time) {
	want, ok := t.pending[s]
	if !ok || total != want {
		t.stale++
		return
	}
	delete(t.pending, s)
	if ack, ok := t.acked[s]; ok {
		t.lat = append(t.lat, max(at.Sub(ack), 0))
		delete(t.acked, s)
	} else {
		t.early[s] = true
	}
}

// startChurn starts counting events and matching flips.
func (t *tracker) startChurn() {
	t.mu.Lock()
	t.churning = true
	t.mu.Unlock()
}

// expect records that the next flip of Service s leaves ready ready endpoints; called
// before the flip is pushed.
func (t *tracker) expect(s, ready int) {
	t.mu.Lock()
	t.pending[s] = ready
	t.mu.Unlock()
}

// ack records the acknowledgement of the flips of services at at.
func (t *tracker) ack(services []int, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range services {
		if t.early[s] {
			t.lat = append(t.lat, 0)
			delete(t.early, s)
			continue
		}
		if _, ok := t.pending[s]; ok {
			t.acked[s] = at
		}
	}
}

// outstanding returns the flips not yet seen on the watch.
func (t *tracker) outstanding() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending)
}

// watchEndpoints follows the Endpoints objects from rev on t until ctx ends.
func watchEndpoints(ctx context.Context, c *client.Client, rev int64, t *tracker) {
	err := c.WatchServiceEndpoints(ctx, &allocdv1.WatchServiceEndpointsRequest{StartRevision: rev},
		func(ev *allocdv1.WatchServiceEndpointsResponse) error {
			now := time.Now()
			ep := ev.GetEndpoints()
			ready := 0
			for _, sub := range ep.GetSubsets() {
				ready += len(sub.GetAddresses())
			}
			t.observe(ep.GetNamespace()+"/"+ep.GetName(), "", ready,
				ev.GetType() == allocdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED, now)
			return nil
		})
	t.end(ctx, err)
}

// watchSlices follows the EndpointSlices from rev on t until ctx ends.
func watchSlices(ctx context.Context, c *client.Client, rev int64, t *tracker) {
	err := c.WatchEndpointSlices(ctx, &allocdv1.WatchEndpointSlicesRequest{StartRevision: rev},
		func(ev *allocdv1.WatchEndpointSlicesResponse) error {
			now := time.Now()
			s := ev.GetEndpointSlice()
			ready := 0
			for _, e := range s.GetEndpoints() {
				if e.GetConditions().GetReady() {
					ready++
				}
			}
			key := s.GetNamespace() + "/" + s.GetLabels()["kubernetes.io/service-name"]
			t.observe(key, s.GetName(), ready,
				ev.GetType() == allocdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED, now)
			return nil
		})
	t.end(ctx, err)
}

// end records why the watch ended, unless ctx ended it.
func (t *tracker) end(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	t.mu.Lock()
	t.err = err
	t.mu.Unlock()
}
