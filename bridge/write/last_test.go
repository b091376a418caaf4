package write

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// TestForeignDeleteWrittenAgain: an object the bridge wrote, deleted by someone else
// before the bridge synced it again, is created again (the object written last is
// forgotten on the informer's delete), for both kinds.
func TestForeignDeleteWrittenAgain(t *testing.T) {
	c := startAllocd(t)
	feedAllocd(t, c, 10, []*corev1.Service{service("ns", "web", web)},
		[]*corev1.Pod{readyPod("ns", "p1", "10.0.0.1", web)})
	eventuallyListed(t, c, "ns/web")
	eventuallyListedSlices(t, c, "ns/web")
	ctx := context.Background()

	b := startWriter(t, c, endpointsKind(c), service("ns", "web", web))
	eventually(t, "ns/web created", func() bool { _, ok := b.endpoints(t, "ns", "web"); return ok })
	if err := b.kube.CoreV1().Endpoints("ns").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("Delete(ns/web) = %v", err)
	}
	eventually(t, "ns/web created again", func() bool { _, ok := b.endpoints(t, "ns", "web"); return ok })

	bs := startWriter(t, c, slicesKind(c), service("ns", "web", web))
	slices := func() []string {
		l, err := bs.kube.DiscoveryV1().EndpointSlices("ns").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("List(slices) = %v", err)
		}
		var names []string
		for _, s := range l.Items {
			names = append(names, s.Name)
		}
		return names
	}
	eventually(t, "a slice created", func() bool { return len(slices()) == 1 })
	name := slices()[0]
	if err := bs.kube.DiscoveryV1().EndpointSlices("ns").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("Delete(ns/%s) = %v", name, err)
	}
	eventually(t, "the slice created again", func() bool { return len(slices()) == 1 })
}

// TestUpdateNotFoundCreates: a sync whose object written last is gone from the cluster
// (Update answers NotFound) forgets it and creates the object, for both kinds.
func TestUpdateNotFoundCreates(t *testing.T) {
	ctx := context.Background()
	desiredEp := &allocdv1.ServiceEndpoints{Namespace: "ns", Name: "web",
		Labels: map[string]string{LabelManagedBy: EndpointController},
		Subsets: []*allocdv1.ServiceEndpointSubset{{
			Addresses: []*allocdv1.EndpointAddress{{Ip: "10.0.0.2"}},
			Ports:     []*allocdv1.EndpointPort{{Name: "http", Port: 80, Protocol: "TCP"}}}}}
	port, proto := int32(80), "TCP"
	desiredSlice := &allocdv1.EndpointSlice{Namespace: "ns", Name: "web-abc", AddressType: "IPv4",
		Labels: map[string]string{discoveryv1.LabelManagedBy: EndpointSliceController,
			discoveryv1.LabelServiceName: "web"},
		Endpoints: []*allocdv1.SliceEndpoint{{Addresses: []string{"10.0.0.2"}}},
		Ports:     []*allocdv1.EndpointSlicePort{{Port: &port, Protocol: &proto}}}
	for _, tc := range []struct {
		name  string
		sync  func(kube *fake.Clientset) error
		exist func(kube *fake.Clientset) error
	}{
		{"endpoints", func(kube *fake.Clientset) error {
			e := NewEndpoints(nil, kube, informers.NewSharedInformerFactory(kube, 0), nil, false)
			e.last.put("ns/web", managedEndpoints("ns", "web", "10.0.0.1"))
			return e.Sync(ctx, "ns/web", desiredEp)
		}, func(kube *fake.Clientset) error {
			_, err := kube.CoreV1().Endpoints("ns").Get(ctx, "web", metav1.GetOptions{})
			return err
		}},
		{"endpointslices", func(kube *fake.Clientset) error {
			e := NewEndpointSlices(nil, kube, informers.NewSharedInformerFactory(kube, 0), nil, false)
			e.last.put("ns/web-abc", managedSlice("ns", "web-abc", "web", 8080))
			return e.Sync(ctx, "ns/web-abc", desiredSlice)
		}, func(kube *fake.Clientset) error {
			_, err := kube.DiscoveryV1().EndpointSlices("ns").Get(ctx, "web-abc", metav1.GetOptions{})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := fake.NewClientset()
			if err := tc.sync(kube); err != nil {
				t.Fatalf("Sync(object deleted meanwhile) = %v; want it created", err)
			}
			if err := tc.exist(kube); err != nil {
				t.Errorf("Get after Sync = %v; want the object created", err)
			}
		})
	}
}
