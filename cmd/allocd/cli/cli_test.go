package cli

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/cmd/allocd/daemon"
	"github.com/allocd/allocd/internal/loopback"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// allocate allocates for ns/name, as a shim would, and fails the test if it cannot.
func (a *allocd) allocate(ns, name, uid string, ips []string, ports ...int32) {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := a.c.Allocate(ctx,
		&allocdv1.AllocateRequest{Owner: &allocdv1.Owner{Namespace: ns, Name: name, Uid: uid},
			ClusterIps: ips, NodePorts: ports, NoClusterIp: len(ips) == 0})
	if err != nil {
		a.t.Fatalf("Allocate(%s/%s %v %v) = %v", ns, name, ips, ports, err)
	}
	a.note("a shim allocated " + strings.Join(append(ips, portStrings(ports)...), ", ") + " to " + ns + "/" +
		name + " (" + uid + ")")
}

func portStrings(ports []int32) []string {
	var out []string
	for _, p := range ports {
		out = append(out, itemOf(&allocdv1.Allocation{NodePort: p}))
	}
	return out
}

// eventually polls f until it is true, for up to 10 s.
func eventually(t *testing.T, what string, f func(ctx context.Context) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		ok := f(ctx)
		cancel()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 10s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAllocations lists, describes, allocates and releases through the commands what a
// shim allocated through the client: tables (the usage bars), wide, JSON and YAML,
// paged listings, and the errors of a taken address, an address out of range and a
// release of another owner's address.
func TestAllocations(t *testing.T) {
	a := start(t, func(c *daemon.Config) { c.ServiceClusterIPRange = "10.0.0.0/24,fd00:10::/108" })
	a.run("get", "ranges")
	a.allocate("default", "db", "uid-db", []string{"10.0.0.10"}, 30010)
	a.allocate("default", "web", "uid-web", []string{"10.0.0.200", "fd00:10::200"}, 30200, 30201)
	a.run("get", "ranges")
	a.run("get", "ranges", "-o", "wide")
	a.run("get", "allocations")
	a.run("get", "allocations", "-o", "wide")
	a.run("get", "allocations", "--owner", "default/web", "--chunk-size", "1")
	a.run("get", "allocations", "--range", "30000-32767", "--chunk-size", "2", "-o", "json")
	a.run("get", "allocations", "--uid", "uid-db", "-o", "yaml")
	a.run("get", "allocations", "--owner", "default/nobody")
	a.run("describe", "allocation", "10.0.0.10")
	a.run("describe", "allocation", "30200", "-o", "json")
	a.run("describe", "allocation", "10.0.0.99")
	a.run("create", "allocation", "--owner", "default/api", "--uid", "uid-api", "10.0.0.10")
	a.run("create", "allocation", "--owner", "default/api", "--uid", "uid-api", "10.1.0.10")
	a.run("create", "allocation", "--owner", "default/api", "--uid", "uid-api", "10.0.0.30", "30030")
	a.run("create", "allocation", "--owner", "default/api", "--uid", "uid-api", "10.0.0.30", "30030")
	a.run("release", "--owner", "default/api", "10.0.0.10")
	a.run("release", "--owner", "default/api", "--uid", "uid-api", "10.0.0.10")
	a.run("release", "--owner", "default/db", "10.0.0.10", "10.0.0.99")
	a.run("release", "--owner", "default/web")
	a.run("release", "--force", "30030", "-o", "json")
	a.run("release", "--owner", "default/web")
	// A UID that is not --owner's, --owner that --force would not check, and an owner
	// whose name two UIDs carry (deleted and created again): nothing released.
	a.allocate("default", "cache", "uid-cache-1", []string{"10.0.0.40"})
	a.allocate("default", "cache", "uid-cache-2", []string{"10.0.0.41"})
	a.run("release", "--owner", "default/api", "--uid", "uid-db")
	a.run("release", "--owner", "default/db", "--force", "10.0.0.10")
	a.run("release", "--owner", "default/cache")
	a.run("release", "--owner", "default/cache", "--uid", "uid-cache-1")
	a.run("release", "--owner", "default/cache", "--all-uids")
	a.run("get", "allocations", "-o", "json")
	a.golden("allocations")
}

// TestErrors: a full range, a bad CIDR, a name taken, each as one line and as the
// status in JSON; and command lines that cannot run (exit 2).
func TestErrors(t *testing.T) {
	a := start(t, func(c *daemon.Config) { c.ServiceClusterIPRange = "10.96.0.0/29" })
	for _, n := range []string{"2", "3", "4", "5", "6"} {
		a.allocate("default", "s"+n, "uid-s"+n, []string{"10.96.0." + n})
	}
	a.run("get", "ranges")
	a.run("create", "allocation", "--owner", "default/more", "--uid", "uid-more")
	a.run("create", "allocation", "--owner", "default/more", "--uid", "uid-more", "-o", "json")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := a.c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: &allocdv1.Owner{Namespace: "default",
		Name: "more", Uid: "uid-more"}})
	if !errors.Is(err, client.ErrFull) {
		t.Fatalf("Allocate on a full range = %v; want ErrFull", err)
	}
	a.note("a shim's Allocate, as the commands print it: " +
		(&callError{what: "allocate", server: a.d.GRPCAddr(), err: err}).line())
	a.run("create", "servicecidr", "extra", "10.96.1.5/24")
	a.run("create", "servicecidr", "Bad_Name", "not-a-cidr", "10.96.1.0/24")
	a.run("create", "servicecidr", "extra", "10.96.1.0/24", "-o", "yaml")
	a.run("create", "servicecidr", "extra", "10.96.1.0/24")
	a.run("create", "servicecidr", "extra", "10.96.2.0/24", "-o", "json")
	a.run("get")
	a.run("get", "rnages")
	a.run("get", "ranges", "extra")
	a.run("get", "ranges", "-o", "xml")
	a.run("describe", "allocation")
	a.run("release", "--owner", "web")
	a.run("release")
	a.run("create", "allocation", "10.96.0.7")
	a.run("get", "ranges", "--no-such-flag")
	a.golden("errors")
}

