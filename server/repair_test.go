package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/allocd/allocd/allocator"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	"github.com/allocd/allocd/leader"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
	"github.com/allocd/allocd/repair"
)

// repairNode is one allocd replica serving RepairService on loopback.
type repairNode struct {
	addr   string
	alloc  *allocator.Allocator
	ctl    *repair.Controller
	client allocdv1.RepairServiceClient
	gs     *grpc.Server
}

// startRepairNode starts an allocator, a repair controller (campaigning) and a gRPC
// server with the production interceptors; everything stops in t.Cleanup.
func startRepairNode(t *testing.T, cli *clientv3.Client) *repairNode {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &repairNode{addr: lis.Addr().String()}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	n.alloc, err = allocator.New(ctx, cli, allocator.Config{
		Prefix:          "/allocd",
		ClusterIPRanges: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")},
		NodePortRange:   allocator.DefaultNodePortRange,
	})
	if err != nil {
		t.Fatalf("allocator.New: %v", err)
	}
	wg.Go(func() { n.alloc.Run(ctx) })
	el, err := leader.New(cli,
		leader.Config{Prefix: "/allocd/repair/leader", Identity: n.addr, SessionTTL: time.Second})
	if err != nil {
		t.Fatalf("leader.New: %v", err)
	}
	n.ctl, err = repair.New(cli, n.alloc, repair.Config{
		Prefix: "/allocd", Interval: time.Hour, LeakStrikes: 3, Leadership: el,
	})
	if err != nil {
		t.Fatalf("repair.New: %v", err)
	}
	wg.Go(func() { el.Run(ctx, n.ctl.Lead) })
	n.gs, _ = NewGRPCServer(Options{})
	fw := NewForwarder(el, nil, nil)
	svc := NewRepairService(n.ctl, fw, nil)
	allocdv1.RegisterRepairServiceServer(n.gs, svc)
	wg.Go(func() { n.gs.Serve(lis) })
	t.Cleanup(func() { n.gs.Stop(); fw.Close() })
	cc, err := grpc.NewClient(n.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxRecvMsgSize)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	n.client = allocdv1.NewRepairServiceClient(cc)
	return n
}

func waitRepairLeader(t *testing.T, nodes ...*repairNode) *repairNode {
	t.Helper()
	var leader *repairNode
	etcdtest.WaitFor(t, 10*time.Second, "a repair leader", func() bool {
		for _, n := range nodes {
			if n.ctl.IsLeader() {
				leader = n
				return true
			}
		}
		return false
	})
	return leader
}

// push sends chunks (each a list of Services) with the given revisions.
func push(ctx context.Context, c allocdv1.RepairServiceClient, revs []int64,
	chunks ...[]*allocdv1.Service) (*allocdv1.PushServiceSnapshotResponse, error) {
	st, err := c.PushServiceSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	for i, ch := range chunks {
		if err := st.Send(&allocdv1.PushServiceSnapshotRequest{Snapshot: &allocdv1.ServiceSnapshot{
			Revision: revs[i], Services: ch,
		}}); err != nil {
			break // the server ended the stream; CloseAndRecv returns why
		}
	}
	return st.CloseAndRecv()
}

func svcProto(uid string, ips []string, ports ...int32) *allocdv1.Service {
	s := &allocdv1.Service{Namespace: "ns", Name: uid, Uid: uid, ClusterIps: ips}
	for _, p := range ports {
		s.NodePorts = append(s.NodePorts, &allocdv1.ServicePort{Port: p, Protocol: "TCP"})
	}
	return s
}

// repairDetail returns the first detail of type T of a status error.
func repairDetail[T proto.Message](err error) (T, bool) {
	var zero T
	for _, d := range status.Convert(err).Details() {
		if v, ok := d.(T); ok {
			return v, true
		}
	}
	return zero, false
}

