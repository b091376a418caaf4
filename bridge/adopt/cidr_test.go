package adopt

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// clusterCIDR is a ServiceCIDR of the cluster: ready (no condition yet), deleting
// (its deletionTimestamp set), or with its Ready condition false.
func clusterCIDR(name, cidr, state string) networkingv1.ServiceCIDR {
	sc := networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{cidr}}}
	switch state {
	case "deleting":
		now := metav1.Now()
		sc.DeletionTimestamp = &now
	case "not ready":
		sc.Status.Conditions = []metav1.Condition{{Type: networkingv1.ServiceCIDRConditionReady,
			Status: metav1.ConditionFalse}}
	}
	return sc
}

// allocdCIDR is allocd's state of ServiceCIDR name: "ready", "terminating", or "" when
// allocd has none (a terminating one with nothing in it is soon removed).
func allocdCIDR(t *testing.T, c *client.Client, name string) string {
	t.Helper()
	sc, err := c.GetServiceCIDR(context.Background(), name)
	switch {
	case err != nil:
		return ""
	case sc.GetState() == allocdv1.ServiceCIDRState_SERVICE_CIDR_STATE_READY:
		return "ready"
	}
	return "terminating"
}

// TestServiceCIDRsFollowCluster: allocd's ServiceCIDRs follow the cluster's, by name:
// one kube-apiserver allocates from is created, one the cluster is deleting is deleted
// in allocd (so that allocd stops handing out its addresses, which kube-apiserver
// refuses), one whose Ready condition is false is not created; a name allocd has with
// other CIDRs is reported and left, even when the cluster deletes it; what allocd has
// and the cluster lacks is left alone.
func TestServiceCIDRsFollowCluster(t *testing.T) {
	c := startAllocd(t)
	a := New(quiet, c)
	ctx := context.Background()
	for name, cidr := range map[string]string{"extra": "10.97.0.0/28", "clash": "10.98.0.0/28",
		"allocd-only": "10.99.0.0/28"} {
		if _, err := c.CreateServiceCIDR(ctx, name, cidr); err != nil {
			t.Fatal(err)
		}
	}
	res, err := a.ServiceCIDRs(ctx, []networkingv1.ServiceCIDR{
		clusterCIDR("more", "10.100.0.0/28", "ready"),
		clusterCIDR("extra", "10.97.0.0/28", "deleting"),
		clusterCIDR("pending", "10.101.0.0/28", "not ready"),
		clusterCIDR("clash", "10.102.0.0/28", "deleting"),
	})
	if err == nil || !slices.Equal(res.Created, []string{"more"}) ||
		!slices.Equal(res.Deleted, []string{"extra"}) || len(res.Failed) != 0 {
		t.Errorf("ServiceCIDRs() = %+v, %v; want more created, extra deleted, clash reported", res, err)
	}
	for name, want := range map[string]string{"more": "ready", "pending": "", "clash": "ready",
		"allocd-only": "ready"} {
		if got := allocdCIDR(t, c, name); got != want {
			t.Errorf("allocd's ServiceCIDR %s: %q; want %q", name, got, want)
		}
	}
	if got := allocdCIDR(t, c, "extra"); got == "ready" {
		t.Errorf("allocd's ServiceCIDR extra: %q; want terminating or removed", got)
	}
}

// TestControllerFollowsServiceCIDRs: the controller syncs at once when the cluster's
// ServiceCIDRs change (its informer's handler), not at its interval (an hour here): a
// new ServiceCIDR is created in allocd, one the cluster starts deleting is deleted in
// allocd, and so is one that disappears from the cluster without its deletion seen.
func TestControllerFollowsServiceCIDRs(t *testing.T) {
	c := startAllocd(t)
	ctl := NewController(New(quiet, c), quiet, cache.NewStore(cache.MetaNamespaceKeyFunc), 1)
	defer ctl.queue.ShutDown() // never run
	var mu sync.Mutex
	cluster := map[string]networkingv1.ServiceCIDR{}
	list := func(context.Context) ([]networkingv1.ServiceCIDR, error) {
		mu.Lock()
		defer mu.Unlock()
		var out []networkingv1.ServiceCIDR
		for _, sc := range cluster {
			out = append(out, sc)
		}
		return out, nil
	}
	set := func(sc networkingv1.ServiceCIDR) {
		mu.Lock()
		old, had := cluster[sc.Name]
		cluster[sc.Name] = sc
		mu.Unlock()
		if had {
			ctl.ServiceCIDRChanged(&old, &sc)
		} else {
			ctl.ServiceCIDRChanged(nil, &sc)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { ctl.SyncCIDRs(ctx, list, time.Hour) })
	defer func() { cancel(); wg.Wait() }()

	set(clusterCIDR("more", "10.97.0.0/28", "ready"))
	set(clusterCIDR("later", "10.98.0.0/28", "ready"))
	waitFor(t, "more and later created in allocd", func() bool {
		return allocdCIDR(t, c, "more") == "ready" && allocdCIDR(t, c, "later") == "ready"
	})
	set(clusterCIDR("more", "10.97.0.0/28", "deleting"))
	waitFor(t, "more deleted in allocd", func() bool { return allocdCIDR(t, c, "more") != "ready" })
	mu.Lock()
	gone := cluster["later"]
	delete(cluster, "later")
	mu.Unlock()
	ctl.ServiceCIDRChanged(&gone, nil)
	waitFor(t, "later deleted in allocd", func() bool { return allocdCIDR(t, c, "later") != "ready" })
}
