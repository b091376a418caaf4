// Package client is the Go client of allocd, for API-server shims: it allocates and
// releases ClusterIPs and NodePorts, keeps an API server's master lease alive, follows
// the Endpoints of the kubernetes Service, and feeds the repair loop with Service
// snapshots.
//
// A Client wraps one gRPC connection and has one method per RPC of allocd.v1
// (AllocatorService, LeaseService, RepairService). Methods take the generated request
// message, or nothing when the request has no fields, and return the generated
// response, unwrapped when it holds a single message (GetAllocation returns the
// *Allocation, Renew the *Lease).
//
// Errors are *Error values that keep the gRPC status (status.FromError works on them)
// and are tested with errors.Is and errors.As:
//
//	_, err := c.Allocate(ctx, req)
//	var held *client.AlreadyAllocatedError
//	switch {
//	case errors.As(err, &held):
//		log.Printf("%s is held by %s", held.Resource, held.Holder)
//	case errors.Is(err, client.ErrFull):
//		// the range is full
//	case errors.Is(err, client.ErrInvalid):
//		// errors.As(err, &inv) with inv *client.InvalidError lists the bad fields
//	}
//
// Unary calls are retried with exponential backoff and jitter on UNAVAILABLE only,
// within the caller's context. That is safe because allocd's writes are idempotent:
// Allocate by owner UID, Release, Renew and RemoveLease by nature (see RetryPolicy).
//
// LeaseKeeper and EndpointsWatcher run in a goroutine their caller owns and waits for:
//
//	c, err := client.New("127.0.0.1:8080")
//	if err != nil {
//		return err
//	}
//	defer c.Close()
//	g, ctx := errgroup.WithContext(ctx)
//	g.Go(func() error {
//		return client.NewLeaseKeeper(c, "192.0.2.10", 15*time.Second).Run(ctx)
//	})
//	g.Go(func() error {
//		return client.NewEndpointsWatcher(c).Watch(ctx, func(ep *allocdv1.Endpoints) {
//			// write ep to the API server's storage
//		})
//	})
//	resp, err := c.Allocate(ctx, &allocdv1.AllocateRequest{
//		Owner: &allocdv1.Owner{Namespace: "default", Name: "web", Uid: "8d1f..."},
//		NodePortCount: 1,
//	})
//
// Importing this package pulls in gRPC, protobuf and the generated allocd.v1 code, and
// nothing of etcd, Prometheus or the code generators; a test checks it.
package client
