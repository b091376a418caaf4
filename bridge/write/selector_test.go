package write

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestSelectorRemovedLeftAlone: allocd keeps its last Endpoints and slices of a Service
// whose selector was removed; the bridge neither writes them over the user's Endpoints
// nor creates them again when the user deletes it, nor creates allocd's slices.
func TestSelectorRemovedLeftAlone(t *testing.T) {
	c := startAllocd(t)
	feedAllocd(t, c, 10, []*corev1.Service{service("ns", "web", web)},
		[]*corev1.Pod{readyPod("ns", "p1", "10.0.0.1", web)})
	eventuallyListed(t, c, "ns/web")
	eventuallyListedSlices(t, c, "ns/web")
	mine := managedEndpoints("ns", "web", "192.0.2.1")
	mine.Labels = map[string]string{"owner": "me"}
	selectorless := service("ns", "web", nil)
	ctx := context.Background()

	b := startWriter(t, c, endpointsKind(c), selectorless, mine)
	eventually(t, "a sync of ns/web", func() bool {
		return b.counter(t, "allocd_bridge_syncs_total", map[string]string{"kind": "endpoints"}) >= 1
	})
	b.settled(t)
	if ep, ok := b.endpoints(t, "ns", "web"); !ok || ep.Subsets[0].Addresses[0].IP != "192.0.2.1" ||
		ep.Labels["owner"] != "me" {
		t.Fatalf("Endpoints ns/web = %+v, %v; want the user's, untouched", ep, ok)
	}
	if err := b.kube.CoreV1().Endpoints("ns").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("Delete(ns/web) = %v", err)
	}
	eventually(t, "a sync of ns/web after the delete", func() bool {
		return b.counter(t, "allocd_bridge_syncs_total", map[string]string{"kind": "endpoints"}) >= 2
	})
	b.settled(t)
	if ep, ok := b.endpoints(t, "ns", "web"); ok {
		t.Errorf("Endpoints ns/web = %+v after the user deleted it; want none (not created again)", ep)
	}

	bs := startWriter(t, c, slicesKind(c), selectorless)
	eventually(t, "a sync of ns/web's slice", func() bool {
		return bs.counter(t, "allocd_bridge_syncs_total", map[string]string{"kind": "endpointslices"}) >= 1
	})
	bs.settled(t)
	l, err := bs.kube.DiscoveryV1().EndpointSlices("ns").List(ctx, metav1.ListOptions{})
	if err != nil || len(l.Items) != 0 {
		t.Errorf("List(slices) = %d slices, %v; want none for a Service without selector", len(l.Items), err)
	}
}

// TestSelectorRestoredWrittenAgain: a Service given its selector back has allocd's
// Endpoints written over what the user wrote while it had none, without any change in
// allocd (which kept its object all along), as upstream does on the Service's update.
func TestSelectorRestoredWrittenAgain(t *testing.T) {
	c := startAllocd(t)
	feedAllocd(t, c, 10, []*corev1.Service{service("ns", "web", web)},
		[]*corev1.Pod{readyPod("ns", "p1", "10.0.0.1", web)})
	eventuallyListed(t, c, "ns/web")
	mine := managedEndpoints("ns", "web", "192.0.2.1")
	b := startWriter(t, c, endpointsKind(c), service("ns", "web", nil), mine)
	eventually(t, "a sync of ns/web", func() bool {
		return b.counter(t, "allocd_bridge_syncs_total", map[string]string{"kind": "endpoints"}) >= 1
	})
	b.settled(t)
	if ep, ok := b.endpoints(t, "ns", "web"); !ok || ep.Subsets[0].Addresses[0].IP != "192.0.2.1" {
		t.Fatalf("Endpoints ns/web = %+v, %v; want the user's while the Service has no selector", ep, ok)
	}
	restored := service("ns", "web", web)
	restored.ResourceVersion = "2"
	if _, err := b.kube.CoreV1().Services("ns").Update(context.Background(), restored,
		metav1.UpdateOptions{}); err != nil {
		t.Fatalf("Update(Service ns/web) = %v", err)
	}
	eventually(t, "allocd's Endpoints of ns/web written again", func() bool {
		ep, ok := b.endpoints(t, "ns", "web")
		return ok && len(ep.Subsets) == 1 && len(ep.Subsets[0].Addresses) == 1 &&
			ep.Subsets[0].Addresses[0].IP == "10.0.0.1"
	})
}

// TestExternalNameDeleted: a Service turned ExternalName (its selector kept) loses its
// Endpoints and slices in the cluster: allocd deletes its objects, and the bridge
// deletes the cluster's, where kube-controller-manager leaves them behind
// (kubernetes#105986).
func TestExternalNameDeleted(t *testing.T) {
	c := startAllocd(t)
	pods := []*corev1.Pod{readyPod("ns", "p1", "10.0.0.1", web)}
	feedAllocd(t, c, 10, []*corev1.Service{service("ns", "web", web)}, pods)
	eventuallyListed(t, c, "ns/web")
	eventuallyListedSlices(t, c, "ns/web")
	b := startWriter(t, c, endpointsKind(c), service("ns", "web", web))
	bs := startWriter(t, c, slicesKind(c), service("ns", "web", web))
	ctx := context.Background()
	slices := func() int {
		l, err := bs.kube.DiscoveryV1().EndpointSlices("ns").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("List(slices) = %v", err)
		}
		return len(l.Items)
	}
	eventually(t, "ns/web's Endpoints and slice written", func() bool {
		_, ok := b.endpoints(t, "ns", "web")
		return ok && slices() == 1
	})

	ext := service("ns", "web", web)
	ext.ResourceVersion = "20"
	ext.Spec.Type, ext.Spec.ExternalName = corev1.ServiceTypeExternalName, "web.example.com"
	for _, kube := range []*fake.Clientset{b.kube, bs.kube} {
		if _, err := kube.CoreV1().Services("ns").Update(ctx, ext, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("Update(Service ns/web to ExternalName) = %v", err)
		}
	}
	feedAllocd(t, c, 20, []*corev1.Service{ext}, pods)
	eventually(t, "ns/web's Endpoints and slice deleted", func() bool {
		_, ok := b.endpoints(t, "ns", "web")
		return !ok && slices() == 0
	})
}
