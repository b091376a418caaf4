package client_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/cmd/allocd/daemon"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// newClient returns a client of addr closed by t.Cleanup.
func newClient(t *testing.T, addr string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(addr, opts...)
	if err != nil {
		t.Fatalf("client.New(%q) = %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func owner(name string) *allocdv1.Owner {
	return &allocdv1.Owner{Namespace: "default", Name: name, Uid: "uid-" + name}
}

// TestAllocateErrors drives Allocate and Release through every error a shim must
// handle, against a real allocd with a /29 ClusterIP range.
func TestAllocateErrors(t *testing.T) {
	d := daemon.StartForTest(t, func(c *daemon.Config) { c.ServiceClusterIPRange = "10.96.0.0/29" })
	c := newClient(t, d.GRPCAddr())
	ctx := etcdtest.Context(t)

	// A specific address, then the same request again: the same answer, replayed.
	req := &allocdv1.AllocateRequest{Owner: owner("a"), ClusterIps: []string{"10.96.0.2"},
		NodePorts: []int32{30080}}
	first, err := c.Allocate(ctx, req)
	if err != nil {
		t.Fatalf("Allocate(%v) = %v", req, err)
	}
	if !slices.Equal(first.GetClusterIps(), []string{"10.96.0.2"}) ||
		!slices.Equal(first.GetNodePorts(), []int32{30080}) {
		t.Errorf("Allocate(%v) = %v; want 10.96.0.2 and 30080", req, first)
	}
	again, err := c.Allocate(ctx, req)
	if err != nil || !again.GetReplayed() || !slices.Equal(again.GetClusterIps(), first.GetClusterIps()) {
		t.Errorf("Allocate(%v) again = %v, %v; want the same addresses, replayed", req, again, err)
	}

	// The same address for another owner: ALREADY_EXISTS naming the holder.
	_, err = c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: owner("b"), ClusterIps: []string{"10.96.0.2"}})
	var held *client.AlreadyAllocatedError
	if !errors.Is(err, client.ErrAlreadyAllocated) || !errors.As(err, &held) {
		t.Fatalf("Allocate(held address) = %v; want ErrAlreadyAllocated", err)
	}
	if held.HolderUID != "uid-a" || !strings.Contains(held.Holder, "uid-a") || held.Resource != "10.96.0.2" {
		t.Errorf("AlreadyAllocatedError = %+v; want 10.96.0.2 held by uid-a", held)
	}
	if got := status.Code(err); got != codes.AlreadyExists {
		t.Errorf("status.Code(%v) = %v; want %v", err, got, codes.AlreadyExists)
	}

	// Malformed: every bad field listed.
	_, err = c.Allocate(ctx,
		&allocdv1.AllocateRequest{Owner: &allocdv1.Owner{Name: "x"}, ClusterIps: []string{"10.96.0.300"}})
	var inv *client.InvalidError
	if !errors.Is(err, client.ErrInvalid) || !errors.As(err, &inv) || len(inv.Violations) == 0 {
		t.Fatalf("Allocate(bad uid and address) = %v; want ErrInvalid with violations", err)
	}
	onClusterIP := func(v client.FieldViolation) bool { return strings.Contains(v.Field, "cluster_ip") }
	if !slices.ContainsFunc(inv.Violations, onClusterIP) {
		t.Errorf("InvalidError.Violations = %v; want one about cluster_ips", inv.Violations)
	}

	// Releasing another owner's address: refused, nothing freed; with force: freed.
	_, err = c.Release(ctx, &allocdv1.ReleaseRequest{Owner: owner("b"), ClusterIps: []string{"10.96.0.2"}})
	if !errors.Is(err, client.ErrNotOwner) {
		t.Errorf("Release(another owner's address) = %v; want ErrNotOwner", err)
	}
	if al, err := c.GetAllocation(ctx,
		&allocdv1.GetAllocationRequest{Target: &allocdv1.GetAllocationRequest_ClusterIp{
			ClusterIp: "10.96.0.2"}}); err != nil || al.GetOwner().GetUid() != "uid-a" {
		t.Errorf("GetAllocation(10.96.0.2) after a refused release = %v, %v; want held by uid-a", al, err)
	}

	// Fill the range: the rest of the /29 goes, then RESOURCE_EXHAUSTED.
	var got []string
	for i := range 10 {
		resp, err := c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: owner("fill-" + string(rune('a'+i)))})
		if errors.Is(err, client.ErrFull) {
			var full *client.FullError
			if !errors.As(err, &full) {
				t.Errorf("errors.As(%v, *FullError) = false; want true", err)
			}
			break
		}
		if err != nil {
			t.Fatalf("Allocate(dynamic #%d) = %v", i, err)
		}
		got = append(got, resp.GetClusterIps()...)
	}
	// 10.96.0.0/29: .1 is the kubernetes Service's, .2 is owner a's, .7 is broadcast.
	slices.Sort(got)
	if want := []string{"10.96.0.3", "10.96.0.4", "10.96.0.5", "10.96.0.6"}; !slices.Equal(got, want) {
		t.Errorf("dynamic allocations until ErrFull = %v; want %v", got, want)
	}

	// The owner releases (twice: the second is a no-op), and the address is free.
	for i := range 2 {
		if _, err := c.Release(ctx, &allocdv1.ReleaseRequest{Owner: owner("a")}); err != nil {
			t.Errorf("Release(owner a) #%d = %v; want nil", i+1, err)
		}
	}
	_, err = c.GetAllocation(ctx, &allocdv1.GetAllocationRequest{
		Target: &allocdv1.GetAllocationRequest_ClusterIp{ClusterIp: "10.96.0.2"}})
	if !errors.Is(err, client.ErrNotFound) {
		t.Errorf("GetAllocation(released address) = %v; want ErrNotFound", err)
	}
}

