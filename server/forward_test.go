package server

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/allocator"
	"github.com/allocd/allocd/endpoints"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	"github.com/allocd/allocd/leader"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
	"github.com/allocd/allocd/repair"
)

// electionPrefix is the election of the feed nodes.
const electionPrefix = "/allocd/repair/leader"

// feedNode is one replica as the daemon wires it, on loopback: an allocator, repair and
// the Endpoints controller led by one election, RepairService and EndpointsService with
// one Forwarder. Its election stops apart from the rest (stopElection: the replica
// resigns and stays up, refusing what only the leader serves).
type feedNode struct {
	addr         string
	el           *leader.Elector
	lead         *readSwitch
	rep          *repair.Controller
	ec           *endpoints.Controller
	stopElection func()
	repair       allocdv1.RepairServiceClient
	eps          allocdv1.EndpointsServiceClient
}

// readSwitch is the election's Leadership, or, while readEveryCall is set, the same
// with every Leader read from etcd, as Leader did before the elector watched the
// election: what BenchmarkForwardedPush compares with.
type readSwitch struct {
	*leader.Elector
	readEveryCall atomic.Bool
}

// Leader is the Elector's, or its ReadLeader while readEveryCall is set.
func (s *readSwitch) Leader(ctx context.Context) (string, bool, error) {
	if s.readEveryCall.Load() {
		return s.ReadLeader(ctx)
	}
	return s.Elector.Leader(ctx)
}

// staleView names one replica as the leader whatever etcd says, as a view that trails
// etcd does; ReadLeader reads etcd.
type staleView struct {
	*leader.Elector
	names string
}

// Leader names s.names.
func (s staleView) Leader(context.Context) (string, bool, error) { return s.names, false, nil }

func startFeedNode(tb testing.TB, cli *clientv3.Client) *feedNode {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	n := &feedNode{addr: lis.Addr().String()}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	tb.Cleanup(func() { cancel(); wg.Wait() })
	alloc, err := allocator.New(ctx, cli, allocator.Config{
		Prefix:          "/allocd",
		ClusterIPRanges: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")},
		NodePortRange:   allocator.DefaultNodePortRange,
	})
	if err != nil {
		tb.Fatalf("allocator.New: %v", err)
	}
	wg.Go(func() { alloc.Run(ctx) })
	if n.el, err = leader.New(cli, leader.Config{Prefix: electionPrefix, Identity: n.addr,
		SessionTTL: time.Second}); err != nil {
		tb.Fatalf("leader.New: %v", err)
	}
	if n.rep, err = repair.New(cli, alloc, repair.Config{Prefix: "/allocd", Interval: time.Hour,
		LeakStrikes: 3, Leadership: n.el}); err != nil {
		tb.Fatalf("repair.New: %v", err)
	}
	if n.ec, err = endpoints.New(cli, endpoints.Config{Prefix: "/allocd"}); err != nil {
		tb.Fatalf("endpoints.New: %v", err)
	}
	ectx, stopElection := context.WithCancel(ctx)
	n.stopElection = stopElection
	wg.Go(func() { n.el.Run(ectx, n.rep.Lead, n.ec.Lead) })
	n.lead = &readSwitch{Elector: n.el}
	fw := NewForwarder(n.lead, nil, nil)
	gs, _ := NewGRPCServer(Options{})
	rs := NewRepairService(n.rep, fw, nil)
	rs.SetEndpoints(n.ec)
	allocdv1.RegisterRepairServiceServer(gs, rs)
	allocdv1.RegisterEndpointsServiceServer(gs, NewEndpointsService(n.ec, n.rep, fw, nil))
	wg.Go(func() { gs.Serve(lis) })
	tb.Cleanup(func() { gs.Stop(); fw.Close() })
	cc, err := grpc.NewClient(n.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cc.Close() })
	n.repair = allocdv1.NewRepairServiceClient(cc)
	n.eps = allocdv1.NewEndpointsServiceClient(cc)
	return n
}

