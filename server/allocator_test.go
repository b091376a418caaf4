package server_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/allocd/allocd/allocator"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
	"github.com/allocd/allocd/server"
)

// startAllocatorServer serves an AllocatorService over a running Allocator of the
// given ranges on a loopback port; everything stops by t.Cleanup.
func startAllocatorServer(t *testing.T, e *etcdtest.Server,
	ranges ...string) allocdv1.AllocatorServiceClient {
	t.Helper()
	cfg := allocator.Config{Prefix: "/allocd", NodePortRange: allocator.DefaultNodePortRange}
	for _, r := range ranges {
		cfg.ClusterIPRanges = append(cfg.ClusterIPRanges, netip.MustParsePrefix(r))
	}
	a, err := allocator.New(context.Background(), e.Client, cfg)
	if err != nil {
		t.Fatalf("allocator.New() = %v", err)
	}
	conn := serve(t, a.Run, func(gs *grpc.Server) {
		allocdv1.RegisterAllocatorServiceServer(gs, server.NewAllocatorService(a, nil))
	})
	return allocdv1.NewAllocatorServiceClient(conn)
}

// detail returns err's first status detail of type T.
func detail[T proto.Message](err error) (T, bool) {
	for _, d := range status.Convert(err).Details() {
		if v, ok := d.(T); ok {
			return v, true
		}
	}
	var zero T
	return zero, false
}

func own(uid string) *allocdv1.Owner {
	return &allocdv1.Owner{Namespace: "default", Name: "svc-" + uid, Uid: uid}
}

func TestAllocatorServiceAcceptance(t *testing.T) {
	e := etcdtest.New(t)
	c := startAllocatorServer(t, e, "10.0.0.0/24", "fd00::/120")
	ctx := etcdtest.Context(t)

	// Require dual stack: one IPv4 and one IPv6 address, both from the upper band, and
	// the same answer on retry.
	req := &allocdv1.AllocateRequest{Owner: own("web"),
		IpFamilyPolicy: allocdv1.IPFamilyPolicy_IP_FAMILY_POLICY_REQUIRE_DUAL_STACK}
	res, err := c.Allocate(ctx, req)
	if err != nil || len(res.GetClusterIps()) != 2 || res.GetRevision() == 0 || res.GetReplayed() {
		t.Fatalf("Allocate(require dual stack) = %v, %v; want two addresses", res, err)
	}
	v4, v6 := netip.MustParseAddr(res.ClusterIps[0]), netip.MustParseAddr(res.ClusterIps[1])
	if !v4.Is4() || !v6.Is6() {
		t.Errorf("Allocate(require dual stack) = %v; want IPv4 then IPv6", res.ClusterIps)
	}
	for _, ip := range res.ClusterIps {
		got, err := c.GetAllocation(ctx,
			&allocdv1.GetAllocationRequest{Target: &allocdv1.GetAllocationRequest_ClusterIp{ClusterIp: ip}})
		a := got.GetAllocation()
		if err != nil || a.GetStaticBand() || a.GetOwner().GetUid() != "web" ||
			a.GetCreateRevision() != res.Revision || a.GetAllocateTime() == nil {
			t.Errorf("GetAllocation(%s) = %v, %v; want held by web in the dynamic band since %d", ip, got,
				err, res.Revision)
		}
	}
	again, err := c.Allocate(ctx, req)
	if err != nil || !again.GetReplayed() || !slices.Equal(again.GetClusterIps(), res.ClusterIps) {
		t.Errorf("retried Allocate = %v, %v; want %v replayed", again, err, res.ClusterIps)
	}

	// A specific address held by another owner: ALREADY_EXISTS naming the holder.
	_, err = c.Allocate(ctx,
		&allocdv1.AllocateRequest{Owner: own("other"), ClusterIps: []string{res.ClusterIps[0]}})
	ri, ok := detail[*errdetails.ResourceInfo](err)
	if status.Code(err) != codes.AlreadyExists || !ok || ri.GetOwner() != "default/svc-web web" ||
		ri.GetResourceName() != res.ClusterIps[0] {
		t.Errorf("Allocate(held %s) = %v (ResourceInfo %v); want ALREADY_EXISTS naming default/svc-web web",
			res.ClusterIps[0], err, ri)
	}
	// The kubernetes address is held from the start.
	_, err = c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: own("other"), ClusterIps: []string{"10.0.0.1"}})
	if ri, _ := detail[*errdetails.ResourceInfo](err); status.Code(err) != codes.AlreadyExists ||
		ri.GetOwner() != "default/kubernetes default/kubernetes" {
		t.Errorf("Allocate(10.0.0.1) = %v; want ALREADY_EXISTS held by default/kubernetes", err)
	}

	// Release by a non-owner: FAILED_PRECONDITION; by the owner: OK, twice.
	_, err = c.Release(ctx,
		&allocdv1.ReleaseRequest{Owner: own("other"), ClusterIps: []string{res.ClusterIps[0]}})
	if ei, ok := detail[*errdetails.ErrorInfo](err); status.Code(err) != codes.FailedPrecondition || !ok ||
		ei.GetReason() != "NOT_OWNER" || ei.GetMetadata()["holder_uid"] != "web" {
		t.Errorf("Release by a non-owner = %v; want FAILED_PRECONDITION with ErrorInfo NOT_OWNER", err)
	}
	for i := range 2 {
		rel, err := c.Release(ctx,
			&allocdv1.ReleaseRequest{Owner: own("web"), ClusterIps: []string{res.ClusterIps[0]}})
		if err != nil || (i == 0) != (len(rel.GetReleasedClusterIps()) == 1) {
			t.Errorf("Release by the owner #%d = %v, %v; want OK (freed the first time)", i+1, rel, err)
		}
	}
	_, err = c.GetAllocation(ctx, &allocdv1.GetAllocationRequest{
		Target: &allocdv1.GetAllocationRequest_ClusterIp{ClusterIp: res.ClusterIps[0]}})
	if status.Code(err) != codes.NotFound {
		t.Errorf("GetAllocation(released) = %v; want NOT_FOUND", err)
	}
	// Force frees another's.
	if rel, err := c.Release(ctx, &allocdv1.ReleaseRequest{ClusterIps: []string{res.ClusterIps[1]},
		Force: true}); err != nil || len(rel.GetReleasedClusterIps()) != 1 {
		t.Errorf("Release(force) = %v, %v; want it freed", rel, err)
	}

	// ListRanges: two ClusterIP ranges then the ports, with their bands.
	lr, err := c.ListRanges(ctx, &allocdv1.ListRangesRequest{})
	if err != nil || len(lr.GetRanges()) != 3 {
		t.Fatalf("ListRanges() = %v, %v", lr, err)
	}
	r0, r2 := lr.Ranges[0], lr.Ranges[2]
	if r0.GetName() != "10.0.0.0/24" || !r0.GetPrimary() || r0.GetSize() != 254 ||
		r0.GetFamily() != allocdv1.IPFamily_IP_FAMILY_IPV4 ||
		r0.GetStaticBand().GetLast() != "10.0.0.16" || r0.GetDynamicBand().GetFirst() != "10.0.0.17" ||
		r2.GetName() != "30000-32767" || r2.GetKind() != allocdv1.RangeKind_RANGE_KIND_NODE_PORT ||
		r2.GetStaticBand().GetSize() != 86 {
		t.Errorf("ListRanges() = %v", lr)
	}
}