func holderUID(t *testing.T, a *allocator.Allocator, it allocator.Item) string {
	t.Helper()
	al, err := a.Get(context.Background(), it)
	if errors.Is(err, allocator.ErrNotFound) {
		return ""
	}
	if err != nil {
		t.Fatalf("Get(%v) = %v", it, err)
	}
	return al.Owner.UID
}

// TestRepairServiceAcceptance is the acceptance over gRPC: one Service per
// finding, the not-allocated address held afterwards, a leak counted down over three
// passes, an older snapshot refused.
func TestRepairServiceAcceptance(t *testing.T) {
	e := etcdtest.New(t)
	n := startRepairNode(t, e.Client)
	waitRepairLeader(t, n)
	ctx := etcdtest.Context(t)
	a := n.alloc
	addr := func(s string) allocator.Item { return allocator.IP(netip.MustParseAddr(s)) }
	for uid, items := range map[string][]allocator.Item{
		"uid-a":    {addr("192.168.1.2"), allocator.Port(30001)},
		"uid-gone": {addr("192.168.1.4"), allocator.Port(30004)},
		"uid-leak": {addr("192.168.1.5")},
	} {
		for _, it := range items {
			if _, err := a.Assign(ctx, allocator.Owner{Namespace: "ns", Name: uid, UID: uid},
				it); err != nil {
				t.Fatalf("Assign(%s, %v) = %v", uid, it, err)
			}
		}
	}
	resp, err := push(ctx, n.client, []int64{10, 10},
		[]*allocdv1.Service{
			svcProto("uid-a", []string{"192.168.1.2"}, 30001),
			svcProto("uid-dup", []string{"192.168.1.2"}),
			svcProto("uid-out", []string{"10.0.0.1"}),
			svcProto("uid-invalid", []string{"192.168.1"}),
			svcProto("uid-notalloc", []string{"192.168.1.3"}),
		},
		[]*allocdv1.Service{
			svcProto("uid-wrong", []string{"192.168.1.4"}, 30004),
			svcProto("uid-portdup", nil, 30001),
			svcProto("uid-portout", nil, 80),
			{Namespace: "ns", Name: "uid-portnotalloc", Uid: "uid-portnotalloc", HealthCheckNodePort: 30002},
			svcProto("uid-headless", []string{"None"}),
		})
	if err != nil || resp.GetRevision() != 10 || resp.GetServiceCount() != 10 {
		t.Fatalf("PushServiceSnapshot = %v, %v; want revision 10, 10 services", resp, err)
	}
	run, err := n.client.RunRepair(ctx, &allocdv1.RunRepairRequest{})
	if err != nil {
		t.Fatalf("RunRepair = %v", err)
	}
	want := map[string]int64{
		"ClusterIPAlreadyAllocated": 1, "ClusterIPOutOfRange": 1, "ClusterIPNotValid": 1,
		"ClusterIPNotAllocated": 1, "ClusterIPWrongOwner": 1, "PortWrongOwner": 1,
		"PortAlreadyAllocated": 1, "PortOutOfRange": 1, "PortNotAllocated": 1, "LeakSuspected": 1,
	}
	if got := run.GetReport().GetCounts(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("RunRepair counts = %v; want %v", got, want)
	}
	for _, f := range run.GetReport().GetFindings() {
		if f.GetReason() == "ClusterIPNotAllocated" && (!f.GetRepaired() ||
			f.GetService().GetUid() != "uid-notalloc" || f.GetClusterIp() != "192.168.1.3") {
			t.Errorf("ClusterIPNotAllocated finding = %v; want 192.168.1.3 of uid-notalloc, repaired", f)
		}
	}
	for it, uid := range map[allocator.Item]string{
		addr("192.168.1.3"): "uid-notalloc", addr("192.168.1.4"): "uid-wrong",
		allocator.Port(30004): "uid-wrong", allocator.Port(30002): "uid-portnotalloc",
	} {
		if got := holderUID(t, a, it); got != uid {
			t.Errorf("holder(%v) after RunRepair = %q; want %q", it, got, uid)
		}
	}

	// The leak: a candidate after passes 1 and 2, released by pass 3.
	for pass := 1; pass <= 3; pass++ {
		if pass > 1 {
			if run, err = n.client.RunRepair(ctx, &allocdv1.RunRepairRequest{}); err != nil {
				t.Fatalf("RunRepair pass %d = %v", pass, err)
			}
		}
		st, err := n.client.GetRepairStatus(ctx, &allocdv1.GetRepairStatusRequest{})
		if err != nil {
			t.Fatalf("GetRepairStatus = %v", err)
		}
		if st.GetLeader() != n.addr || st.GetSnapshotRevision() != 10 || st.GetLastReport() == nil {
			t.Errorf("GetRepairStatus = leader %q, snapshot %d, last report %v; want %q, 10, a report",
				st.GetLeader(), st.GetSnapshotRevision(), st.GetLastReport() != nil, n.addr)
		}
		var cands []string
		for _, c := range st.GetLeakCandidates() {
			cands = append(cands, fmt.Sprintf("%s %s %d/%d", c.GetClusterIp(), c.GetOwner().GetUid(),
				c.GetStrikes(), c.GetStrikesLeft()))
		}
		wantCands := fmt.Sprintf("[192.168.1.5 uid-leak %d/%d]", pass, 3-pass)
		if pass == 3 {
			wantCands = "[]"
		}
		if fmt.Sprint(cands) != wantCands {
			t.Errorf("after pass %d: leak candidates = %v; want %s", pass, cands, wantCands)
		}
	}
	if got := run.GetReport().GetCounts()["LeakReleased"]; got != 1 {
		t.Errorf("pass 3 LeakReleased = %d; want 1", got)
	}
	if got := holderUID(t, a, addr("192.168.1.5")); got != "" {
		t.Errorf("holder(192.168.1.5) after pass 3 = %q; want free", got)
	}

	// An older snapshot is refused, and changes nothing.
	_, err = push(ctx, n.client, []int64{9}, []*allocdv1.Service{svcProto("uid-a", nil)})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("PushServiceSnapshot(revision 9 after 10) = %v; want FAILED_PRECONDITION", err)
	}
	if ei, ok := repairDetail[*errdetails.ErrorInfo](err); !ok || ei.GetReason() != "STALE_SNAPSHOT" ||
		ei.GetMetadata()["accepted_revision"] != "10" {
		t.Errorf("stale push ErrorInfo = %v; want STALE_SNAPSHOT with accepted_revision 10", ei)
	}
	st, _ := n.client.GetRepairStatus(ctx, &allocdv1.GetRepairStatusRequest{})
	if st.GetSnapshotRevision() != 10 {
		t.Errorf("snapshot revision after a stale push = %d; want 10", st.GetSnapshotRevision())
	}
}

