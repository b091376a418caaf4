package client_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/cmd/allocd/daemon"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// TestServiceCIDRs drives the ServiceCIDR methods and their errors against a real
// allocd: a full /29, a CIDR added, allocation from it, the /29 drained.
func TestServiceCIDRs(t *testing.T) {
	d := daemon.StartForTest(t, func(c *daemon.Config) { c.ServiceClusterIPRange = "10.96.0.0/29" })
	c := newClient(t, d.GRPCAddr())
	ctx := etcdtest.Context(t)

	for i := range 5 { // 6 usable addresses, one of them the kubernetes Service's
		if _, err := c.Allocate(ctx,
			&allocdv1.AllocateRequest{Owner: owner(string(rune('a' + i)))}); err != nil {
			t.Fatalf("Allocate %d = %v", i, err)
		}
	}
	_, err := c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: owner("full")})
	var full *client.FullError
	if !errors.Is(err, client.ErrFull) || !errors.As(err, &full) || len(full.Violations) != 1 ||
		!strings.Contains(full.Violations[0].Description, "CreateServiceCIDR") {
		t.Fatalf("Allocate on a full /29 = %v; want ErrFull whose violation says to CreateServiceCIDR", err)
	}

	if _, err := c.CreateServiceCIDR(ctx, "Bad Name", "10.97.0.0/24"); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("CreateServiceCIDR(bad name) = %v; want ErrInvalid", err)
	}
	if _, err := c.CreateServiceCIDR(ctx, "kubernetes", "10.97.0.0/24"); !errors.Is(err,
		client.ErrAlreadyExists) {
		t.Errorf("CreateServiceCIDR(kubernetes) = %v; want ErrAlreadyExists", err)
	}
	sc, err := c.CreateServiceCIDR(ctx, "extra", "10.97.0.0/24")
	if err != nil || sc.GetState() != allocdv1.ServiceCIDRState_SERVICE_CIDR_STATE_READY {
		t.Fatalf("CreateServiceCIDR(extra) = %v, %v; want ready", sc, err)
	}
	res, err := c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: owner("full")})
	if err != nil || !strings.HasPrefix(res.GetClusterIps()[0], "10.97.0.") {
		t.Fatalf("Allocate after CreateServiceCIDR = %v, %v; want an address of 10.97.0.0/24", res, err)
	}

	if _, err := c.DeleteServiceCIDR(ctx, "nope"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("DeleteServiceCIDR(nope) = %v; want ErrNotFound", err)
	}
	if sc, err = c.DeleteServiceCIDR(ctx, "kubernetes"); err != nil ||
		sc.GetState() != allocdv1.ServiceCIDRState_SERVICE_CIDR_STATE_TERMINATING {
		t.Fatalf("DeleteServiceCIDR(kubernetes) = %v, %v; want terminating", sc, err)
	}
	_, err = c.Allocate(ctx,
		&allocdv1.AllocateRequest{Owner: owner("late"), ClusterIps: []string{"10.96.0.6"}})
	if !errors.Is(err, client.ErrTerminating) && !errors.Is(err, client.ErrAlreadyAllocated) {
		t.Errorf("Allocate(10.96.0.6) in a terminating CIDR = %v; want ErrTerminating", err)
	}
	sc, err = c.GetServiceCIDR(ctx, "kubernetes")
	if err != nil || sc.GetBlockingAllocations() != 6 || len(sc.GetBlockingSample()) != 6 {
		t.Errorf("GetServiceCIDR(kubernetes) = %v, %v; want 6 blocking allocations listed", sc, err)
	}
	list, err := c.ListServiceCIDRs(ctx)
	if err != nil || len(list) != 2 {
		t.Errorf("ListServiceCIDRs() = %v, %v; want kubernetes and extra", list, err)
	}
	ranges, err := c.ListRanges(ctx)
	if err != nil || len(ranges) != 3 || ranges[0].GetName() != "10.97.0.0/24" ||
		ranges[1].GetState() != allocdv1.ServiceCIDRState_SERVICE_CIDR_STATE_TERMINATING {
		t.Errorf("ListRanges() = %v, %v; want the ready /24, then the terminating /29, then the node ports",
			ranges, err)
	}
}
