package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// A shim allocates a ClusterIP and a NodePort for a Service, and releases them when the
// Service is deleted.
func ExampleClient_Allocate() {
	addr := startAllocd() // the address of a running allocd, e.g. "127.0.0.1:8080"
	ctx := context.Background()

	c, err := client.New(addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	web := &allocdv1.Owner{Namespace: "default", Name: "web", Uid: "6f1d0b5e-web"}
	resp, err := c.Allocate(ctx, &allocdv1.AllocateRequest{
		Owner:      web,
		ClusterIps: []string{"10.96.0.10"},
		NodePorts:  []int32{30080},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("allocated", resp.GetClusterIps(), resp.GetNodePorts())

	// Allocate is idempotent by owner UID: a retry gets the same answer.
	resp, err = c.Allocate(ctx, &allocdv1.AllocateRequest{
		Owner:      web,
		ClusterIps: []string{"10.96.0.10"},
		NodePorts:  []int32{30080},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("retried", resp.GetClusterIps(), resp.GetNodePorts(), "replayed:", resp.GetReplayed())

	al, err := c.GetAllocation(ctx, &allocdv1.GetAllocationRequest{
		Target: &allocdv1.GetAllocationRequest_NodePort{NodePort: 30080},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("30080 is held by", al.GetOwner().GetNamespace()+"/"+al.GetOwner().GetName())

	// Release with no addresses or ports frees all of the owner's allocations.
	rel, err := c.Release(ctx, &allocdv1.ReleaseRequest{Owner: web})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("released", rel.GetReleasedClusterIps(), rel.GetReleasedNodePorts())

	_, err = c.GetAllocation(ctx, &allocdv1.GetAllocationRequest{
		Target: &allocdv1.GetAllocationRequest_ClusterIp{ClusterIp: "10.96.0.10"},
	})
	fmt.Println("10.96.0.10 is free:", errors.Is(err, client.ErrNotFound))
	// Output:
	// allocated [10.96.0.10] [30080]
	// retried [10.96.0.10] [30080] replayed: true
	// 30080 is held by default/web
	// released [10.96.0.10] [30080]
	// 10.96.0.10 is free: true
}

// Errors are tested with errors.Is and errors.As; the typed errors carry the
// google.rpc details of the status.
func ExampleAlreadyAllocatedError() {
	addr := startAllocd()
	ctx := context.Background()
	c, err := client.New(addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	a := &allocdv1.Owner{Namespace: "default", Name: "a", Uid: "uid-a"}
	b := &allocdv1.Owner{Namespace: "default", Name: "b", Uid: "uid-b"}
	if _, err := c.Allocate(ctx,
		&allocdv1.AllocateRequest{Owner: a, ClusterIps: []string{"10.96.0.20"}}); err != nil {
		log.Fatal(err)
	}

	_, err = c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: b, ClusterIps: []string{"10.96.0.20"}})
	var held *client.AlreadyAllocatedError
	if errors.As(err, &held) {
		fmt.Println(held.Resource, "is held:", errors.Is(err, client.ErrAlreadyAllocated))
	}

	_, err = c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: b, ClusterIps: []string{"192.168.0.1"}})
	var inv *client.InvalidError
	if errors.As(err, &inv) {
		fmt.Println("invalid:", errors.Is(err, client.ErrInvalid), len(inv.Violations) > 0)
	}

	_, err = c.Release(ctx, &allocdv1.ReleaseRequest{Owner: b, ClusterIps: []string{"10.96.0.20"}})
	fmt.Println("not owner:", errors.Is(err, client.ErrNotOwner))
	// Output:
	// 10.96.0.20 is held: true
	// invalid: true true
	// not owner: true
}

// An API server keeps its master lease while it runs, and removes it when it stops,
// so that it leaves the kubernetes Endpoints at once.
func ExampleLeaseKeeper() {
	addr := startAllocd()
	c, err := client.New(addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx, stop := context.WithCancel(context.Background())
	renewed := make(chan *allocdv1.Lease, 1)
	keeper := client.NewLeaseKeeper(c, "192.0.2.10", 3*time.Second,
		client.WithRenewed(func(l *allocdv1.Lease) {
			select {
			case renewed <- l:
			default:
			}
		}),
		client.WithRenewErrors(func(err error) { log.Print(err) }))
	done := make(chan error)
	go func() { done <- keeper.Run(ctx) }() // Run renews every TTL/3 until ctx ends

	l := <-renewed
	fmt.Println("renewed", l.GetIp(), "for", l.GetTtlSeconds(), "seconds")
	printLeases(c)

	stop()                                 // the API server shuts down
	fmt.Println("stopped:", <-done == nil) // the lease is removed before Run returns
	printLeases(c)
	// Output:
	// renewed 192.0.2.10 for 3 seconds
	// leases: [192.0.2.10]
	// stopped: true
	// leases: []
}

func printLeases(c *client.Client) {
	resp, err := c.ListLeases(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	ips := []string{}
	for _, l := range resp.GetLeases() {
		ips = append(ips, l.GetIp())
	}
	fmt.Println("leases:", ips)
}

// A shim follows the Endpoints of the kubernetes Service and writes each new state to
// its storage.
func ExampleEndpointsWatcher() {
	addr := startAllocd()
	c, err := client.New(addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	states := make(chan *allocdv1.Endpoints)
	go func() {
		// Watch delivers the current state, then each change, never the same state
		// twice in a row; it reconnects when the stream breaks and returns when ctx ends.
		_ = client.NewEndpointsWatcher(c).Watch(ctx, func(ep *allocdv1.Endpoints) { states <- ep })
	}()
	show := func(ep *allocdv1.Endpoints) {
		for _, s := range ep.GetSubsets() {
			fmt.Println(ep.GetNamespace()+"/"+ep.GetName(), s.GetAddresses(), "port",
				s.GetPorts()[0].GetPort())
		}
	}

	// The current state comes first: no API server has a lease yet.
	fmt.Println("subsets:", len((<-states).GetSubsets()))

	// Then one state per change.
	for _, ip := range []string{"192.0.2.21", "192.0.2.22"} {
		if _, err := c.Renew(ctx, &allocdv1.RenewRequest{Ip: ip, TtlSeconds: 60}); err != nil {
			log.Fatal(err)
		}
		show(<-states)
	}
	if _, err := c.RemoveLease(ctx, &allocdv1.RemoveLeaseRequest{Ip: "192.0.2.21"}); err != nil {
		log.Fatal(err)
	}
	show(<-states)
	// Output:
	// subsets: 0
	// default/kubernetes [192.0.2.21] port 6443
	// default/kubernetes [192.0.2.21 192.0.2.22] port 6443
	// default/kubernetes [192.0.2.22] port 6443
}