func TestAllocatorServiceErrors(t *testing.T) {
	e := etcdtest.New(t)
	c := startAllocatorServer(t, e, "10.0.0.0/29")
	ctx := etcdtest.Context(t)
	tests := []struct {
		name   string
		req    *allocdv1.AllocateRequest
		code   codes.Code
		fields []string // BadRequest fields, when INVALID_ARGUMENT
	}{
		{"no owner", &allocdv1.AllocateRequest{}, codes.InvalidArgument, []string{"owner"}},
		{"no uid", &allocdv1.AllocateRequest{Owner: &allocdv1.Owner{Name: "x"}}, codes.InvalidArgument,
			[]string{"owner.uid"}},
		{"uid with an empty segment", &allocdv1.AllocateRequest{Owner: &allocdv1.Owner{Name: "x",
			Uid: "a//b"}}, codes.InvalidArgument, []string{"owner.uid"}},
		{"bad ip", &allocdv1.AllocateRequest{Owner: own("a"), ClusterIps: []string{"10.0.0.300"}},
			codes.InvalidArgument, []string{"cluster_ips[0]"}},
		{"mapped ip", &allocdv1.AllocateRequest{Owner: own("a"), ClusterIps: []string{"::ffff:10.0.0.2"}},
			codes.InvalidArgument, []string{"cluster_ips[0]"}},
		{"bad port", &allocdv1.AllocateRequest{Owner: own("a"), NodePorts: []int32{30001, 70000}},
			codes.InvalidArgument, []string{"node_ports[1]"}},
		{"bad family", &allocdv1.AllocateRequest{Owner: own("a"), IpFamilies: []allocdv1.IPFamily{0}},
			codes.InvalidArgument, []string{"ip_families[0]"}},
		{"bad policy", &allocdv1.AllocateRequest{Owner: own("a"), IpFamilyPolicy: 9}, codes.InvalidArgument,
			[]string{"ip_family_policy"}},
		{"negative count", &allocdv1.AllocateRequest{Owner: own("a"), NodePortCount: -1},
			codes.InvalidArgument, []string{"node_port_count"}},
		{"too many", &allocdv1.AllocateRequest{Owner: own("a"), NodePortCount: allocator.MaxItems + 1},
			codes.InvalidArgument, []string{"node_port_count"}},
		{"several bad fields", &allocdv1.AllocateRequest{Owner: &allocdv1.Owner{}, ClusterIps: []string{"x"},
			NodePorts: []int32{0}}, codes.InvalidArgument,
			[]string{"owner.uid", "cluster_ips[0]", "node_ports[0]"}},
		{"outside the range", &allocdv1.AllocateRequest{Owner: own("a"), ClusterIps: []string{"10.0.1.2"}},
			codes.InvalidArgument, []string{"cluster_ips"}},
		{"broadcast", &allocdv1.AllocateRequest{Owner: own("a"), ClusterIps: []string{"10.0.0.7"}},
			codes.InvalidArgument, []string{"cluster_ips"}},
		{"port outside", &allocdv1.AllocateRequest{Owner: own("a"), NodePorts: []int32{8080}},
			codes.InvalidArgument, []string{"node_ports"}},
		{"no IPv6 range", &allocdv1.AllocateRequest{Owner: own("a"), IpFamilies: []allocdv1.IPFamily{
			allocdv1.IPFamily_IP_FAMILY_IPV6}}, codes.InvalidArgument, []string{"ip_families"}},
		{"port twice", &allocdv1.AllocateRequest{Owner: own("a"), NodePorts: []int32{30001, 30001}},
			codes.InvalidArgument, []string{"node_ports"}},
	}
	for _, tc := range tests {
		_, err := c.Allocate(ctx, tc.req)
		var fields []string
		if br, ok := detail[*errdetails.BadRequest](err); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
		if status.Code(err) != tc.code || !slices.Equal(fields, tc.fields) {
			t.Errorf("%s: Allocate(%v) = %v (fields %v); want %v with fields %v", tc.name, tc.req, err,
				fields, tc.code, tc.fields)
		}
	}
	// Nothing was written: only the kubernetes address is held.
	list, err := c.ListAllocations(ctx, &allocdv1.ListAllocationsRequest{})
	if err != nil || len(list.GetAllocations()) != 1 {
		t.Errorf("ListAllocations() after bad requests = %v, %v; want only the kubernetes address", list, err)
	}
	// A full /29: RESOURCE_EXHAUSTED with QuotaFailure.
	for i := range 5 {
		if _, err := c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: own(fmt.Sprint("f", i))}); err != nil {
			t.Fatalf("Allocate(%d) = %v", i, err)
		}
	}
	_, err = c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: own("full")})
	if qf, ok := detail[*errdetails.QuotaFailure](err); status.Code(err) != codes.ResourceExhausted || !ok ||
		qf.GetViolations()[0].GetSubject() != "10.0.0.0/29" {
		t.Errorf("Allocate on a full /29 = %v; want RESOURCE_EXHAUSTED with QuotaFailure on 10.0.0.0/29", err)
	}
	// GetAllocation and ListAllocations bad input.
	for _, req := range []*allocdv1.GetAllocationRequest{{},
		{Target: &allocdv1.GetAllocationRequest_ClusterIp{ClusterIp: "nope"}},
		{Target: &allocdv1.GetAllocationRequest_NodePort{NodePort: 99999}}} {
		if _, err := c.GetAllocation(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("GetAllocation(%v) = %v; want INVALID_ARGUMENT", req, err)
		}
	}
	freePort := &allocdv1.GetAllocationRequest{
		Target: &allocdv1.GetAllocationRequest_NodePort{NodePort: 30001}}
	if _, err := c.GetAllocation(ctx, freePort); status.Code(err) != codes.NotFound {
		t.Errorf("GetAllocation(free port) = %v; want NOT_FOUND", err)
	}
	for _, req := range []*allocdv1.ListAllocationsRequest{{PageSize: -1}, {PageToken: "zz"},
		{Range: "10.1.0.0/16"}} {
		if _, err := c.ListAllocations(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("ListAllocations(%v) = %v; want INVALID_ARGUMENT", req, err)
		}
	}
	noOwner := &allocdv1.ReleaseRequest{ClusterIps: []string{"10.0.0.2"}}
	if _, err := c.Release(ctx, noOwner); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Release(no owner, no force) = %v; want INVALID_ARGUMENT", err)
	}
}

