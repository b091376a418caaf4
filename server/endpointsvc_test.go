package server

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// TestPushEventsMalformedMessage: a stream whose second message is malformed is refused
// with INVALID_ARGUMENT, and the first message is applied (on the leader, and through a
// replica that forwards), as PushEvents' comment promises: a sender that trusts it and
// pushes only the refused message again loses nothing.
func TestPushEventsMalformedMessage(t *testing.T) {
	e := etcdtest.New(t)
	ld := startFeedNode(t, e.Client)
	etcdtest.WaitFor(t, 10*time.Second, "a leader", ld.leads)
	via := startFeedNode(t, e.NewClient())
	ctx := etcdtest.Context(t)
	if _, err := push(ctx, ld.repair, []int64{7}, []*allocdv1.Service{webService()}); err != nil {
		t.Fatalf("PushServiceSnapshot = %v", err)
	}
	pods, err := ld.eps.PushPodSnapshot(ctx)
	if err == nil {
		err = pods.Send(&allocdv1.PushPodSnapshotRequest{Snapshot: &allocdv1.PodSnapshot{Revision: 7,
			Pods: []*allocdv1.Pod{webPod(0, true)}}})
	}
	if err == nil {
		_, err = pods.CloseAndRecv()
	}
	if err != nil {
		t.Fatalf("PushPodSnapshot = %v", err)
	}
	nodes, err := ld.eps.PushNodeSnapshot(ctx)
	if err == nil {
		err = nodes.Send(&allocdv1.PushNodeSnapshotRequest{Snapshot: &allocdv1.NodeSnapshot{Revision: 7}})
	}
	if err == nil {
		_, err = nodes.CloseAndRecv()
	}
	if err != nil {
		t.Fatalf("PushNodeSnapshot = %v", err)
	}
	bad := webPod(1, true)
	bad.PodIps = []string{"10.0.0.x"}
	rev := int64(7)
	for _, n := range []*feedNode{ld, via} {
		rev++
		good := &allocdv1.PushEventsRequest{Revision: rev,
			Events: []*allocdv1.Event{podUpsert(webPod(0, rev%2 == 1))}}
		malformed := &allocdv1.PushEventsRequest{Revision: rev + 1, Events: []*allocdv1.Event{podUpsert(bad)}}
		err := pushEvents(ctx, n.eps, good, malformed)
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("PushEvents(a good message, a malformed one) to %s = %v; want INVALID_ARGUMENT",
				n.addr, err)
		}
		hb, err := ld.eps.PushEvents(ctx)
		var resp *allocdv1.PushEventsResponse
		if err == nil {
			resp, err = hb.CloseAndRecv()
		}
		if err != nil || resp.GetPodRevision() != rev {
			t.Fatalf("Pod revision after the refused stream to %s = %d, %v; want %d (the message before "+
				"the malformed one applied)", n.addr, resp.GetPodRevision(), err, rev)
		}
		rev++ // the refused message's revision is spent
	}
}

// pushEvents sends msgs on one PushEvents stream and returns how it ended.
func pushEvents(ctx context.Context, c allocdv1.EndpointsServiceClient,
	msgs ...*allocdv1.PushEventsRequest) error {
	st, err := c.PushEvents(ctx)
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if err := st.Send(m); err != nil {
			break // the server ended the stream; CloseAndRecv returns why
		}
	}
	_, err = st.CloseAndRecv()
	return err
}

func podUpsert(p *allocdv1.Pod) *allocdv1.Event {
	return &allocdv1.Event{Type: allocdv1.EventType_EVENT_TYPE_UPSERT, Object: &allocdv1.Event_Pod{Pod: p}}
}