// TestRepairServiceUnrepairable: a Service the allocator refuses to repair (its owner
// would hold more than allocator.MaxItems items) is a finding of a successful
// RunRepair, never INVALID_ARGUMENT, and the pass repairs the other Services.
func TestRepairServiceUnrepairable(t *testing.T) {
	e := etcdtest.New(t)
	n := startRepairNode(t, e.Client)
	waitRepairLeader(t, n)
	ctx := etcdtest.Context(t)
	var ports []int32
	for p := int32(30100); p < 30100+allocator.MaxItems+1; p++ {
		ports = append(ports, p)
	}
	last := ports[len(ports)-1]
	if _, err := push(ctx, n.client, []int64{1}, []*allocdv1.Service{
		svcProto("uid-big", nil, ports...),
		svcProto("uid-a", []string{"192.168.1.2"}),
	}); err != nil {
		t.Fatalf("PushServiceSnapshot = %v", err)
	}
	run, err := n.client.RunRepair(ctx, &allocdv1.RunRepairRequest{})
	if err != nil {
		t.Fatalf("RunRepair() = %v (%v); want a report", err, status.Code(err))
	}
	if msg := run.GetReport().GetError(); msg != "" {
		t.Errorf("RunRepair() report error = %q; want none (the pass went to the end)", msg)
	}
	var notRepaired []string
	for _, f := range run.GetReport().GetFindings() {
		if !f.GetRepaired() {
			notRepaired = append(notRepaired,
				fmt.Sprintf("%s %d %s", f.GetReason(), f.GetNodePort(), f.GetService().GetUid()))
		}
	}
	want := []string{fmt.Sprintf("PortNotAllocated %d uid-big", last)}
	if fmt.Sprint(notRepaired) != fmt.Sprint(want) {
		t.Errorf("RunRepair() findings not repaired = %q; want %q", notRepaired, want)
	}
	for it, uid := range map[allocator.Item]string{
		allocator.IP(netip.MustParseAddr("192.168.1.2")): "uid-a",
		allocator.Port(int(ports[0])):                    "uid-big",
		allocator.Port(int(last)):                        "",
	} {
		if got := holderUID(t, n.alloc, it); got != uid {
			t.Errorf("holder(%v) after RunRepair = %q; want %q", it, got, uid)
		}
	}
}

