package allocator

import (
	"context"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// raiseNoSpace raises etcd's NOSPACE alarm (writes refused, deletes taken) and
// returns the function that disarms it.
func raiseNoSpace(t *testing.T, e *etcdtest.Server) func() {
	t.Helper()
	ctx := etcdtest.Context(t)
	st, err := e.Client.Status(ctx, e.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	mc := pb.NewMaintenanceClient(e.Client.ActiveConnection())
	if _,
		err := mc.Alarm(ctx, &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: st.Header.MemberId,
		Alarm: pb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.Put(ctx, "/x", "y"); err == nil {
		t.Fatal("put accepted: the NOSPACE alarm is not raised")
	}
	return func() {
		if _, err := e.Client.AlarmDisarm(context.Background(),
			&clientv3.AlarmMember{MemberID: st.Header.MemberId,
				Alarm: pb.AlarmType_NOSPACE}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNoSpaceSeveralReleases: while etcd is out of space, every full release frees
// its owner's items, not only the first (which deletes the epoch key: the later ones
// compare its absence), and so does repair's ReleaseIf of an owner's last item;
// once space is back, allocations go on.
func TestNoSpaceSeveralReleases(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	a := start(t, e.Client, testConfig("10.0.0.0/24"))
	for _, u := range []string{"a", "b", "c"} {
		if _, err := a.Allocate(ctx, Request{Owner: owner(u), NodePortCount: 1}); err != nil {
			t.Fatal(err)
		}
	}
	res, err := a.Allocate(ctx, Request{Owner: owner("d")})
	if err != nil {
		t.Fatal(err)
	}
	last, err := a.Get(ctx, IP(res.ClusterIPs[0]))
	if err != nil {
		t.Fatal(err)
	}
	disarm := raiseNoSpace(t, e)
	for _, u := range []string{"a", "b", "c"} {
		if _, _, err := a.Release(ctx, owner(u), nil, false); err != nil {
			t.Errorf("Release(%s) under NOSPACE = %v; want its items freed", u, err)
		}
	}
	if ok, err := a.ReleaseIf(ctx, last); err != nil || !ok {
		t.Errorf("ReleaseIf(d's last item) under NOSPACE = %v, %v; want it freed", ok, err)
	}
	disarm()
	etcdtest.WaitFor(t, 10e9, "an Allocate after space is back", func() bool {
		_, err := a.Allocate(ctx, Request{Owner: owner("e"), NodePortCount: 1})
		return err == nil
	})
}

// TestStartRetryAfterCheckpointLoad: New's start tried again after a passing failure
// that followed a load from a checkpoint (reserveKubernetes failing in an election,
// say) leaves the index equal to the list, and so does the next checkpoint, which a
// third replica loads.
func TestStartRetryAfterCheckpointLoad(t *testing.T) {
	e := etcdtest.New(t)
	ctx := etcdtest.Context(t)
	cfg := testConfig("10.0.0.0/22")
	other, err := New(ctx, e.Client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runWith(t, other, func(a *Allocator) { a.cp.ch = nil })
	churn(t, other, "a", 30)
	writer(t, e, cfg)()
	churn(t, other, "b", 30) // changes after the checkpoint
	got, err := New(ctx, e.NewClient(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got.idx.loadedFrom != "checkpoint" {
		t.Fatalf("loaded from %s", got.idx.loadedFrom)
	}
	checkEqualsList(t, got)
	// What New's loop does after a transient error of a step after load.
	if err := got.start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("after the second start: index at %d", got.idx.progress.Rev())
	checkEqualsList(t, got)
	// The wrong index goes into the next checkpoint, and a third replica loads it.
	runWith(t, got, func(a *Allocator) { a.cp.every, a.cp.minGap, a.cp.maxAge = 1, 0, time.Millisecond })
	if _, err := got.Allocate(ctx, Request{Owner: owner("z")}); err != nil {
		t.Fatal(err)
	}
	// Until Run's watch runs, Sync gives up at once (a CI run under load was that quick).
	etcdtest.WaitFor(t, 10*time.Second, "the index to reach the Allocate",
		func() bool { return got.Sync(ctx) == nil })
	at := got.idx.progress.Rev()
	etcdtest.WaitFor(t, 10*time.Second, "a checkpoint", func() bool {
		r, err := got.cp.revision(ctx)
		return err == nil && r >= at
	})
	third, err := New(ctx, e.NewClient(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("third replica loaded from %s", third.idx.loadedFrom)
	checkEqualsList(t, third)
}
