package daemon

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

var (
	churnFor  = flag.Duration("churn", 60*time.Second, "BenchmarkEndpointsFeed: how long Pod events flow")
	churnRate = flag.Int("churn-rate", 1000, "BenchmarkEndpointsFeed: Pod events per second")
)

const (
	benchNamespaces = 100
	benchSvcPerNS   = 100
	benchPodsPerSvc = 10
)

func benchSvcName(s int) (ns, name string) {
	return fmt.Sprintf("ns-%d", s/benchSvcPerNS), fmt.Sprintf("app-%d", s%benchSvcPerNS)
}

func benchPodIP(s, p int) string {
	i := s*benchPodsPerSvc + p + 1
	return fmt.Sprintf("10.%d.%d.%d", 1+i/62500, i/250%250, i%250+1)
}

func benchPod(s, p int, ready bool, rev int64) *allocdv1.Pod {
	ns, app := benchSvcName(s)
	return &allocdv1.Pod{
		Namespace: ns, Name: fmt.Sprintf("%s-%d", app, p), Uid: fmt.Sprintf("%s-%s-%d", ns, app, p),
		ResourceVersion: fmt.Sprint(rev),
		Labels:          map[string]string{"app": app, "pod-template-hash": "5d8f7c9b4"},
		NodeName:        fmt.Sprintf("node-%d", (s*benchPodsPerSvc+p)%100),
		PodIps:          []string{benchPodIP(s, p)}, Phase: "Running", Ready: ready,
		Containers: []*allocdv1.Container{{Name: "app",
			Ports: []*allocdv1.ContainerPort{{Name: "http", ContainerPort: 8080}}}},
	}
}

// BenchmarkEndpointsFeed is the Endpoints controller's numbers, end to end through gRPC
// on one allocd (embedded etcd, fsync on):
//
//   - 10,000 Services and 100,000 Pods pushed as snapshots with the Go client; the time
//     from the end of the pushes until a WatchServiceEndpoints stream has seen every
//     Endpoints object committed (s-to-commit-all);
//   - then -churn-rate Pod events/s for -churn (readiness flips, each changing exactly
//     one Endpoints object), pushed in order by one sender: the latency from an event's
//     acknowledgement (PushEvents returned) to its change on the watch stream (p50-ms,
//     p99-ms; 0 when the change came first), and the Endpoints objects written against
//     the ones that changed (writes, changed), with the etcd transactions that carried
//     them (txns: group commit puts several objects in one).
//
// Run it with make bench, or:
//
//	go test -run '^$' -bench BenchmarkEndpointsFeed -benchtime 1x ./cmd/allocd/daemon/ [-args -churn 60s]
func BenchmarkEndpointsFeed(b *testing.B) {
	for range b.N {
		benchEndpointsFeed(b)
	}
}