// TestRepairServiceErrors: bad input and wrong state get their codes and details, and
// write nothing.
func TestRepairServiceErrors(t *testing.T) {
	e := etcdtest.New(t)
	n := startRepairNode(t, e.Client)
	waitRepairLeader(t, n)
	ctx := etcdtest.Context(t)

	_, err := n.client.RunRepair(ctx, &allocdv1.RunRepairRequest{})
	if ei, _ := repairDetail[*errdetails.ErrorInfo](err); status.Code(err) != codes.FailedPrecondition ||
		ei.GetReason() != "NO_SNAPSHOT" {
		t.Errorf("RunRepair() without a snapshot = %v; want FAILED_PRECONDITION NO_SNAPSHOT", err)
	}
	good := []*allocdv1.Service{svcProto("uid-a", []string{"192.168.1.2"})}
	for _, tc := range []struct {
		name   string
		revs   []int64
		chunks [][]*allocdv1.Service
		code   codes.Code
		field  string // BadRequest field, "" for none
	}{
		{"revisions differ", []int64{5, 6}, [][]*allocdv1.Service{good, nil}, codes.InvalidArgument,
			"snapshot.revision"},
		{"no chunk", nil, nil, codes.InvalidArgument, "snapshot"},
		{"zero revision", []int64{0}, [][]*allocdv1.Service{good}, codes.InvalidArgument,
			"snapshot.revision"},
		{"no uid", []int64{5}, [][]*allocdv1.Service{{{Namespace: "ns", Name: "a"}}}, codes.InvalidArgument,
			"snapshot.services[0].uid"},
		{"duplicate uid across chunks", []int64{5, 5}, [][]*allocdv1.Service{good, good},
			codes.InvalidArgument, "snapshot.services[1].uid"},
		{"bad protocol", []int64{5}, [][]*allocdv1.Service{{{Namespace: "ns", Name: "a", Uid: "u",
			NodePorts: []*allocdv1.ServicePort{{Port: 30001,
				Protocol: "tcp"}}}}}, codes.InvalidArgument, "snapshot.services[0].node_ports[0].protocol"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := push(ctx, n.client, tc.revs, tc.chunks...)
			if status.Code(err) != tc.code {
				t.Fatalf("PushServiceSnapshot(%s) = %v; want %v", tc.name, err, tc.code)
			}
			br, ok := repairDetail[*errdetails.BadRequest](err)
			if !ok || len(br.GetFieldViolations()) == 0 || br.GetFieldViolations()[0].GetField() != tc.field {
				t.Errorf("PushServiceSnapshot(%s) BadRequest = %v; want field %s", tc.name, br, tc.field)
			}
		})
	}
	st, err := n.client.GetRepairStatus(ctx, &allocdv1.GetRepairStatusRequest{})
	if err != nil || st.GetSnapshotRevision() != 0 {
		t.Errorf("GetRepairStatus after bad pushes = %v, %v; want snapshot revision 0", st, err)
	}
	// A chunk without a snapshot message.
	ps, err := n.client.PushServiceSnapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ps.Send(&allocdv1.PushServiceSnapshotRequest{})
	if _, err := ps.CloseAndRecv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("PushServiceSnapshot(a chunk without snapshot) = %v; want INVALID_ARGUMENT", err)
	}
}