// TestServiceCIDRs adds a ServiceCIDR and drains one: delete shows what blocks its
// removal, and once that is released it is gone.
func TestServiceCIDRs(t *testing.T) {
	a := start(t, func(c *daemon.Config) { c.ServiceClusterIPRange = "10.96.0.0/28" })
	a.run("get", "servicecidrs")
	a.run("create", "servicecidr", "extra", "10.96.1.0/24")
	a.allocate("default", "db", "uid-db", []string{"10.96.0.10"})
	a.allocate("default", "web", "uid-web", []string{"10.96.1.10"})
	a.run("get", "servicecidrs")
	a.run("delete", "servicecidr", "kubernetes")
	a.run("get", "servicecidr", "kubernetes", "-o", "wide")
	a.run("get", "ranges")
	a.run("release", "--owner", "default/db")
	a.run("release", "--owner", "default/kubernetes", "10.96.0.1")
	eventually(t, "ServiceCIDR kubernetes removed", func(ctx context.Context) bool {
		_, err := a.c.GetServiceCIDR(ctx, "kubernetes")
		return errors.Is(err, client.ErrNotFound)
	})
	a.note("a second later")
	a.run("get", "servicecidrs")
	a.run("get", "servicecidrs", "-o", "json")
	a.run("delete", "servicecidr", "kubernetes")
	a.golden("servicecidrs")
}

