package write

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

var web = map[string]string{"app": "web"}

// TestSweepAfterRestart: a bridge that starts (after a restart) deletes the Endpoints
// allocd deleted while no bridge ran (the Service is gone), and nothing else: not the
// Endpoints of a Service without selector, not one without the endpoint controller's
// label, not allocd's own.
func TestSweepAfterRestart(t *testing.T) {
	c := startAllocd(t)
	feedAllocd(t, c, 10, []*corev1.Service{service("ns", "web", web)},
		[]*corev1.Pod{readyPod("ns", "p1", "10.0.0.1", web)})
	eventuallyListed(t, c, "ns/web")

	foreign := managedEndpoints("ns", "foreign", "10.0.0.9")
	foreign.Labels = nil
	b := startWriter(t, c, endpointsKind(c),
		service("ns", "web", web), service("ns", "manual", nil),
		managedEndpoints("ns", "web", "10.0.0.1"),  // as allocd's: kept, rewritten or not
		managedEndpoints("ns", "gone", "10.0.0.2"), // allocd deleted it: its Service is gone
		managedEndpoints("ns", "manual", "10.0.0.3"),
		foreign)
	eventually(t, "ns/gone deleted", func() bool {
		_, ok := b.endpoints(t, "ns", "gone")
		return !ok
	})
	b.settled(t)
	for _, name := range []string{"web", "manual", "foreign"} {
		if _, ok := b.endpoints(t, "ns", name); !ok {
			t.Errorf("Endpoints ns/%s deleted by the sweep; want it kept", name)
		}
	}
	if got := b.counter(t, "allocd_bridge_sweeps_total", map[string]string{"result": "done"}); got < 1 {
		t.Errorf("allocd_bridge_sweeps_total{result=done} = %v; want at least 1", got)
	}
	if got := b.counter(t, "allocd_bridge_sweeps_total", map[string]string{"result": "held"}); got != 0 {
		t.Errorf("allocd_bridge_sweeps_total{result=held} = %v; want 0", got)
	}
}

// TestSweepHeldWhenAllocdLooksReset: allocd holds nothing (an empty data directory)
// while the cluster has the endpoint controller's Endpoints of a live Service with a
// selector: the bridge deletes nothing, counts the held sweep, and sweeps once allocd
// has caught up.
func TestSweepHeldWhenAllocdLooksReset(t *testing.T) {
	c := startAllocd(t)
	b := startWriter(t, c, endpointsKind(c),
		service("ns", "web", web),
		managedEndpoints("ns", "web", "10.0.0.1"),
		managedEndpoints("ns", "gone", "10.0.0.2"))
	eventually(t, "a held sweep", func() bool {
		return b.counter(t, "allocd_bridge_sweeps_total", map[string]string{"result": "held"}) >= 2
	})
	b.settled(t)
	for _, name := range []string{"web", "gone"} {
		if _, ok := b.endpoints(t, "ns", name); !ok {
			t.Fatalf("Endpoints ns/%s deleted while allocd looked reset; want kept", name)
		}
	}
	// allocd is fed and computes ns/web: the held sweep goes through.
	feedAllocd(t, c, 10, []*corev1.Service{service("ns", "web", web)},
		[]*corev1.Pod{readyPod("ns", "p1", "10.0.0.1", web)})
	eventually(t, "ns/gone deleted once allocd caught up", func() bool {
		_, ok := b.endpoints(t, "ns", "gone")
		return !ok
	})
	if _, ok := b.endpoints(t, "ns", "web"); !ok {
		t.Errorf("Endpoints ns/web deleted; want kept")
	}
}

// TestLeftoversDeletedAtStart: a bridge starts while allocd has not yet computed the
// Endpoints of the cluster's Services (the feed has just given them): its first sweep
// is held, and the Endpoints of a Service gone before it started are deleted as soon
// as allocd has caught up, long before the next periodic sweep (an hour here), as
// kube-controller-manager deletes them at its start; the writer is not ready until
// they are.
func TestLeftoversDeletedAtStart(t *testing.T) {
	c := startAllocd(t)
	b := startWriterEvery(t, c, time.Hour, endpointsKind(c),
		service("ns", "web", web),
		managedEndpoints("ns", "web", "10.0.0.9"),  // kube-controller-manager's, before
		managedEndpoints("ns", "gone", "10.0.0.2")) // its Service is gone
	eventually(t, "the first sweep held", func() bool {
		return b.counter(t, "allocd_bridge_sweeps_total", map[string]string{"result": "held"}) >= 1
	})
	if b.w.Ready() {
		t.Errorf("Ready() = true while the first sweep is held; want false")
	}
	feedAllocd(t, c, 10, []*corev1.Service{service("ns", "web", web)},
		[]*corev1.Pod{readyPod("ns", "p1", "10.0.0.1", web)})
	eventually(t, "ns/gone deleted once allocd caught up", func() bool {
		_, ok := b.endpoints(t, "ns", "gone")
		return !ok
	})
	eventually(t, "the writer ready", b.w.Ready)
	if ep, ok := b.endpoints(t, "ns", "web"); !ok || ep.Subsets[0].Addresses[0].IP != "10.0.0.1" {
		t.Errorf("Endpoints ns/web = %+v, %v; want allocd's (10.0.0.1)", ep, ok)
	}
}

