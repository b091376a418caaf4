package endpoints

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/endpoints/kube"
	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// delayedStream delays every message a Watch stream receives.
type delayedStream struct {
	grpc.ClientStream
	delay *atomic.Int64
}

func (s delayedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if d := s.delay.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	return err
}

// An etcd transaction that committed but whose answer was lost (an unknown outcome),
// followed by a retry that computes from a view that does not know the slice it
// created: the retry's write passes its compares and leaves an endpoint in two slices
// and stale endpoints of deleted Pods, which nothing corrects.
func TestUnknownOutcomeDuplicates(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a lagging watch: seconds")
	}
	e := etcdtest.New(t)
	var loseNext atomic.Bool
	var onLose func()
	watchDelay := &atomic.Int64{}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
				cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				tr, ok := req.(*etcdserverpb.TxnRequest)
				lose := ok && len(tr.Success) > 0 &&
					strings.Contains(string(tr.Success[0].GetRequestPut().GetKey()), "/endpointslices/") &&
					loseNext.Load()
				if lose {
					// The watch lags (as after an etcd leader change).
					watchDelay.Store(int64(2 * time.Second))
				}
				err := invoker(ctx, method, req, reply, cc, opts...)
				if lose && err == nil {
					loseNext.Store(false)
					onLose()
					return status.Error(codes.Unavailable, "response lost")
				}
				return err
			}),
			grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc,
				cc *grpc.ClientConn, method string, streamer grpc.Streamer,
				opts ...grpc.CallOption) (grpc.ClientStream, error) {
				s, err := streamer(ctx, desc, cc, method, opts...)
				if err != nil || !strings.Contains(method, "Watch") {
					return s, err
				}
				return delayedStream{ClientStream: s, delay: watchDelay}, nil
			}),
			grpc.WithDisableRetry(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	h := &harness{t: t, etcd: e, cli: cli}
	c, err := New(cli, Config{Prefix: testPrefix, DisableEndpoints: true,
		Logger: slog.New(slog.NewTextHandler(&tw{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	h.c = c
	h.lead()
	svc := sliceService("ns")
	pods := slicePods("ns", 150, 1)
	h.sliceSnapshots(1, []*kube.Service{svc}, testNodes(1, 1), pods[:50])
	h.settle()
	t.Logf("before: %v", sizes(h.slices("ns", "foo")))

	// 100 Pods appear; the write that creates their slice commits but its answer is
	// lost; meanwhile 60 of them are deleted (a rollout goes on).
	onLose = func() {
		go func() {
			var evs []Event
			for i, p := range pods[50:110] {
				evs = append(evs, Event{Type: Delete, Revision: int64(3 + i), Pod: p})
			}
			if _, err := h.c.ApplyEvents(context.Background(), evs); err != nil {
				t.Errorf("ApplyEvents: %v", err)
			}
		}()
		time.Sleep(50 * time.Millisecond)
	}
	loseNext.Store(true)
	var evs []Event
	for _, p := range pods[50:] {
		evs = append(evs, Event{Type: Upsert, Revision: 2, Pod: p})
	}
	h.events(evs...)
	time.Sleep(3 * time.Second) // the watch catches up
	watchDelay.Store(0)
	h.settle()
	time.Sleep(time.Second)
	sl := h.slices("ns", "foo")
	count := map[string]int{}
	for _, s := range sl {
		for _, e := range s.Endpoints {
			count[e.TargetRef.Name]++
		}
	}
	var twice, stale, missing int
	for i, p := range pods {
		deleted := i >= 50 && i < 110
		switch {
		case deleted && count[p.Name] > 0:
			stale++
		case !deleted && count[p.Name] == 0:
			missing++
		case count[p.Name] > 1:
			twice++
		}
	}
	t.Logf("after: slices %v; Pods in two slices: %d, deleted Pods still published: %d, missing: %d",
		sizes(sl), twice, stale, missing)
	if twice+stale+missing > 0 {
		t.Errorf("stored slices wrong after the controller went idle")
	}
}