// TestRepairServiceForwarding: behind a load balancer, a replica that is not the leader
// forwards pushes, passes and status to the leader, and names it when it cannot.
func TestRepairServiceForwarding(t *testing.T) {
	e := etcdtest.New(t)
	n1 := startRepairNode(t, e.Client)
	n2 := startRepairNode(t, e.NewClient())
	leader := waitRepairLeader(t, n1, n2)
	follower := n2
	if leader == n2 {
		follower = n1
	}
	ctx := etcdtest.Context(t)
	resp, err := push(ctx, follower.client, []int64{3},
		[]*allocdv1.Service{svcProto("uid-a", []string{"192.168.1.2"})})
	if err != nil || resp.GetRevision() != 3 {
		t.Fatalf("PushServiceSnapshot to the follower = %v, %v; want revision 3", resp, err)
	}
	lst, err := leader.ctl.Status(ctx)
	if err != nil || lst.SnapshotRevision != 3 {
		t.Errorf("leader snapshot revision = %d, %v; want 3 (forwarded)", lst.SnapshotRevision, err)
	}
	if fst, _ := follower.ctl.Status(ctx); fst.SnapshotRevision != 3 {
		t.Errorf("follower kept snapshot revision %d; want 3", fst.SnapshotRevision)
	}
	run, err := follower.client.RunRepair(ctx, &allocdv1.RunRepairRequest{})
	if err != nil || run.GetReport().GetCounts()["ClusterIPNotAllocated"] != 1 {
		t.Fatalf("RunRepair on the follower = %v, %v; want the leader's report with ClusterIPNotAllocated",
			run, err)
	}
	if got := holderUID(t, leader.alloc, allocator.IP(netip.MustParseAddr("192.168.1.2"))); got != "uid-a" {
		t.Errorf("holder(192.168.1.2) = %q; want uid-a", got)
	}
	st, err := follower.client.GetRepairStatus(ctx, &allocdv1.GetRepairStatusRequest{})
	if err != nil || st.GetLeader() != leader.addr || st.GetLastReport() == nil {
		t.Errorf("GetRepairStatus on the follower = %v, %v; want the leader's, naming %s", st, err,
			leader.addr)
	}

	leader.gs.Stop() // still the elected leader, but unreachable
	_, err = follower.client.RunRepair(ctx, &allocdv1.RunRepairRequest{})
	ei, _ := repairDetail[*errdetails.ErrorInfo](err)
	if status.Code(err) != codes.Unavailable || ei.GetMetadata()["leader"] != leader.addr {
		t.Errorf("RunRepair with the leader unreachable = %v (%v); want UNAVAILABLE naming %s", err, ei,
			leader.addr)
	}
	if _, ok := repairDetail[*errdetails.RetryInfo](err); !ok {
		t.Errorf("RunRepair with the leader unreachable: no RetryInfo in %v", err)
	}
}

