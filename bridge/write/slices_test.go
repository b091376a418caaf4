package write

import (
	"context"
	"errors"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// desiredWebSlice is allocd's slice ns/web-abc of Service web (uid-web): 10.0.0.2:80.
func desiredWebSlice() *allocdv1.EndpointSlice {
	port, proto, ready := int32(80), "TCP", true
	return &allocdv1.EndpointSlice{Namespace: "ns", Name: "web-abc", AddressType: "IPv4",
		ServiceUid: "uid-web", Labels: map[string]string{discoveryv1.LabelManagedBy: EndpointSliceController,
			discoveryv1.LabelServiceName: "web"},
		Endpoints: []*allocdv1.SliceEndpoint{{Addresses: []string{"10.0.0.2"},
			Conditions: &allocdv1.EndpointConditions{Ready: &ready}}},
		Ports: []*allocdv1.EndpointSlicePort{{Port: &port, Protocol: &proto}}}
}

// syncSlice syncs desired over the cluster's slice cur (as the informer would have it).
func syncSlice(t *testing.T, cur *discoveryv1.EndpointSlice) (*fake.Clientset, error) {
	t.Helper()
	kube := fake.NewClientset(cur)
	e := NewEndpointSlices(nil, kube, informers.NewSharedInformerFactory(kube, 0), nil, false)
	e.last.put("ns/web-abc", cur)
	return kube, e.Sync(context.Background(), "ns/web-abc", desiredWebSlice())
}

// TestSliceUpdateKeepsOthersOwners: an update of a slice keeps the owner references
// others set, and replaces only the controller reference to the Service.
func TestSliceUpdateKeepsOthersOwners(t *testing.T) {
	cur := managedSlice("ns", "web-abc", "web", 8080) // controller: uid-web
	cur.OwnerReferences = append(cur.OwnerReferences,
		metav1.OwnerReference{APIVersion: "example.com/v1", Kind: "Tracker", Name: "t", UID: "uid-tracker"})
	kube, err := syncSlice(t, cur)
	if err != nil {
		t.Fatalf("Sync = %v", err)
	}
	got, err := kube.DiscoveryV1().EndpointSlices("ns").Get(context.Background(), "web-abc",
		metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Get = %v", err)
	}
	var uids []string
	for _, r := range got.OwnerReferences {
		uids = append(uids, string(r.UID))
	}
	if len(uids) != 2 || uids[0] != "uid-web" || uids[1] != "uid-tracker" {
		t.Errorf("owner references after the update = %v; want [uid-web uid-tracker]", uids)
	}
	if p := got.Ports[0].Port; p == nil || *p != 80 {
		t.Errorf("port after the update = %v; want 80 (the update written)", p)
	}
}

// TestSliceNotManagedLeftAlone: a slice of the name allocd gives that is not labelled
// as the EndpointSlice controller's is not written over.
func TestSliceNotManagedLeftAlone(t *testing.T) {
	cur := managedSlice("ns", "web-abc", "web", 8080)
	delete(cur.Labels, discoveryv1.LabelManagedBy)
	kube, err := syncSlice(t, cur)
	if !errors.Is(err, errNotManaged) {
		t.Errorf("Sync(a slice not managed) = %v; want errNotManaged", err)
	}
	got, err := kube.DiscoveryV1().EndpointSlices("ns").Get(context.Background(), "web-abc",
		metav1.GetOptions{})
	if err != nil || *got.Ports[0].Port != 8080 {
		t.Errorf("slice after Sync = %v, %v; want it untouched (port 8080)", got, err)
	}
}
