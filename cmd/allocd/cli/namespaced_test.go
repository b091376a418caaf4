package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// TestAllNamespaces: -A/--all-namespaces, kubectl's, lists and watches the Endpoints
// and EndpointSlices of every namespace, as no -n does; -n beside it is ignored, as
// kubectl ignores it; with a name or --service it is a usage error (exit 2), as a name
// with -A is in kubectl.
func TestAllNamespaces(t *testing.T) {
	a := start(t)
	twoNamespaces(t, a)
	a.note("an API server renewed its master lease; a shim pushed shop/web and its Pod web-1")
	for _, resource := range []string{"endpoints", "endpointslices"} {
		all := a.run("get", resource, "-A")
		if every := a.run("get", resource); all != every || strings.Count(all, "\n") != 3 {
			t.Errorf("get %s -A printed\n%s\nget %s printed\n%s\nwant both namespaces' two, the same",
				resource, all, resource, every)
		}
		a.run("get", resource, "--all-namespaces", "-o", "wide")
	}
	a.run("get", "endpoints", "-n", "shop")
	for _, resource := range []string{"endpoints", "endpointslices"} {
		got, want := a.run("get", resource, "-A", "-n", "shop"), a.run("get", resource, "-A")
		if got != want {
			t.Errorf("get %s -A -n shop printed\n%s\nwant -n ignored, as get %s -A:\n%s",
				resource, got, resource, want)
		}
	}
	a.run("get", "endpoints", "shop/web", "-A")
	a.run("get", "endpointslices", "-A", "--service", "web")

	out, stop := watch(t, "-A")
	got := []string{next(t, out, "the start"), next(t, out, "the header"), next(t, out, "the first")}
	if code, stderr := stop(); code != 0 || stderr != "" {
		t.Errorf("watch endpoints -A interrupted = %d, %q; want 0 and nothing on stderr", code, stderr)
	}
	a.record([]string{"watch", "endpoints", "-A"}, strings.Join(got, "\n")+"\n", 0)
	a.golden("namespaces")
}

// twoNamespaces has the Endpoints and EndpointSlices of two namespaces made: an API
// server renews its master lease (default/kubernetes), a shim pushes shop/web and its
// Pod web-1.
func twoNamespaces(t *testing.T, a *allocd) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := a.c.Renew(ctx, &allocdv1.RenewRequest{Ip: "192.168.0.1", TtlSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	pushSlicesFeed(t, a.c, 1, webPod("web-1", "10.244.1.5", "1", true))
	eventually(t, "the Endpoints and slices of default/kubernetes and shop/web",
		func(ctx context.Context) bool {
			eps, err := a.c.ListServiceEndpoints(ctx, &allocdv1.ListServiceEndpointsRequest{})
			if err != nil || len(eps.GetEndpoints()) != 2 {
				return false
			}
			sl, err := a.c.ListEndpointSlices(ctx, &allocdv1.ListEndpointSlicesRequest{})
			return err == nil && len(sl.GetEndpointSlices()) == 2
		})
}