// TestRetryUnavailable calls a server that comes up late on a fixed port: the call is
// retried on UNAVAILABLE and succeeds within its context. Without retries it fails at
// once with ErrUnavailable.
func TestRetryUnavailable(t *testing.T) {
	addr, err := daemon.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	noRetry := newClient(t, addr, client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
	if _, err := noRetry.ListRanges(etcdtest.Context(t)); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("ListRanges(no server, no retries) = %v; want ErrUnavailable", err)
	}

	c := newClient(t, addr, client.WithRetry(client.RetryPolicy{MaxAttempts: -1,
		InitialBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond}))
	cfg := daemon.TestConfig(t.TempDir(), func() string { a, _ := daemon.FreeAddr(); return a })
	cfg.GRPCAddress = addr
	started := make(chan *daemon.Daemon, 1)
	startErr := make(chan error, 1)
	time.AfterFunc(500*time.Millisecond, func() {
		d, err := daemon.Start(context.Background(), cfg)
		if err != nil {
			startErr <- err
			return
		}
		started <- d
	})
	t.Cleanup(func() {
		select {
		case d := <-started:
			d.Close()
		case <-startErr:
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	begin := time.Now()
	resp, err := c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: owner("late"), NodePortCount: 1})
	select {
	case err := <-startErr:
		t.Fatalf("start allocd: %v", err)
	default:
	}
	if err != nil {
		t.Fatalf("Allocate(server up after 500ms) = %v after %v; want success within the 20s context", err,
			time.Since(begin))
	}
	if len(resp.GetNodePorts()) != 1 {
		t.Errorf("Allocate(NodePortCount: 1) = %v; want one node port", resp)
	}
	if elapsed := time.Since(begin); elapsed < 400*time.Millisecond {
		t.Errorf("Allocate succeeded after %v, before the server was started", elapsed)
	}
	t.Logf("Allocate succeeded %v after the call, the server being started at 500ms", time.Since(begin))
}

// TestLeaseKeeper keeps a 1s lease alive well past its TTL, then removes it on cancel
// within twice the renew interval.
func TestLeaseKeeper(t *testing.T) {
	if testing.Short() {
		t.Skip("keeps a lease over real TTLs: seconds")
	}
	d := daemon.StartForTest(t)
	c := newClient(t, d.GRPCAddr())
	ctx := etcdtest.Context(t)
	const ip = "192.0.2.10"
	const ttl = time.Second
	interval := ttl / 3

	renewed := make(chan *allocdv1.Lease, 100)
	var errs []error
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	k := client.NewLeaseKeeper(c, ip, ttl,
		client.WithRenewed(func(l *allocdv1.Lease) { renewed <- l }),
		client.WithRenewErrors(func(err error) { errs = append(errs, err) }))
	go func() { done <- k.Run(runCtx) }()

	// Six renewals take about 2s, twice the TTL: the lease lives only if they work.
	for i := range 6 {
		select {
		case l := <-renewed:
			if l.GetIp() != ip || l.GetTtlSeconds() != 1 {
				t.Errorf("renewal #%d = %v; want ip %s, ttl 1s", i+1, l, ip)
			}
		case err := <-done:
			t.Fatalf("LeaseKeeper.Run() = %v before renewal #%d; want it running", err, i+1)
		case <-time.After(5 * time.Second):
			t.Fatalf("renewal #%d did not come within 5s", i+1)
		}
	}
	if !hasLease(t, c, ip) {
		t.Fatalf("ListLeases lacks %s after %d TTLs of renewals", ip, 2)
	}

	stop()
	begin := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("LeaseKeeper.Run() = %v after cancel; want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("LeaseKeeper.Run did not return within 5s of cancel")
	}
	elapsed := time.Since(begin)
	if elapsed > 2*interval+100*time.Millisecond {
		t.Errorf("LeaseKeeper.Run returned %v after cancel; want within 2 x %v", elapsed, interval)
	}
	t.Logf("lease removed %v after cancel (bound 2 x %v)", elapsed, interval)
	if hasLease(t, c, ip) {
		t.Errorf("ListLeases still has %s after LeaseKeeper.Run returned", ip)
	}
	if len(errs) != 0 {
		t.Errorf("renew errors = %v; want none", errs)
	}
}

// TestLeaseKeeperServerDown reports renew failures while allocd is unreachable, and
// gives up the removal within twice the renew interval.
func TestLeaseKeeperServerDown(t *testing.T) {
	if testing.Short() {
		t.Skip("measures a real-time bound of 300 ms: on a loaded machine the scheduling shows in it")
	}
	addr, err := daemon.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, addr)
	interval := 150 * time.Millisecond
	errs := make(chan error, 100)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	k := client.NewLeaseKeeper(c, "192.0.2.11", 0, client.WithRenewInterval(interval),
		client.WithRenewErrors(func(err error) { errs <- err }))
	go func() { done <- k.Run(ctx) }()
	for i := range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, client.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("renew error #%d = %v; want ErrUnavailable or a deadline", i+1, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("renew error #%d not reported within 5s", i+1)
		}
	}
	stop()
	begin := time.Now()
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("LeaseKeeper.Run() = nil with no server; want the removal's error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("LeaseKeeper.Run did not return within 5s of cancel")
	}
	if elapsed := time.Since(begin); elapsed > 2*interval+100*time.Millisecond {
		t.Errorf("LeaseKeeper.Run returned %v after cancel; want within 2 x %v", elapsed, interval)
	}
}