func TestAllocatorServicePaging(t *testing.T) {
	e := etcdtest.New(t)
	c := startAllocatorServer(t, e, "10.0.0.0/24")
	ctx := etcdtest.Context(t)
	for i := range 7 {
		if _, err := c.Allocate(ctx,
			&allocdv1.AllocateRequest{Owner: own(fmt.Sprint("p", i)), NodePortCount: 1}); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	tok := ""
	for range 20 {
		page, err := c.ListAllocations(ctx, &allocdv1.ListAllocationsRequest{PageSize: 3, PageToken: tok})
		if err != nil || len(page.GetAllocations()) > 3 {
			t.Fatalf("ListAllocations(token %q) = %v, %v", tok, page, err)
		}
		for _, a := range page.Allocations {
			k := a.GetClusterIp() + fmt.Sprint(a.GetNodePort())
			if seen[k] {
				t.Errorf("ListAllocations listed %s twice", k)
			}
			seen[k] = true
		}
		if tok = page.GetNextPageToken(); tok == "" {
			break
		}
	}
	if len(seen) != 15 { // 7 addresses, 7 ports, the kubernetes address
		t.Errorf("ListAllocations listed %d; want 15", len(seen))
	}
	byOwner, err := c.ListAllocations(ctx, &allocdv1.ListAllocationsRequest{OwnerUid: "p3"})
	if err != nil || len(byOwner.GetAllocations()) != 2 {
		t.Errorf("ListAllocations(owner p3) = %v, %v; want 2", byOwner, err)
	}
	ports, err := c.ListAllocations(ctx, &allocdv1.ListAllocationsRequest{Range: "30000-32767"})
	if err != nil || len(ports.GetAllocations()) != 7 {
		t.Errorf("ListAllocations(range 30000-32767) = %v, %v; want 7", ports, err)
	}
}

// ListRanges answers from the allocator's index, which follows etcd through a watch:
// it must reflect every Allocate and Release acknowledged before it, by this replica
// or another, and answer UNAVAILABLE rather than stale counts.
func TestAllocatorServiceListRangesCurrent(t *testing.T) {
	e := etcdtest.New(t)
	c := startAllocatorServer(t, e, "10.0.0.0/24")
	ctx := etcdtest.Context(t)
	used := func() uint64 {
		t.Helper()
		lr, err := c.ListRanges(ctx, &allocdv1.ListRangesRequest{})
		if err != nil || len(lr.GetRanges()) != 2 {
			t.Fatalf("ListRanges() = %v, %v", lr, err)
		}
		return lr.Ranges[0].GetUsed()
	}
	// Another replica writes; its allocations reach this replica's index by the watch.
	other, err := allocator.New(ctx, e.NewClient(), allocator.Config{Prefix: "/allocd",
		ClusterIPRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")},
		NodePortRange:   allocator.DefaultNodePortRange})
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	for i := range n {
		o := allocator.Owner{Namespace: "default", Name: "svc", UID: fmt.Sprint("u", i)}
		if _, err := other.Allocate(ctx, allocator.Request{Owner: o}); err != nil {
			t.Fatal(err)
		}
		if got, want := used(), uint64(i+2); got != want { // and the kubernetes address
			t.Fatalf("ListRanges() after %d Allocates elsewhere: used = %d; want %d", i+1, got, want)
		}
		if i%2 == 1 {
			if _, _, err := other.Release(ctx, o, nil, false); err != nil {
				t.Fatal(err)
			}
			if got, want := used(), uint64(i+1); got != want {
				t.Fatalf("ListRanges() after a Release elsewhere: used = %d; want %d", got, want)
			}
			if _, err := other.Allocate(ctx, allocator.Request{Owner: o}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A write outside the allocations: the watch sees no event for it, a progress
	// notification says it has seen everything up to it.
	if _, err := e.Client.Put(ctx, "/elsewhere", "x"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if got, want := used(), uint64(n+1); got != want {
		t.Errorf("ListRanges() = used %d; want %d", got, want)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("ListRanges() after a write outside the allocations took %v; want well under the 5 s bound",
			d)
	}

	// An allocator whose Run is not running cannot catch up: UNAVAILABLE.
	idle := server.NewAllocatorService(other, nil)
	if _, err := other.Allocate(ctx, allocator.Request{Owner: allocator.Owner{UID: "late"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := idle.ListRanges(ctx, &allocdv1.ListRangesRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("ListRanges() of an allocator that is not running, behind etcd = %v; want UNAVAILABLE", err)
	}
}
