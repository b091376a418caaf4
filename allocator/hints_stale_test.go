package allocator

import (
	"testing"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// TestStaleHintCostsAConflict: replica 1's hint of an owner lists 64 items; the owner
// releases two through replica 2. An Allocate of one more through replica 1 must
// succeed (the owner holds 62): the stale hint may cost a conflict, never an error.
func TestStaleHintCostsAConflict(t *testing.T) {
	e := etcdtest.New(t)
	cfg := testConfig("10.0.0.0/24")
	a1 := start(t, e.Client, cfg)
	a2 := start(t, e.NewClient(), cfg)
	ctx := etcdtest.Context(t)
	o := owner("big")
	res, err := a1.Allocate(ctx, Request{Owner: o, NoClusterIP: true, NodePortCount: MaxItems})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := a2.Release(ctx, o, []Item{Port(res.NodePorts[0]), Port(res.NodePorts[1])},
		false); err != nil {
		t.Fatal(err)
	}
	got, err := a1.Allocate(ctx, Request{Owner: o, NoClusterIP: true, NodePortCount: 1})
	if err != nil || len(got.NodePorts) != 1 {
		t.Fatalf("replica 1: Allocate(1 more port) after 2 were released elsewhere = %v, %v; want one port",
			got, err)
	}
	// And the limit still holds with the real record: 63 held, 2 more is 65.
	if _, err := a1.Allocate(ctx, Request{Owner: o, NoClusterIP: true, NodePortCount: 2}); err == nil {
		t.Errorf("Allocate(2 more) with 63 held = nil; want the %d-item limit", MaxItems)
	}
}