func benchEndpointsFeed(b *testing.B) {
	d := StartForTest(b, func(c *Config) {
		c.embeddedEtcdUnsafeNoFsync = false
		c.RepairInterval = time.Hour // no repair pass's writes among the counted ones
	})
	c, err := client.New(d.GRPCAddr())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(b.Context())
	defer cancel()

	nSvc := benchNamespaces * benchSvcPerNS
	svcs := make([]*allocdv1.Service, 0, nSvc)
	pods := make([]*allocdv1.Pod, 0, nSvc*benchPodsPerSvc)
	for s := range nSvc {
		ns, app := benchSvcName(s)
		svcs = append(svcs, &allocdv1.Service{Namespace: ns, Name: app, Uid: ns + "-" + app,
			ClusterIps: []string{fmt.Sprintf("10.96.%d.%d", s/250%250, s%250+1)},
			Labels:     map[string]string{"app": app},
			Selector:   &allocdv1.Selector{MatchLabels: map[string]string{"app": app}},
			Ports: []*allocdv1.ServicePortSpec{{Name: "http", Port: 80,
				TargetPort: &allocdv1.TargetPort{Value: &allocdv1.TargetPort_StrValue{StrValue: "http"}}}}})
		for p := range benchPodsPerSvc {
			pods = append(pods, benchPod(s, p, true, 1))
		}
	}
	startRev := d.etcdRevision(b)

	// One watch over every namespace, from before the pushes: the initial sync's
	// objects, then the churn's changes.
	type change struct {
		svc, ready int
		at         time.Time
	}
	var (
		mu      sync.Mutex
		added   = map[string]bool{}
		allIn   = make(chan time.Time, 1)
		changes = make(chan change, 1<<16)
		index   = make(map[string]int, nSvc)
		// modified counts object writes: each shows once on the watch.
		modified atomic.Int64
	)
	for s := range nSvc {
		ns, app := benchSvcName(s)
		index[ns+"/"+app] = s
	}
	go c.WatchServiceEndpoints(ctx, &allocdv1.WatchServiceEndpointsRequest{StartRevision: startRev},
		func(ev *allocdv1.WatchServiceEndpointsResponse) error {
			now := time.Now()
			ep := ev.GetEndpoints()
			s, ok := index[ep.GetNamespace()+"/"+ep.GetName()]
			if !ok {
				return nil
			}
			switch ev.GetType() {
			case allocdv1.WatchEventType_WATCH_EVENT_TYPE_ADDED:
				mu.Lock()
				added[ep.GetNamespace()+"/"+ep.GetName()] = true
				if len(added) == nSvc {
					allIn <- now
				}
				mu.Unlock()
			case allocdv1.WatchEventType_WATCH_EVENT_TYPE_MODIFIED:
				modified.Add(1)
				ready := 0
				for _, sub := range ep.GetSubsets() {
					ready += len(sub.GetAddresses())
				}
				changes <- change{svc: s, ready: ready, at: now}
			}
			return nil
		})

	pushStart := time.Now()
	if _, err := c.PushServiceSnapshot(ctx,
		&allocdv1.ServiceSnapshot{Revision: 1, Services: svcs}); err != nil {
		b.Fatal(err)
	}
	if _, err := c.PushPodSnapshot(ctx, &allocdv1.PodSnapshot{Revision: 1, Pods: pods}); err != nil {
		b.Fatal(err)
	}
	pushed := time.Now()
	var synced time.Time
	select {
	case synced = <-allIn:
	case <-time.After(5 * time.Minute):
		b.Fatal("the watch did not see every Endpoints object within 5 minutes")
	}
	b.ReportMetric(pushed.Sub(pushStart).Seconds(), "s-to-push")
	b.ReportMetric(max(synced.Sub(pushed), 0).Seconds(), "s-to-commit-all")

	// Churn: event i flips the readiness of Pod (i / nSvc) % 10 of Service i % nSvc, so
	// that one Service has at most one event in flight (the same Service comes back
	// after nSvc events, 10 s at 1,000/s).
	revBefore := d.etcdRevision(b)
	ready := make([][]bool, nSvc)
	for s := range ready {
		ready[s] = slices.Repeat([]bool{true}, benchPodsPerSvc)
	}
	acked := make(map[int]time.Time) // svc → ack time of its pending event
	seen := make(map[int]bool)       // svc → its change came before the ack
	wantReady := make(map[int]int)   // svc → ready count after its pending event
	var lat []time.Duration
	wrong := 0
	collect := func(ch change) {
		want, ok := wantReady[ch.svc]
		if !ok || ch.ready != want {
			if wrong < 5 {
				b.Logf("svc %d: watch shows %d ready, want %d (pending %v)", ch.svc, ch.ready, want, ok)
			}
			wrong++
			return
		}
		delete(wantReady, ch.svc)
		if at, ok := acked[ch.svc]; ok {
			lat = append(lat, max(ch.at.Sub(at), 0))
			delete(acked, ch.svc)
		} else {
			seen[ch.svc] = true
		}
	}
	total := int(churnFor.Seconds() * float64(*churnRate))
	start := time.Now()
	rev := int64(1)
	var applied int64
	for i := 0; i < total; {
		due := min(total, int(time.Since(start).Seconds()*float64(*churnRate))+1)
		if due <= i {
			time.Sleep(time.Millisecond)
			continue
		}
		req := &allocdv1.PushEventsRequest{}
		var batch []int
		for ; i < due; i++ {
			s, p := i%nSvc, (i/nSvc)%benchPodsPerSvc
			ready[s][p] = !ready[s][p]
			rev++
			n := 0
			for _, r := range ready[s] {
				if r {
					n++
				}
			}
			wantReady[s] = n
			req.Events = append(req.Events, &allocdv1.Event{Type: allocdv1.EventType_EVENT_TYPE_UPSERT,
				Object: &allocdv1.Event_Pod{Pod: benchPod(s, p, ready[s][p], rev)}})
			batch = append(batch, s)
		}
		req.Revision = rev
		presp, err := c.PushEvents(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		applied += presp.GetApplied()
		now := time.Now()
		for _, s := range batch {
			if _, ok := seen[s]; ok {
				lat = append(lat, 0)
				delete(seen, s)
			} else {
				acked[s] = now
			}
		}
		for drained := false; !drained; {
			select {
			case ch := <-changes:
				collect(ch)
			default:
				drained = true
			}
		}
	}
	sent := time.Since(start)
	deadline := time.After(30 * time.Second)
	for len(wantReady) > 0 {
		select {
		case ch := <-changes:
			collect(ch)
		case <-deadline:
			for sv, w := range wantReady {
				ns, app := benchSvcName(sv)
				ep, err := c.GetServiceEndpoints(ctx, ns, app)
				b.Logf("%s/%s want %d ready: stored %v %v", ns, app, w, ep, err)
				break
			}
			b.Logf("applied %d of %d", applied, total)
			b.Fatalf("%d Services never showed their last change on the watch (%d wrong)", len(wantReady),
				wrong)
		}
	}
	revAfter := d.etcdRevision(b)
	slices.Sort(lat)
	pct := func(q float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(float64(total)/sent.Seconds(), "events/s")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(total), "changed")
	b.ReportMetric(float64(modified.Load()), "writes")
	// Group commit: one transaction (one etcd revision) carries several objects.
	b.ReportMetric(float64(revAfter-revBefore), "txns")
	if wrong > 0 {
		b.Errorf("%d watch events did not show the state the last event implied", wrong)
	}
}

// etcdRevision is etcd's current revision, read linearizably.
func (d *Daemon) etcdRevision(b *testing.B) int64 {
	b.Helper()
	resp, err := d.cli.Get(b.Context(), "/allocd/none")
	if err != nil {
		b.Fatal(err)
	}
	return resp.Header.Revision
}