func hasLease(t *testing.T, c *client.Client, ip string) bool {
	t.Helper()
	resp, err := c.ListLeases(etcdtest.Context(t))
	if err != nil {
		t.Fatalf("ListLeases() = %v", err)
	}
	return slices.ContainsFunc(resp.GetLeases(), func(l *allocdv1.Lease) bool { return l.GetIp() == ip })
}

// TestPushServiceSnapshot pushes a snapshot in several chunks and then an older one.
func TestPushServiceSnapshot(t *testing.T) {
	d := daemon.StartForTest(t)
	c := newClient(t, d.GRPCAddr(), client.WithSnapshotChunkSize(3))
	ctx := etcdtest.Context(t)
	var services []*allocdv1.Service
	for i := range 10 {
		name := "svc-" + string(rune('a'+i))
		services = append(services, &allocdv1.Service{Namespace: "default", Name: name, Uid: "uid-" + name})
	}
	resp, err := c.PushServiceSnapshot(ctx, &allocdv1.ServiceSnapshot{Revision: 7, Services: services})
	if err != nil {
		t.Fatalf("PushServiceSnapshot(rev 7, 10 services in chunks of 3) = %v", err)
	}
	if resp.GetRevision() != 7 || resp.GetServiceCount() != 10 {
		t.Errorf("PushServiceSnapshot(rev 7, 10 services) = %v; want revision 7, 10 services", resp)
	}
	_, err = c.PushServiceSnapshot(ctx, &allocdv1.ServiceSnapshot{Revision: 6})
	if !errors.Is(err, client.ErrStaleSnapshot) {
		t.Errorf("PushServiceSnapshot(rev 6 after 7) = %v; want ErrStaleSnapshot", err)
	}
	st, err := c.GetRepairStatus(ctx)
	if err != nil || st.GetSnapshotRevision() != 7 {
		t.Errorf("GetRepairStatus() = %v, %v; want snapshot revision 7", st, err)
	}
}