// TestLeasesAndRepair: master leases renewed by shims, listed and removed; repair runs
// over a Service snapshot a shim pushed, and its status counts the leak's strikes.
func TestLeasesAndRepair(t *testing.T) {
	a := start(t, func(c *daemon.Config) { c.ServiceClusterIPRange = "10.0.0.0/24"; c.RepairLeakGrace = 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a.run("get", "leases")
	for _, l := range []struct {
		ip  string
		ttl int64
	}{{"192.168.0.2", 15}, {"192.168.0.1", 30}} {
		if _, err := a.c.Renew(ctx, &allocdv1.RenewRequest{Ip: l.ip, TtlSeconds: l.ttl}); err != nil {
			t.Fatal(err)
		}
	}
	a.note("two API servers renewed their leases")
	a.run("get", "leases")
	a.run("get", "leases", "-o", "wide")
	a.run("delete", "lease", "192.168.0.1")
	a.run("delete", "lease", "192.168.0.1")
	a.run("delete", "lease", "not-an-ip")
	eventually(t, "the kubernetes endpoints follow the leases", func(ctx context.Context) bool {
		ep, err := a.c.GetServiceEndpoints(ctx, "default", "kubernetes")
		return err == nil && endpointsList(ep.GetSubsets(), false, -1) == "192.168.0.2:6443"
	})
	a.run("get", "endpoints", "default/kubernetes")
	a.run("repair", "status")
	a.run("repair", "run")
	a.allocate("default", "gone", "uid-gone", []string{"10.0.0.20"})
	a.allocate("default", "db", "uid-db", []string{"10.0.0.30"}, 30010)
	_, err := a.c.PushServiceSnapshot(ctx,
		&allocdv1.ServiceSnapshot{Revision: 10, Services: []*allocdv1.Service{
			{Namespace: "default", Name: "db", Uid: "uid-db", ClusterIps: []string{"10.0.0.30"},
				NodePorts: []*allocdv1.ServicePort{{Port: 30010, Protocol: "TCP"}}},
			{Namespace: "default", Name: "new", Uid: "uid-new", ClusterIps: []string{"10.0.0.40"}},
			{Namespace: "default", Name: "far", Uid: "uid-far", ClusterIps: []string{"10.9.0.1"}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	a.note("a shim pushed its Services: default/db, default/new (10.0.0.40, not allocated), " +
		"default/far (10.9.0.1)")
	a.run("repair", "run", "--dry-run")
	a.run("repair", "run")
	a.run("repair", "run", "-o", "wide")
	a.run("repair", "status")
	a.run("repair", "status", "-o", "json")
	a.run("repair", "run")
	a.run("describe", "allocation", "10.0.0.20")
	a.golden("leases-repair")
}

// TestUnreachable: an allocd that refuses connections, and one that accepts them and
// never answers, are each one line naming the address, within the timeout.
func TestUnreachable(t *testing.T) {
	refused, err := loopback.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		var held []net.Conn // accepted, never answered
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"get", "ranges", "--server", refused},
			"get ranges: cannot reach allocd at " + refused + ": "},
		{[]string{"delete", "lease", "192.168.0.1", "--server", refused},
			"delete lease 192.168.0.1: cannot reach allocd at " + refused + ": "},
		{[]string{"watch", "endpoints", "--server", refused},
			"watch endpoints: cannot reach allocd at " + refused + ": "},
		{[]string{"get", "ranges", "--server", silent.Addr().String()},
			"get ranges: no answer from allocd at " + silent.Addr().String() + " within 1s"},
		{[]string{"watch", "endpoints", "--server", silent.Addr().String()},
			"watch endpoints: no answer from allocd at " + silent.Addr().String() + " within 1s"},
	} {
		var stderr string
		var code int
		within(t, 3*time.Second, strings.Join(tc.args, " "), func() {
			_, stderr, code = execute(context.Background(), append(tc.args, "--timeout", "1s")...)
		})
		if code != 1 || !strings.HasPrefix(stderr, "error: "+tc.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("allocd %s = %d, %q; want 1 and one line starting %q", strings.Join(tc.args, " "), code,
				stderr, "error: "+tc.want)
		}
	}
	_, stderr, code := execute(context.Background(), "get", "ranges", "--server", refused, "-o", "json")
	if code != 1 || !strings.Contains(stderr, `"code": 14`) ||
		!strings.Contains(stderr, "cannot reach allocd at "+refused) {
		t.Errorf("allocd get ranges -o json against nothing = %d, %q; want 1 and the UNAVAILABLE status as "+
			"JSON, naming the address", code, stderr)
	}
}

// TestDefaultServer: the commands call the address allocd serves on by default.
func TestDefaultServer(t *testing.T) {
	if got := daemon.DefaultConfig().GRPCAddress; got != defaultServer {
		t.Errorf("defaultServer = %q; allocd's default --grpc-address is %q", defaultServer, got)
	}
}