// leads reports whether n's term runs, for repair and the Endpoints controller too.
func (n *feedNode) leads() bool { return n.el.IsLeader() && n.rep.IsLeader() && n.ec.Leading() }

// waitCandidates waits until the election has n candidates, so that the replicas started
// so far lead in the order they started.
func waitCandidates(tb testing.TB, cli *clientv3.Client, n int) {
	tb.Helper()
	ctx := etcdtest.Context(tb)
	etcdtest.WaitFor(tb, 10*time.Second, fmt.Sprint(n, " candidates"), func() bool {
		resp, err := cli.Get(ctx, electionPrefix+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == int64(n)
	})
}

// webService selects the Pods of webPod.
func webService() *allocdv1.Service {
	return &allocdv1.Service{Namespace: "ns", Name: "web", Uid: "uid-web",
		ClusterIps: []string{"192.168.1.9"},
		Selector:   &allocdv1.Selector{MatchLabels: map[string]string{"app": "web"}},
		Ports: []*allocdv1.ServicePortSpec{{Name: "http", Port: 80,
			TargetPort: &allocdv1.TargetPort{Value: &allocdv1.TargetPort_IntValue{IntValue: 8080}}}}}
}

func webPod(i int, ready bool) *allocdv1.Pod {
	return &allocdv1.Pod{Namespace: "ns", Name: fmt.Sprint("web-", i), Uid: fmt.Sprint("uid-web-", i),
		Labels: map[string]string{"app": "web"}, PodIps: []string{fmt.Sprintf("10.0.0.%d", i+1)},
		Phase: "Running", Ready: ready}
}

func snapshotChunks(rev int64, svcs ...*allocdv1.Service) []*allocdv1.PushServiceSnapshotRequest {
	return []*allocdv1.PushServiceSnapshotRequest{{Snapshot: &allocdv1.ServiceSnapshot{Revision: rev,
		Services: svcs}}}
}

// TestForwardAfterRefusal: when the replica a call was forwarded to refuses it (a view
// that trails etcd named it), the Forwarder reads the leader from etcd and sends the call
// there once more: a repair stream, an Endpoints stream, a unary call. The replica that
// refused took nothing.
func TestForwardAfterRefusal(t *testing.T) {
	e := etcdtest.New(t)
	ld := startFeedNode(t, e.Client)
	etcdtest.WaitFor(t, 10*time.Second, "a leader", ld.leads)
	old := startFeedNode(t, e.NewClient()) // a replica that does not lead
	obs, err := leader.New(e.NewClient(), leader.Config{Prefix: electionPrefix, Identity: "127.0.0.1:9"})
	if err != nil {
		t.Fatal(err)
	}
	fw := NewForwarder(staleView{Elector: obs, names: old.addr}, nil, nil)
	t.Cleanup(func() { fw.Close() })
	ctx := etcdtest.Context(t)

	resp, fwd, err := toLeader(ctx, fw, controllerRepair, snapshotChunks(7, webService()),
		streamVia(allocdv1.NewRepairServiceClient, allocdv1.RepairServiceClient.PushServiceSnapshot))
	if err != nil || !fwd || resp.GetRevision() != 7 {
		t.Fatalf("PushServiceSnapshot through a view naming %s = %v, %v, %v; want revision 7, forwarded",
			old.addr, resp, fwd, err)
	}
	for _, c := range []struct {
		n    *feedNode
		want int64
	}{{ld, 7}, {old, 0}} {
		if st, err := c.n.rep.Status(ctx); err != nil || st.SnapshotRevision != c.want {
			t.Errorf("%s's snapshot revision = %d, %v; want %d", c.n.addr, st.SnapshotRevision, err, c.want)
		}
	}
	pods := []*allocdv1.PushPodSnapshotRequest{{Snapshot: &allocdv1.PodSnapshot{Revision: 7,
		Pods: []*allocdv1.Pod{webPod(0, true)}}}}
	if _, _, err := toLeader(ctx, fw, controllerEndpoints, pods, streamVia(allocdv1.NewEndpointsServiceClient,
		allocdv1.EndpointsServiceClient.PushPodSnapshot)); err != nil {
		t.Fatalf("PushPodSnapshot through a view naming %s = %v; want it forwarded to the leader",
			old.addr, err)
	}
	evs := []*allocdv1.PushEventsRequest{{Revision: 8, Events: []*allocdv1.Event{{
		Type: allocdv1.EventType_EVENT_TYPE_UPSERT, Object: &allocdv1.Event_Pod{Pod: webPod(0, false)}}}}}
	er, _, err := toLeader(ctx, fw, controllerEndpoints, evs,
		streamVia(allocdv1.NewEndpointsServiceClient, allocdv1.EndpointsServiceClient.PushEvents))
	if err != nil || er.GetApplied() != 1 {
		t.Fatalf("PushEvents through a view naming %s = %v, %v; want 1 applied by the leader",
			old.addr, er, err)
	}
	rr, err := forwardUnary(ctx, fw, controllerRepair, old.addr, &allocdv1.RunRepairRequest{DryRun: true},
		unaryVia(allocdv1.NewRepairServiceClient, allocdv1.RepairServiceClient.RunRepair))
	if err != nil || rr.GetReport().GetSnapshotRevision() != 7 {
		t.Fatalf("RunRepair forwarded to %s = %v, %v; want the leader's report on revision 7",
			old.addr, rr, err)
	}
}

// TestForwardDuringLeaderChange: pushes through a replica that does not lead, while the
// leader resigns (and stays up) and the next candidate takes over. Every push is served
// by a leader or refused as the client retries it; the old leader takes none after it
// resigned; the first push after the new term started reaches the new leader.
func TestForwardDuringLeaderChange(t *testing.T) {
	e := etcdtest.New(t)
	old := startFeedNode(t, e.Client)
	etcdtest.WaitFor(t, 10*time.Second, "a leader", old.leads)
	next := startFeedNode(t, e.NewClient())
	waitCandidates(t, e.Client, 2)
	via := startFeedNode(t, e.NewClient())
	waitCandidates(t, e.Client, 3)
	ctx := etcdtest.Context(t)
	rev := int64(1)
	pushVia := func() error {
		rev++
		_, err := push(ctx, via.repair, []int64{rev}, []*allocdv1.Service{webService()})
		return err
	}
	if err := pushVia(); err != nil {
		t.Fatalf("PushServiceSnapshot before the change = %v", err)
	}
	before := rev

	old.stopElection()
	pushes, refusals := 0, 0
	for !next.leads() {
		err := pushVia()
		if err != nil && !refusedToCaller(err) {
			t.Fatalf("PushServiceSnapshot(revision %d) during the change = %v; want OK or a refusal",
				rev, err)
		}
		pushes++
		if err != nil {
			refusals++
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("during the change: %d pushes, %d refused", pushes, refusals)
	if err := pushVia(); err != nil {
		t.Fatalf("PushServiceSnapshot(revision %d) after %s leads = %v; want OK", rev, next.addr, err)
	}
	for _, c := range []struct {
		n    *feedNode
		want int64
	}{{next, rev}, {old, before}} {
		if st, err := c.n.rep.Status(ctx); err != nil || st.SnapshotRevision != c.want {
			t.Errorf("%s's snapshot revision = %d, %v; want %d", c.n.addr, st.SnapshotRevision, err, c.want)
		}
	}
}

// refusedToCaller tells the errors a forwarded call ends with while no leader serves it:
// UNAVAILABLE, or FAILED_PRECONDITION NOT_REPAIR_LEADER.
func refusedToCaller(err error) bool {
	if status.Code(err) == codes.Unavailable {
		return true
	}
	ei, _ := repairDetail[*errdetails.ErrorInfo](err)
	return status.Code(err) == codes.FailedPrecondition &&
		ei.GetReason() == allocdv1.ErrorReason_NOT_REPAIR_LEADER.String()
}

// BenchmarkForwardedPush: a PushEvents of one Pod readiness flip sent to a replica that
// does not lead and forwarded to the leader, with the leader named by the elector's
// watch (view) and read from etcd for every call (read, as before). Each iteration
// pushes once each way, in turns (read first in even iterations, view first in odd
// ones), so that the machine's load weighs on both alike; it reports each way's median
// and mean latency, and the load average when the run ended (load1, from /proc/loadavg).
//
//	go test -run '^$' -bench BenchmarkForwardedPush -benchtime 2000x -count 3 ./server/
func BenchmarkForwardedPush(b *testing.B) {
	e := etcdtest.New(b)
	ld := startFeedNode(b, e.Client)
	etcdtest.WaitFor(b, 10*time.Second, "a leader", ld.leads)
	fl := startFeedNode(b, e.NewClient())
	ctx := etcdtest.Context(b)
	if _, err := push(ctx, fl.repair, []int64{1}, []*allocdv1.Service{webService()}); err != nil {
		b.Fatal(err)
	}
	f := &flipper{b: b, ctx: ctx, api: fl.eps, rev: 1}
	f.snapshot()
	var took [2][]time.Duration // read, view
	for i := 0; b.Loop(); i++ {
		for k := range 2 {
			way := (i + k) % 2 // 0: read, 1: view
			fl.lead.readEveryCall.Store(way == 0)
			took[way] = append(took[way], f.flip())
		}
	}
	for k, name := range []string{"read", "view"} {
		slices.Sort(took[k])
		var sum time.Duration
		for _, d := range took[k] {
			sum += d
		}
		b.ReportMetric(float64(took[k][len(took[k])/2].Microseconds()), name+"-p50-µs")
		b.ReportMetric(float64(sum.Microseconds())/float64(len(took[k])), name+"-mean-µs")
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		if l1, err := strconv.ParseFloat(strings.Fields(string(la))[0], 64); err == nil {
			b.ReportMetric(l1, "load1")
		}
	}
}

// flipper pushes Pod readiness flips of webService's Pods to a replica.
type flipper struct {
	b     *testing.B
	ctx   context.Context
	api   allocdv1.EndpointsServiceClient
	rev   int64
	ready [10]bool
	next  int
}

// snapshot pushes the Pods, none ready.
func (f *flipper) snapshot() {
	snap := &allocdv1.PodSnapshot{Revision: f.rev}
	for i := range f.ready {
		snap.Pods = append(snap.Pods, webPod(i, false))
	}
	st, err := f.api.PushPodSnapshot(f.ctx)
	if err == nil {
		err = st.Send(&allocdv1.PushPodSnapshotRequest{Snapshot: snap})
	}
	if err == nil {
		_, err = st.CloseAndRecv()
	}
	if err != nil {
		f.b.Fatal(err)
	}
}

// flip pushes one event that flips the next Pod's readiness, and returns how long the
// push took.
func (f *flipper) flip() time.Duration {
	f.rev++
	p := f.next
	f.next = (f.next + 1) % len(f.ready)
	f.ready[p] = !f.ready[p]
	start := time.Now()
	st, err := f.api.PushEvents(f.ctx)
	if err == nil {
		err = st.Send(&allocdv1.PushEventsRequest{Revision: f.rev, Events: []*allocdv1.Event{{
			Type:   allocdv1.EventType_EVENT_TYPE_UPSERT,
			Object: &allocdv1.Event_Pod{Pod: webPod(p, f.ready[p])}}}})
	}
	var resp *allocdv1.PushEventsResponse
	if err == nil {
		resp, err = st.CloseAndRecv()
	}
	took := time.Since(start)
	if err != nil || resp.GetApplied() != 1 {
		f.b.Fatalf("PushEvents(revision %d) = %v, %v; want 1 applied", f.rev, resp, err)
	}
	return took
}
