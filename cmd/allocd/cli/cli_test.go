package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"sigs.k8s.io/yaml"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/cmd/allocd/daemon"
	"github.com/allocd/allocd/internal/loopback"
	"github.com/allocd/allocd/internal/testing/etcdtest"
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

// eventually polls f, each call within 2 s, until it is true, for up to 10 s.
func eventually(t *testing.T, what string, f func(ctx context.Context) bool) {
	t.Helper()
	etcdtest.WaitFor(t, 10*time.Second, what, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return f(ctx)
	})
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

// TestTransfer binds what a provisional owner allocated to a Service's UID, as
// allocd-bridge does: the provisional owners listed by their UID prefix, the refusals of
// what the provisional owner does not hold (nothing moves), a transfer of one item, the
// same again (nothing to move), the rest, and command lines that cannot run.
func TestTransfer(t *testing.T) {
	a := start(t, func(c *daemon.Config) { c.ServiceClusterIPRange = "10.0.0.0/24" })
	a.allocate("default", "web", "admission/7f3a", []string{"10.0.0.20"}, 30020, 30021)
	a.allocate("default", "db", "uid-db", []string{"10.0.0.30"}, 30030)
	a.run("get", "allocations", "--owner-uid-prefix", "admission/")
	to := []string{"transfer", "--from-uid", "admission/7f3a", "--to-owner", "default/web",
		"--to-uid", "uid-web"}
	a.run(append(to, "30020", "30030")...)
	a.run(append(to, "30022")...)
	a.run(append(to, "30020")...)
	a.run(append(to, "30020")...)
	a.run(append(to, "-o", "json")...)
	a.run(to...)
	a.run("get", "allocations", "--owner-uid-prefix", "admission/")
	a.run("get", "allocations", "--uid", "uid-web")
	a.run("transfer", "--from-uid", "uid-web", "--to-owner", "default/web", "--to-uid", "uid-web")
	a.run("transfer", "--from-uid", "uid-web", "--to-owner", "web", "--to-uid", "uid-x")
	a.run("transfer", "--from-uid", "uid-web", "--to-owner", "default/web")
	a.run("get", "allocations", "--uid", "uid-web", "--owner-uid-prefix", "admission/")
	a.golden("transfer")
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
	if testing.Short() {
		t.Skip("waits out --timeout against an allocd that never answers: seconds")
	}
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
		{[]string{"health", "--server", refused}, "health: cannot reach allocd at " + refused + ": "},
		{[]string{"health", "--server", silent.Addr().String()},
			"health: no answer from allocd at " + silent.Addr().String() + " within 1s"},
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

// TestDescribeHolderHas: describe lists up to maxHeldShown of what the holder has,
// then an "and more" line when it has more (allocd answers an owner's listing in one
// page, so there is no page token to tell).
func TestDescribeHolderHas(t *testing.T) {
	a := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, n := range []int{maxHeldShown, maxHeldShown + 1, 3 * maxHeldShown} {
		uid := fmt.Sprintf("uid-%d", n)
		res, err := a.c.Allocate(ctx,
			&allocdv1.AllocateRequest{Owner: &allocdv1.Owner{Namespace: "default", Name: uid, Uid: uid},
				NoClusterIp: true, NodePortCount: int32(n)})
		if err != nil {
			t.Fatalf("Allocate(%d node ports) = %v", n, err)
		}
		out := a.run("describe", "allocation", strconv.Itoa(int(res.GetNodePorts()[0])))
		var has string
		for _, line := range strings.Split(out, "\n") {
			if h, ok := strings.CutPrefix(line, "Holder has:"); ok {
				has = strings.TrimSpace(h)
			}
		}
		items, more := strings.Split(has, ", "), false
		if last := items[len(items)-1]; last == "and more: allocd get allocations --uid "+uid {
			items, more = items[:len(items)-1], true
		}
		if want := n > maxHeldShown; len(items) != min(n, maxHeldShown) || more != want {
			t.Errorf("describe of an owner of %d ports: Holder has %d items, and more: %v; want %d, %v\n%s",
				n, len(items), more, min(n, maxHeldShown), want, out)
		}
	}
}

// compactingWriter is stdout that, at its first write (the first page printed),
// compacts etcd's history past the listing's revision: the next page's token has
// expired, and the listing fails after a page.
type compactingWriter struct {
	t   *testing.T
	cli *clientv3.Client
	buf bytes.Buffer
}

func (w *compactingWriter) Write(p []byte) (int, error) {
	if w.buf.Len() == 0 {
		ctx := etcdtest.Context(w.t)
		resp, err := w.cli.Put(ctx, "/cut-short", "x")
		if err == nil {
			_, err = w.cli.Compact(ctx, resp.Header.Revision)
		}
		if err != nil {
			w.t.Errorf("compact etcd under the listing: %v", err)
		}
	}
	return w.buf.Write(p)
}

// TestListingCutShort: a listing whose later page fails prints, with -o json or yaml,
// one valid document of what it fetched, with the page token of the page that failed,
// and the error on stderr, exit 1; a table keeps its rows. So for every paged listing:
// allocations, Endpoints and EndpointSlices.
func TestListingCutShort(t *testing.T) {
	a := start(t)
	for i := range 3 {
		a.allocate("default", fmt.Sprint("web-", i), fmt.Sprint("uid-", i), nil, int32(30100+i))
	}
	twoNamespaces(t, a) // two Endpoints and two slices
	for _, l := range []struct {
		resource, failure string // failure: in the error said on stderr
		resp              listResponse
	}{
		{"allocations", "page_token", &allocdv1.ListAllocationsResponse{}},
		{"endpoints", "has been compacted", &allocdv1.ListServiceEndpointsResponse{}},
		{"endpointslices", "has been compacted", &allocdv1.ListEndpointSlicesResponse{}},
	} {
		for _, format := range []string{"json", "yaml", "table"} {
			cutShort(t, a, l.resource, l.failure, format, proto.Clone(l.resp).(listResponse))
		}
	}
}

// cutShort runs `allocd get resource --chunk-size 1 -o format` with etcd compacted under
// it after the first page, and checks what TestListingCutShort says; stderr must say
// failure. resp is an empty List response to read the document into.
func cutShort(t *testing.T, a *allocd, resource, failure, format string, resp listResponse) {
	t.Helper()
	out := &compactingWriter{t: t, cli: a.d.Client()}
	var stderr bytes.Buffer
	root := &cobra.Command{Use: "allocd"}
	root.AddCommand(Commands()...)
	code := Execute(context.Background(), root,
		[]string{"get", resource, "--chunk-size", "1", "-o", format}, out, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), failure) {
		t.Errorf("-o %s: get %s cut short = %d, stderr %q; want 1 and the expired page "+
			"token's error (%q)", format, resource, code, stderr.String(), failure)
	}
	doc := out.buf.Bytes()
	switch format {
	case "table":
		if got := strings.Count(out.buf.String(), "\n"); got != 2 {
			t.Errorf("-o table: get %s cut short printed %d lines:\n%s\nwant the header and the first "+
				"page's row", resource, got, doc)
		}
		return
	case "yaml":
		var err error
		if doc, err = yaml.YAMLToJSON(doc); err != nil {
			t.Errorf("-o yaml: get %s cut short is no YAML document: %v\n%s", resource, err, out.buf.String())
			return
		}
	}
	if err := protojson.Unmarshal(doc, resp); err != nil {
		t.Errorf("-o %s: get %s cut short is no %T: %v\n%s", format, resource, resp, err, out.buf.String())
		return
	}
	if n := listedItems(resp); n != 1 || resp.GetNextPageToken() == "" || resp.GetRevision() == 0 {
		t.Errorf("-o %s: get %s cut short = %d items, page token %q, revision %d; want the first page's "+
			"one, its token and revision", format, resource, n, resp.GetNextPageToken(), resp.GetRevision())
	}
}

// listedItems counts the items of a List response: those of its one repeated field.
func listedItems(resp listResponse) int {
	n := 0
	resp.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.IsList() {
			n += v.List().Len()
		}
		return true
	})
	return n
}