// TestTwoReplicas drives two allocd replicas sharing one etcd (the first one's
// embedded etcd) through two clients: what one hands out, the other refuses.
func TestTwoReplicas(t *testing.T) {
	var etcdAddr string
	a := daemon.StartForTest(t, func(c *daemon.Config) { etcdAddr = c.EmbeddedEtcdClientAddress })
	b := daemon.StartForTest(t, func(c *daemon.Config) { c.EtcdServers = []string{"http://" + etcdAddr} })
	ca, cb := newClient(t, a.GRPCAddr()), newClient(t, b.GRPCAddr())
	ctx := etcdtest.Context(t)

	resp, err := ca.Allocate(ctx, &allocdv1.AllocateRequest{Owner: owner("on-a"), NodePortCount: 1})
	if err != nil || len(resp.GetClusterIps()) != 1 || len(resp.GetNodePorts()) != 1 {
		t.Fatalf("Allocate on replica A = %v, %v; want one address and one port", resp, err)
	}
	_, err = cb.Allocate(ctx, &allocdv1.AllocateRequest{Owner: owner("on-b"),
		ClusterIps: resp.GetClusterIps(), NodePorts: resp.GetNodePorts()})
	var held *client.AlreadyAllocatedError
	if !errors.As(err, &held) || held.HolderUID != "uid-on-a" {
		t.Errorf("Allocate on replica B of A's address and port = %v; want "+
			"ErrAlreadyAllocated held by uid-on-a", err)
	}
	if _, err := cb.Release(ctx, &allocdv1.ReleaseRequest{Owner: owner("on-a")}); err != nil {
		t.Fatalf("Release on replica B of A's owner = %v", err)
	}
	if _, err := ca.GetAllocation(ctx,
		&allocdv1.GetAllocationRequest{Target: &allocdv1.GetAllocationRequest_NodePort{
			NodePort: resp.GetNodePorts()[0]}}); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("GetAllocation on replica A after release on B = %v; want ErrNotFound", err)
	}
}

// TestTransfer binds what a provisional owner allocated to a Service's UID, as allocd-
// bridge does, against a real allocd: the owners of the prefix are listed, the items
// move, a retry moves nothing; what From does not hold is ErrNotOwner naming the
// holder (or saying nobody holds it), nothing moved; From equal to To is ErrInvalid.
func TestTransfer(t *testing.T) {
	d := daemon.StartForTest(t, func(c *daemon.Config) { c.ServiceClusterIPRange = "10.96.0.0/24" })
	c := newClient(t, d.GRPCAddr())
	ctx := etcdtest.Context(t)
	provisional := &allocdv1.Owner{Namespace: "default", Name: "web", Uid: "admission/5c2e"}
	got, err := c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: provisional, NodePortCount: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: owner("db"),
		NodePorts: []int32{30090}}); err != nil {
		t.Fatal(err)
	}
	pending, err := c.ListAllocations(ctx, &allocdv1.ListAllocationsRequest{OwnerUidPrefix: "admission/"})
	if err != nil || len(pending.GetAllocations()) != 2 {
		t.Fatalf("ListAllocations(prefix admission/) = %v, %v; want the provisional owner's 2", pending, err)
	}
	web := owner("web")
	for _, tc := range []struct {
		port      int32
		holderUID string
		free      string
	}{{30090, "uid-db", ""}, {30091, "", "true"}} {
		_, err := c.Transfer(ctx, &allocdv1.TransferRequest{From: provisional, To: web,
			NodePorts: append(slices.Clone(got.NodePorts), tc.port)})
		var e *client.Error
		if !errors.Is(err, client.ErrNotOwner) || !errors.As(err, &e) || client.OutcomeUnknown(err) ||
			e.Metadata["holder_uid"] != tc.holderUID || e.Metadata["free"] != tc.free {
			t.Errorf("Transfer(port %d) = %v; want ErrNotOwner, holder_uid %q, free %q", tc.port, err,
				tc.holderUID, tc.free)
		}
	}
	_, err = c.Transfer(ctx, &allocdv1.TransferRequest{From: provisional, To: provisional})
	if !errors.Is(err, client.ErrInvalid) {
		t.Errorf("Transfer(from = to) = %v; want ErrInvalid", err)
	}
	for i := range 2 {
		resp, err := c.Transfer(ctx, &allocdv1.TransferRequest{From: provisional, To: web})
		moved := len(resp.GetTransferredClusterIps()) + len(resp.GetTransferredNodePorts())
		if err != nil || (i == 0) != (moved == 2) || (i == 0) != (resp.GetRevision() != 0) {
			t.Errorf("Transfer #%d = %v, %v; want both items moved the first time, nothing after", i+1, resp,
				err)
		}
	}
	al, err := c.GetAllocation(ctx, &allocdv1.GetAllocationRequest{
		Target: &allocdv1.GetAllocationRequest_NodePort{NodePort: got.NodePorts[0]}})
	if err != nil || al.GetOwner().GetUid() != web.Uid {
		t.Errorf("GetAllocation(%d) after the transfer = %v, %v; want held by %s", got.NodePorts[0], al, err,
			web.Uid)
	}
}