// TestRepairServiceLargeSnapshot: 100k Services are accepted in chunks, and in one
// message (about 6 MiB, under the 16 MiB limit).
func TestRepairServiceLargeSnapshot(t *testing.T) {
	if testing.Short() {
		t.Skip("pushes a large snapshot: seconds")
	}
	e := etcdtest.New(t)
	n := startRepairNode(t, e.Client)
	waitRepairLeader(t, n)
	ctx := etcdtest.Context(t)
	const total = 100_000
	all := make([]*allocdv1.Service, total)
	for i := range all {
		uid := fmt.Sprintf("0b1c2d3e-4f5a-6b7c-8d9e-%012d", i)
		all[i] = &allocdv1.Service{Namespace: "namespace-" + fmt.Sprint(i%100),
			Name: fmt.Sprintf("service-%d", i), Uid: uid,
			ClusterIps: []string{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}).String()}}
	}
	if size := proto.Size(&allocdv1.PushServiceSnapshotRequest{
		Snapshot: &allocdv1.ServiceSnapshot{Revision: 1, Services: all}}); size > MaxRecvMsgSize {
		t.Fatalf("one message of 100k Services is %d bytes; over MaxRecvMsgSize", size)
	}
	var chunks [][]*allocdv1.Service
	var revs []int64
	for i := 0; i < total; i += 10_000 {
		chunks = append(chunks, all[i:i+10_000])
		revs = append(revs, 1)
	}
	for _, tc := range []struct {
		name   string
		rev    int64
		chunks [][]*allocdv1.Service
	}{
		{"10 chunks", 1, chunks},
		{"one message", 2, [][]*allocdv1.Service{all}},
	} {
		rs := make([]int64, len(tc.chunks))
		for i := range rs {
			rs[i] = tc.rev
		}
		resp, err := push(ctx, n.client, rs, tc.chunks...)
		if err != nil || resp.GetServiceCount() != total || resp.GetRevision() != tc.rev {
			t.Errorf("PushServiceSnapshot(%s) = %v, %v; want %d services at revision %d", tc.name, resp, err,
				total, tc.rev)
		}
	}
}

// TestRepairServiceForwardedReceipt: the leader judges a forwarded snapshot with the
// receipt of the replica that got it first, so that an allocation committed while the
// snapshot was being forwarded is never judged a leak (#8295).
func TestRepairServiceForwardedReceipt(t *testing.T) {
	e := etcdtest.New(t)
	n := startRepairNode(t, e.Client)
	waitRepairLeader(t, n)
	ctx := etcdtest.Context(t)
	first, err := e.Client.Get(ctx, "/any") // the forwarding replica's receipt
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.alloc.Assign(ctx, allocator.Owner{Namespace: "ns", Name: "new", UID: "uid-new"},
		allocator.IP(netip.MustParseAddr("192.168.1.9"))); err != nil {
		t.Fatal(err)
	}
	fctx := metadata.AppendToOutgoingContext(ctx, mdForwardedBy, "other-replica:1",
		mdReceivedRevision, fmt.Sprint(first.Header.Revision))
	if _, err := push(fctx, n.client, []int64{1}, []*allocdv1.Service{svcProto("uid-a", nil)}); err != nil {
		t.Fatalf("forwarded PushServiceSnapshot = %v", err)
	}
	run, err := n.client.RunRepair(ctx, &allocdv1.RunRepairRequest{})
	if err != nil {
		t.Fatalf("RunRepair = %v", err)
	}
	if got := run.GetReport().GetCounts()["LeakSuspected"]; got != 0 {
		t.Errorf("LeakSuspected = %d; want 0: 192.168.1.9 was committed after the first receipt", got)
	}
	// The same push, not forwarded: the leader's own receipt is after the allocation.
	if _, err := push(ctx, n.client, []int64{2}, []*allocdv1.Service{svcProto("uid-a", nil)}); err != nil {
		t.Fatal(err)
	}
	if run, err = n.client.RunRepair(ctx, &allocdv1.RunRepairRequest{}); err != nil ||
		run.GetReport().GetCounts()["LeakSuspected"] != 1 {
		t.Errorf("RunRepair over a later snapshot = %v, %v; want 1 LeakSuspected",
			run.GetReport().GetCounts(), err)
	}
}
