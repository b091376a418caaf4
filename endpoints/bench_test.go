package endpoints

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/testing/etcdtest"

	"github.com/allocd/allocd/endpoints/kube"
	"github.com/allocd/allocd/leader"
)

// scale builds nsCount namespaces of svcPerNS Services, each selecting podsPerSvc Pods
// with one named target port.
func scale(nsCount, svcPerNS, podsPerSvc int) ([]*kube.Service, []*kube.Pod) {
	var svcs []*kube.Service
	var pods []*kube.Pod
	ip := 0
	for n := range nsCount {
		ns := fmt.Sprintf("ns-%d", n)
		for s := range svcPerNS {
			app := fmt.Sprintf("app-%d", s)
			svcs = append(svcs, &kube.Service{
				Namespace: ns, Name: app, UID: ns + "-" + app, Type: kube.TypeClusterIP,
				ClusterIPs: []string{fmt.Sprintf("10.96.%d.%d", ip/250%250, ip%250+1)},
				Labels:     map[string]string{"app": app},
				Selector:   map[string]string{"app": app},
				Ports: []kube.ServicePort{{Name: "http", Port: 80, TargetPort: kube.TargetPort{Name: "http"},
					Protocol: kube.ProtocolTCP}},
			})
			for p := range podsPerSvc {
				ip++
				pods = append(pods, &kube.Pod{
					Namespace: ns, Name: fmt.Sprintf("%s-%d", app, p),
					UID:             fmt.Sprintf("%s-%s-%d", ns, app, p),
					ResourceVersion: "1",
					Labels:          map[string]string{"app": app, "pod-template-hash": "5d8f7c9b4"},
					NodeName:        fmt.Sprintf("node-%d", ip%100),
					PodIPs:          []string{fmt.Sprintf("10.%d.%d.%d", 1+ip/62500, ip/250%250, ip%250+1)},
					Phase:           kube.PhaseRunning, Ready: true,
					Containers: []kube.Container{{Name: "app",
						Ports: []kube.ContainerPort{{Name: "http", ContainerPort: 8080,
							Protocol: kube.ProtocolTCP}}}},
				})
			}
		}
	}
	return svcs, pods
}

// BenchmarkInitialSync: 10,000 Services and 100,000 Pods pushed as snapshots; the time
// from the end of the pushes until every Endpoints object is committed (etcd with
// fsync on), and the heap held per Pod.
func BenchmarkInitialSync(b *testing.B) {
	for range b.N {
		e := etcdtest.New(b, etcdtest.WithFsync())
		c, err := New(e.Client, Config{Prefix: testPrefix, DisableEndpointSlices: true})
		if err != nil {
			b.Fatal(err)
		}
		resp, err := e.Client.Put(b.Context(), testPrefix+"/repair/leader/x", "x")
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan error, 1)
		ctx, cancel := contextWithCancel(b)
		go func() {
			done <- c.Lead(ctx, leader.Fence{Key: testPrefix + "/repair/leader/x", Rev: resp.Header.Revision})
		}()
		etcdtest.WaitFor(b, 10*time.Second, "the term", c.Leading)
		runtime.GC()
		var m0 runtime.MemStats
		runtime.ReadMemStats(&m0)
		// Built after the baseline: the Pods the controller holds count in its heap,
		// as the ones a feed decodes do.
		svcs, pods := scale(100, 100, 10)
		if err := c.ApplyServiceSnapshot(ctx, 1, svcs); err != nil {
			b.Fatal(err)
		}
		if err := c.ApplyPodSnapshot(ctx, 1, pods); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		t, _ := c.currentTerm()
		etcdtest.WaitFor(b, time.Minute, "10,000 Endpoints committed", func() bool {
			if !t.idle() {
				return false
			}
			resp, err := e.Client.Get(ctx, testPrefix+"/endpoints/", withPrefixCount()...)
			if err != nil {
				b.Fatal(err)
			}
			return resp.Count == 10000
		})
		elapsed := time.Since(start)
		runtime.GC()
		var m1 runtime.MemStats
		runtime.ReadMemStats(&m1)
		b.ReportMetric(elapsed.Seconds(), "s-to-commit-all")
		svcs, pods = nil, nil // only the controller's references remain
		runtime.GC()
		runtime.ReadMemStats(&m1)
		b.ReportMetric(float64(int64(m1.HeapAlloc)-int64(m0.HeapAlloc))/100000, "heap-B/pod")
		cancel()
		<-done
		runtime.KeepAlive(c)
	}
}

func contextWithCancel(b *testing.B) (context.Context, context.CancelFunc) {
	return context.WithCancel(b.Context())
}

func withPrefixCount() []clientv3.OpOption {
	return []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCountOnly()}
}
