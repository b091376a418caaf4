package write

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/allocd/allocd/bridge/feed"
	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/cmd/allocd/daemon"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// startAllocd starts a real allocd (embedded etcd, gRPC on loopback) and returns a
// client of it.
func startAllocd(t *testing.T) *client.Client {
	t.Helper()
	d := daemon.StartForTest(t, func(c *daemon.Config) { c.ServiceClusterIPRange = "10.96.0.0/24" })
	c, err := client.New(d.GRPCAddr())
	if err != nil {
		t.Fatalf("client.New(%q) = %v", d.GRPCAddr(), err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// feedAllocd pushes snapshots of svcs and pods at rev, as the bridge's feed does.
func feedAllocd(t *testing.T, c *client.Client, rev int64, svcs []*corev1.Service, pods []*corev1.Pod) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ss := &allocdv1.ServiceSnapshot{Revision: rev}
	for _, s := range svcs {
		ss.Services = append(ss.Services, feed.Service(s))
	}
	ps := &allocdv1.PodSnapshot{Revision: rev}
	for _, p := range pods {
		ps.Pods = append(ps.Pods, feed.Pod(p))
	}
	if _, err := c.PushServiceSnapshot(ctx, ss); err != nil {
		t.Fatalf("PushServiceSnapshot = %v", err)
	}
	if _, err := c.PushPodSnapshot(ctx, ps); err != nil {
		t.Fatalf("PushPodSnapshot = %v", err)
	}
	if _, err := c.PushNodeSnapshot(ctx, &allocdv1.NodeSnapshot{Revision: rev}); err != nil {
		t.Fatalf("PushNodeSnapshot = %v", err)
	}
}

func service(ns, name string, selector map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name),
			ResourceVersion:   "5",
			CreationTimestamp: metav1.Now()},
		Spec: corev1.ServiceSpec{Selector: selector, Type: corev1.ServiceTypeClusterIP,
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:      []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
}

func readyPod(ns, name, ip string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name),
			ResourceVersion: "6",
			Labels:          labels},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

// managedEndpoints is an Endpoints as the endpoint controller labels it.
func managedEndpoints(ns, name, ip string) *corev1.Endpoints {
	return &corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("ep-uid-" + name),
			ResourceVersion: "7",
			Labels:          map[string]string{LabelManagedBy: EndpointController}},
		Subsets: []corev1.EndpointSubset{{Addresses: []corev1.EndpointAddress{{IP: ip}},
			Ports: []corev1.EndpointPort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}},
	}
}

// bridgeWriter is a Writer of one kind over a fake cluster, running until the test ends.
type bridgeWriter struct {
	kube *fake.Clientset
	w    interface {
		Synced() bool
		Ready() bool
		Len() int
	}
	reg *prometheus.Registry
}

// newKindFunc makes the Kind a test's Writer writes.
type newKindFunc[A Object] func(*fake.Clientset, informers.SharedInformerFactory, *Metrics) Kind[A]

// startWriter starts a Writer of the kind newKind makes over allocd c and a fake cluster
// holding objs, sweeping every 50 ms.
func startWriter[A Object](t *testing.T, c *client.Client, newKind newKindFunc[A],
	objs ...runtime.Object) *bridgeWriter {
	t.Helper()
	return startWriterEvery(t, c, 50*time.Millisecond, newKind, objs...)
}

// startWriterEvery is startWriter with a SweepInterval of sweep.
func startWriterEvery[A Object](t *testing.T, c *client.Client, sweep time.Duration, newKind newKindFunc[A],
	objs ...runtime.Object) *bridgeWriter {
	t.Helper()
	kube := fake.NewClientset(objs...)
	f := informers.NewSharedInformerFactory(kube, 0)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	w := New(slog.New(slog.NewTextHandler(io.Discard, nil)), newKind(kube, f, m), 2, m)
	w.SweepInterval = sweep
	if err := w.Register(); err != nil {
		t.Fatalf("Register = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	var wg sync.WaitGroup
	wg.Go(func() { _ = w.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		f.Shutdown()
	})
	return &bridgeWriter{kube: kube, w: w, reg: reg}
}

func endpointsKind(c *client.Client) newKindFunc[*allocdv1.ServiceEndpoints] {
	return func(kube *fake.Clientset, f informers.SharedInformerFactory,
		m *Metrics) Kind[*allocdv1.ServiceEndpoints] {
		return NewEndpoints(c, kube, f, m, false)
	}
}

func slicesKind(c *client.Client) newKindFunc[*allocdv1.EndpointSlice] {
	return func(kube *fake.Clientset, f informers.SharedInformerFactory,
		m *Metrics) Kind[*allocdv1.EndpointSlice] {
		return NewEndpointSlices(c, kube, f, m, false)
	}
}

// eventually polls cond every 20 ms for up to 20 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// settled waits until the writer listed allocd and has nothing queued, twice in a row
// 100 ms apart.
func (b *bridgeWriter) settled(t *testing.T) {
	t.Helper()
	quiet := 0
	eventually(t, "the writer to settle", func() bool {
		if b.w.Synced() && b.w.Len() == 0 {
			quiet++
		} else {
			quiet = 0
		}
		if quiet < 5 {
			time.Sleep(20 * time.Millisecond)
			return false
		}
		return true
	})
}

// counter returns the value of the counter name with labels, 0 when absent.
func (b *bridgeWriter) counter(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := b.reg.Gather()
	if err != nil {
		t.Fatalf("Gather = %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func (b *bridgeWriter) endpoints(t *testing.T, ns, name string) (*corev1.Endpoints, bool) {
	t.Helper()
	ep, err := b.kube.CoreV1().Endpoints(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil, false
	}
	return ep, true
}

// eventuallyListed waits until allocd holds the Endpoints of key.
func eventuallyListed(t *testing.T, c *client.Client, key string) {
	t.Helper()
	eventually(t, "allocd's Endpoints "+key, func() bool {
		objs, _, err := (&Endpoints{c: c}).List(context.Background())
		return err == nil && objs[key] != nil
	})
}

// eventuallyListedSlices waits until allocd holds a slice of the Service key.
func eventuallyListedSlices(t *testing.T, c *client.Client, key string) {
	t.Helper()
	eventually(t, "allocd's slices of "+key, func() bool {
		objs, _, err := (&EndpointSlices{c: c, kubernetes: true}).List(context.Background())
		for _, s := range objs {
			if s.GetNamespace()+"/"+s.GetLabels()["kubernetes.io/service-name"] == key {
				return err == nil
			}
		}
		return false
	})
}