// TestSweepSlices: a slice of a live Service that allocd no longer has (its ports
// changed while no bridge ran) is deleted, as the upstream reconciler deletes the
// slices it does not want; a slice of a Service without selector is kept.
func TestSweepSlices(t *testing.T) {
	c := startAllocd(t)
	feedAllocd(t, c, 10, []*corev1.Service{service("ns", "web", web)},
		[]*corev1.Pod{readyPod("ns", "p1", "10.0.0.1", web)})
	eventuallyListedSlices(t, c, "ns/web")
	b := startWriter(t, c, slicesKind(c),
		service("ns", "web", web), service("ns", "manual", nil),
		managedSlice("ns", "web-old", "web", 8080), managedSlice("ns", "manual-1", "manual", 80))
	eventually(t, "ns/web-old deleted", func() bool {
		_, err := b.kube.DiscoveryV1().EndpointSlices("ns").Get(context.Background(), "web-old",
			metav1.GetOptions{})
		return err != nil
	})
	b.settled(t)
	if _, err := b.kube.DiscoveryV1().EndpointSlices("ns").Get(context.Background(), "manual-1",
		metav1.GetOptions{}); err != nil {
		t.Errorf("Get(ns/manual-1) = %v; want the slice of a Service without selector kept", err)
	}
	l, err := b.kube.DiscoveryV1().EndpointSlices("ns").List(context.Background(), metav1.ListOptions{})
	var names []string
	for _, s := range l.Items {
		names = append(names, s.Name+" of "+s.Labels[discoveryv1.LabelServiceName])
	}
	if err != nil || len(l.Items) != 2 {
		t.Errorf("List(slices) = %v, %v; want allocd's slice of ns/web and ns/manual-1", names, err)
	}
}

func managedSlice(ns, name, svc string, port int32) *discoveryv1.EndpointSlice {
	t := true
	proto := corev1.ProtocolTCP
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("slice-uid-" + name),
			ResourceVersion: "8", Labels: map[string]string{discoveryv1.LabelServiceName: svc,
				discoveryv1.LabelManagedBy: EndpointSliceController},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc,
				UID: types.UID("uid-" + svc), Controller: &t}}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}},
		Ports:       []discoveryv1.EndpointPort{{Port: &port, Protocol: &proto}},
	}
}

// TestSweepPeriodic: a slice with the EndpointSlice controller's label that appears
// after the first listing (kube-controller-manager's, written before its controller
// was turned off) is swept at the next interval.
func TestSweepPeriodic(t *testing.T) {
	c := startAllocd(t)
	feedAllocd(t, c, 10, []*corev1.Service{service("ns", "web", web)},
		[]*corev1.Pod{readyPod("ns", "p1", "10.0.0.1", web)})
	eventuallyListedSlices(t, c, "ns/web")
	b := startWriter(t, c, slicesKind(c), service("ns", "web", web))
	b.settled(t)
	ctx := context.Background()
	old := managedSlice("ns", "web-kcm", "web", 80)
	_, err := b.kube.DiscoveryV1().EndpointSlices("ns").Create(ctx, old, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("Create(ns/web-kcm) = %v", err)
	}
	eventually(t, "ns/web-kcm swept", func() bool {
		_, err := b.kube.DiscoveryV1().EndpointSlices("ns").Get(ctx, "web-kcm", metav1.GetOptions{})
		return err != nil
	})
}

// TestRelistAfterResetDeletesNothing: a running bridge whose allocd comes back reset
// (an empty data directory: its watch breaks, its listing is empty) deletes none of the
// Endpoints it wrote, as a bridge that starts then would not: the keys missing from the
// listing go to the sweep, which holds off.
func TestRelistAfterResetDeletesNothing(t *testing.T) {
	fed := startAllocd(t)
	feedAllocd(t, fed, 10, []*corev1.Service{service("ns", "web", web)},
		[]*corev1.Pod{readyPod("ns", "p1", "10.0.0.1", web)})
	eventuallyListed(t, fed, "ns/web")
	empty := startAllocd(t)
	var k *switchKind
	b := startWriter(t, fed, func(kube *fake.Clientset, f informers.SharedInformerFactory,
		m *Metrics) Kind[*allocdv1.ServiceEndpoints] {
		k = &switchKind{Kind: NewEndpoints(fed, kube, f, m, false), next: NewEndpoints(empty, kube, f, m, false),
			switched: make(chan struct{})}
		return k
	}, service("ns", "web", web))
	eventually(t, "ns/web written", func() bool {
		_, ok := b.endpoints(t, "ns", "web")
		return ok
	})
	close(k.switched) // allocd is reset: the watch breaks, the bridge lists again
	eventually(t, "a held sweep", func() bool {
		return b.counter(t, "allocd_bridge_sweeps_total", map[string]string{"result": "held"}) >= 1
	})
	b.settled(t)
	if _, ok := b.endpoints(t, "ns", "web"); !ok {
		t.Fatal("Endpoints ns/web deleted after allocd came back reset; want kept")
	}
}

// switchKind is a Kind that lists and watches its next Kind's allocd once switched is
// closed, ending the watch then (an allocd replaced by a reset one).
type switchKind struct {
	Kind[*allocdv1.ServiceEndpoints]
	next     Kind[*allocdv1.ServiceEndpoints]
	switched chan struct{}
}

func (k *switchKind) current() Kind[*allocdv1.ServiceEndpoints] {
	select {
	case <-k.switched:
		return k.next
	default:
		return k.Kind
	}
}

func (k *switchKind) List(ctx context.Context) (map[string]*allocdv1.ServiceEndpoints, int64, error) {
	return k.current().List(ctx)
}

func (k *switchKind) Watch(ctx context.Context, rev int64,
	fn func(string, *allocdv1.ServiceEndpoints, int64)) error {
	cur := k.current()
	if cur == k.next {
		return cur.Watch(ctx, rev, fn)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-k.switched:
			cancel()
		case <-wctx.Done():
		}
	}()
	if err := cur.Watch(wctx, rev, fn); ctx.Err() == nil {
		return fmt.Errorf("allocd replaced: %w", err)
	}
	return nil
}

// TestSweepSlicesCreatesFirst: the old slice of a Service (kube-controller-manager's,
// or allocd's before its ports changed) stays while allocd's slice of that Service
// cannot be created, and goes once it is in the cluster: the Service is never left
// without endpoints in between.
func TestSweepSlicesCreatesFirst(t *testing.T) {
	c := startAllocd(t)
	feedAllocd(t, c, 10, []*corev1.Service{service("ns", "web", web)},
		[]*corev1.Pod{readyPod("ns", "p1", "10.0.0.1", web)})
	eventuallyListedSlices(t, c, "ns/web")
	var failing atomic.Bool
	failing.Store(true)
	b := startWriter(t, c, func(kube *fake.Clientset, f informers.SharedInformerFactory,
		m *Metrics) Kind[*allocdv1.EndpointSlice] {
		kube.PrependReactor("create", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
			if failing.Load() {
				return true, nil, errors.New("injected: the API server refuses the create")
			}
			return false, nil, nil
		})
		return NewEndpointSlices(c, kube, f, m, false)
	}, service("ns", "web", web), managedSlice("ns", "web-old", "web", 8080))
	eventually(t, "two sweeps", func() bool {
		return b.counter(t, "allocd_bridge_sweeps_total", map[string]string{"result": "done"}) >= 2
	})
	get := func(name string) error {
		_, err := b.kube.DiscoveryV1().EndpointSlices("ns").Get(context.Background(), name, metav1.GetOptions{})
		return err
	}
	if err := get("web-old"); err != nil {
		t.Fatalf("Get(ns/web-old) = %v while allocd's slice could not be created; want it kept", err)
	}
	failing.Store(false)
	eventually(t, "ns/web-old deleted after allocd's slice was created", func() bool {
		return get("web-old") != nil
	})
	l, err := b.kube.DiscoveryV1().EndpointSlices("ns").List(context.Background(), metav1.ListOptions{})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("List(slices) = %v, %v; want allocd's slice of ns/web", l, err)
	}
}
