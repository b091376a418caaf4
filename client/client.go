package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// DefaultSnapshotChunkSize is the number of Services PushServiceSnapshot sends per
// stream message unless WithSnapshotChunkSize says otherwise.
const DefaultSnapshotChunkSize = 5000

// Client calls allocd's AllocatorService, LeaseService, RepairService and
// EndpointsService over one gRPC
// connection. It is safe for concurrent use. Its methods take and return the generated
// allocd.v1 messages; their errors are *Error values that errors.Is matches against
// ErrFull, ErrAlreadyAllocated, ErrInvalid and the other sentinels of this package.
// Unary calls are retried on UNAVAILABLE as RetryPolicy describes.
type Client struct {
	conn   *grpc.ClientConn
	alloc  allocdv1.AllocatorServiceClient
	lease  allocdv1.LeaseServiceClient
	repair allocdv1.RepairServiceClient
	eps    allocdv1.EndpointsServiceClient
	retry  RetryPolicy
	chunk  int
}

// Option configures New.
type Option func(*options)

type options struct {
	tls   *tls.Config
	dial  []grpc.DialOption
	retry RetryPolicy
	chunk int
}

// WithTLS makes the client use TLS with cfg. Without it the connection is plaintext
// (allocd listens on loopback by default). For certificates read from files and read
// again when they are rotated, pass tlsfiles.Client's DialOption to WithDialOptions
// instead (package tlsfiles; not imported here, so that a shim that does not use it
// does not build grpc-go's certificate providers).
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) { o.tls = cfg }
}

// WithDialOptions adds gRPC dial options, applied after the client's own (so they win:
// grpc.WithConnectParams replaces the default reconnect backoff, for example).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dial = append(o.dial, opts...) }
}

// WithRetry sets the retry policy of unary calls; zero fields keep the defaults of
// DefaultRetryPolicy. WithRetry(RetryPolicy{MaxAttempts: 1}) disables retries.
func WithRetry(p RetryPolicy) Option {
	return func(o *options) { o.retry = p }
}

// WithSnapshotChunkSize sets how many Services PushServiceSnapshot sends per stream
// message (default DefaultSnapshotChunkSize).
func WithSnapshotChunkSize(n int) Option {
	return func(o *options) { o.chunk = n }
}

// connectParams is the reconnect backoff of the client's connection. gRPC's default
// grows to 120 s between tries, far longer than a shim should stay cut off from a
// restarted allocd; this one is capped at 5 s.
var connectParams = grpc.ConnectParams{
	Backoff: backoff.Config{
		BaseDelay:  200 * time.Millisecond,
		Multiplier: 1.6,
		Jitter:     0.2,
		MaxDelay:   5 * time.Second,
	},
	MinConnectTimeout: 5 * time.Second,
}

// New returns a Client for the allocd at target, a gRPC target such as
// "127.0.0.1:8080" or "dns:///allocd.example:8080". Like grpc.NewClient it does not
// connect: the first call does, and a server that is not up yet is retried (see
// RetryPolicy). Close releases the connection.
func New(target string, opts ...Option) (*Client, error) {
	o := options{chunk: DefaultSnapshotChunkSize}
	for _, opt := range opts {
		opt(&o)
	}
	if o.chunk <= 0 {
		return nil, fmt.Errorf("client: snapshot chunk size %d: must be positive", o.chunk)
	}
	creds := insecure.NewCredentials()
	if o.tls != nil {
		creds = credentials.NewTLS(o.tls)
	}
	dial := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(connectParams),
		// The client retries by itself (RetryPolicy), and tells from grpc.Peer whether an
		// attempt reached allocd: a retry policy from a service config (a DNS TXT record
		// can carry one) would hide an earlier attempt that did. gRPC's transparent
		// retries, of attempts that never reached the server, still happen.
		grpc.WithDisableRetry(),
	}, o.dial...)
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return &Client{
		conn:   conn,
		alloc:  allocdv1.NewAllocatorServiceClient(conn),
		lease:  allocdv1.NewLeaseServiceClient(conn),
		repair: allocdv1.NewRepairServiceClient(conn),
		eps:    allocdv1.NewEndpointsServiceClient(conn),
		retry:  o.retry.withDefaults(),
		chunk:  o.chunk,
	}, nil
}

// Close closes the connection. Calls in flight fail with CANCELED.
func (c *Client) Close() error { return c.conn.Close() }

// Conn returns the underlying connection, for services this package does not wrap
// (grpc.health.v1, say). It is closed by Close.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// unary runs one unary RPC with retries and maps its error.
func unary[Req, Resp any](ctx context.Context, c *Client, method string, req Req,
	rpc func(context.Context, Req, ...grpc.CallOption) (Resp, error)) (Resp, error) {
	var resp Resp
	mayHaveApplied := false // some failed attempt may have taken effect
	err := c.retry.do(ctx, func(ctx context.Context) error {
		var p peer.Peer
		var err error
		if resp, err = rpc(ctx, req, grpc.Peer(&p)); err != nil && p.Addr == nil {
			err = &notSentError{err: err} // no stream was made: allocd never saw it
		}
		if OutcomeUnknown(mapError(method, err)) {
			mayHaveApplied = true
		}
		return err
	})
	if err != nil {
		var zero Resp
		err = mapError(method, err)
		if e := (*Error)(nil); mayHaveApplied && errors.As(err, &e) {
			// The last attempt may have changed nothing; an earlier one may have.
			e.NotApplied, e.MayHaveApplied = false, true
		}
		return zero, err
	}
	return resp, nil
}

// Allocate allocates ClusterIPs and NodePorts for one owner, all or nothing, and
// returns them with the etcd revision of the allocation. It is idempotent by owner UID:
// retrying the same request for the same owner returns the same result (Replayed set),
// which is why it is retried on UNAVAILABLE. Errors: ErrInvalid (*InvalidError),
// ErrAlreadyAllocated (*AlreadyAllocatedError naming the holder), ErrFull, ErrAborted,
// ErrUnavailable.
func (c *Client) Allocate(ctx context.Context,
	req *allocdv1.AllocateRequest) (*allocdv1.AllocateResponse, error) {
	return unary(ctx, c, allocdv1.AllocatorService_Allocate_FullMethodName, req, c.alloc.Allocate)
}

// Release frees the given ClusterIPs and NodePorts of an owner, or all of its
// allocations when both lists are empty. Freeing what is free is not an error;
// freeing what another owner holds is ErrNotOwner unless Force is set. With Force it
// calls ForceRelease, the RPC an authorization policy grants apart from Release (an
// allocd older than ForceRelease gets Release with force).
func (c *Client) Release(ctx context.Context,
	req *allocdv1.ReleaseRequest) (*allocdv1.ReleaseResponse, error) {
	if !req.GetForce() {
		return unary(ctx, c, allocdv1.AllocatorService_Release_FullMethodName, req, c.alloc.Release)
	}
	resp, err := unary(ctx, c, allocdv1.AllocatorService_ForceRelease_FullMethodName,
		&allocdv1.ForceReleaseRequest{Owner: req.GetOwner(), ClusterIps: req.GetClusterIps(),
			NodePorts: req.GetNodePorts()},
		c.alloc.ForceRelease)
	if errors.Is(err, ErrUnimplemented) {
		rresp, rerr := unary(ctx, c, allocdv1.AllocatorService_Release_FullMethodName, req, c.alloc.Release)
		var first, last *Error
		if errors.As(err, &first) && first.MayHaveApplied && errors.As(rerr, &last) {
			last.NotApplied, last.MayHaveApplied = false, true // an attempt of ForceRelease may have
		}
		return rresp, rerr
	}
	if err != nil {
		return nil, err
	}
	return &allocdv1.ReleaseResponse{ReleasedClusterIps: resp.GetReleasedClusterIps(),
		ReleasedNodePorts: resp.GetReleasedNodePorts(), Revision: resp.GetRevision()}, nil
}

// Transfer moves ClusterIPs and NodePorts from one owner to another in one transaction
// (all of From's when both lists are empty): there is no moment at which an item is free
// or held by two owners. An item To holds already is left as it is, so the call is
// idempotent and retried on UNAVAILABLE like Release: a retry after a transfer committed
// moves nothing and succeeds (Revision 0). An item named that From does not hold, free
// or another owner's, is ErrNotOwner (Error.Metadata: "holder_uid", and "free" "true"
// when nobody holds it), and nothing moves. Errors: ErrInvalid (*InvalidError; From
// equal to To among them), ErrNotOwner, ErrAborted, ErrUnavailable, ErrNoSpace.
func (c *Client) Transfer(ctx context.Context,
	req *allocdv1.TransferRequest) (*allocdv1.TransferResponse, error) {
	return unary(ctx, c, allocdv1.AllocatorService_Transfer_FullMethodName, req, c.alloc.Transfer)
}

// GetAllocation tells who holds one ClusterIP or NodePort; ErrNotFound when it is free.
func (c *Client) GetAllocation(ctx context.Context,
	req *allocdv1.GetAllocationRequest) (*allocdv1.Allocation, error) {
	resp, err := unary(ctx, c, allocdv1.AllocatorService_GetAllocation_FullMethodName, req,
		c.alloc.GetAllocation)
	return resp.GetAllocation(), err
}

// ListAllocations returns one page of allocations; pass NextPageToken back as
// PageToken for the next one.
func (c *Client) ListAllocations(ctx context.Context,
	req *allocdv1.ListAllocationsRequest) (*allocdv1.ListAllocationsResponse, error) {
	return unary(ctx, c, allocdv1.AllocatorService_ListAllocations_FullMethodName, req,
		c.alloc.ListAllocations)
}

// CreateServiceCIDR adds a ServiceCIDR of one or two CIDRs (at most one per family).
// Errors: ErrInvalid (*InvalidError names the field), ErrAlreadyExists. A call retried
// after an UNAVAILABLE whose first attempt committed answers ErrAlreadyExists: Get it
// to see whether it is yours.
func (c *Client) CreateServiceCIDR(ctx context.Context, name string,
	cidrs ...string) (*allocdv1.ServiceCIDR, error) {
	resp, err := unary(ctx, c, allocdv1.AllocatorService_CreateServiceCIDR_FullMethodName,
		&allocdv1.CreateServiceCIDRRequest{Name: name, Cidrs: cidrs}, c.alloc.CreateServiceCIDR)
	return resp.GetServiceCidr(), err
}

// GetServiceCIDR returns a ServiceCIDR, with what blocks its removal while it is
// terminating. ErrNotFound when there is none of that name (or it was removed).
func (c *Client) GetServiceCIDR(ctx context.Context, name string) (*allocdv1.ServiceCIDR, error) {
	resp, err := unary(ctx, c, allocdv1.AllocatorService_GetServiceCIDR_FullMethodName,
		&allocdv1.GetServiceCIDRRequest{Name: name}, c.alloc.GetServiceCIDR)
	return resp.GetServiceCidr(), err
}

// ListServiceCIDRs returns every ServiceCIDR, by name.
func (c *Client) ListServiceCIDRs(ctx context.Context) ([]*allocdv1.ServiceCIDR, error) {
	resp, err := unary(ctx, c, allocdv1.AllocatorService_ListServiceCIDRs_FullMethodName,
		&allocdv1.ListServiceCIDRsRequest{}, c.alloc.ListServiceCIDRs)
	return resp.GetServiceCidrs(), err
}

// DeleteServiceCIDR marks a ServiceCIDR terminating: nothing new is allocated from it
// once it returns, and it is removed when no allocated address lies in it alone.
// ErrNotFound when there is none of that name.
func (c *Client) DeleteServiceCIDR(ctx context.Context, name string) (*allocdv1.ServiceCIDR, error) {
	resp, err := unary(ctx, c, allocdv1.AllocatorService_DeleteServiceCIDR_FullMethodName,
		&allocdv1.DeleteServiceCIDRRequest{Name: name}, c.alloc.DeleteServiceCIDR)
	return resp.GetServiceCidr(), err
}

// ListRanges returns the ranges with their usage: the ClusterIP ranges of the
// ServiceCIDRs (ready ones in allocation order, then terminating ones), then the
// NodePort range.
func (c *Client) ListRanges(ctx context.Context) ([]*allocdv1.Range, error) {
	resp, err := unary(ctx, c, allocdv1.AllocatorService_ListRanges_FullMethodName,
		&allocdv1.ListRangesRequest{}, c.alloc.ListRanges)
	return resp.GetRanges(), err
}

// Renew creates or refreshes the master lease of one API server's IP. A TtlSeconds of
// 0 means the server's --master-lease-ttl. LeaseKeeper calls it on a schedule.
func (c *Client) Renew(ctx context.Context, req *allocdv1.RenewRequest) (*allocdv1.Lease, error) {
	resp, err := unary(ctx, c, allocdv1.LeaseService_Renew_FullMethodName, req, c.lease.Renew)
	return resp.GetLease(), err
}

// ListLeases returns the live master leases sorted by address.
func (c *Client) ListLeases(ctx context.Context) (*allocdv1.ListLeasesResponse, error) {
	return unary(ctx, c, allocdv1.LeaseService_ListLeases_FullMethodName, &allocdv1.ListLeasesRequest{},
		c.lease.ListLeases)
}

// RemoveLease deletes the master lease of req.Ip, for an API server that shuts down
// cleanly. Removing an absent lease is not an error (Removed is false).
func (c *Client) RemoveLease(ctx context.Context,
	req *allocdv1.RemoveLeaseRequest) (*allocdv1.RemoveLeaseResponse, error) {
	return unary(ctx, c, allocdv1.LeaseService_RemoveLease_FullMethodName, req, c.lease.RemoveLease)
}

// GetEndpoints returns the Endpoints of the kubernetes Service derived from the leases.
func (c *Client) GetEndpoints(ctx context.Context) (*allocdv1.Endpoints, error) {
	resp, err := unary(ctx, c, allocdv1.LeaseService_GetEndpoints_FullMethodName,
		&allocdv1.GetEndpointsRequest{}, c.lease.GetEndpoints)
	return resp.GetEndpoints(), err
}

// WatchEndpoints opens one WatchEndpoints stream and calls fn with each state it
// receives (the current one first), in order, from the calling goroutine. It returns
// fn's error if fn fails, ctx's error when ctx ends, and otherwise the error that broke
// the stream (a stream that the server ends cleanly is ErrUnavailable). It neither
// retries nor suppresses repeated states: EndpointsWatcher does both.
func (c *Client) WatchEndpoints(ctx context.Context, fn func(*allocdv1.Endpoints) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	const method = allocdv1.LeaseService_WatchEndpoints_FullMethodName
	stream, err := c.lease.WatchEndpoints(ctx, &allocdv1.WatchEndpointsRequest{})
	if err != nil {
		return watchEnd(ctx, mapError(method, err))
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return watchEnd(ctx,
				fmt.Errorf("client: endpoints stream ended by the server: %w", ErrUnavailable))
		}
		if err != nil {
			return watchEnd(ctx, mapError(method, err))
		}
		if err := fn(msg.GetEndpoints()); err != nil {
			return err
		}
	}
}

// watchEnd prefers the context's error, so that a caller that canceled sees why.
func watchEnd(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// PushServiceSnapshot sends the full list of Services of the caller's store at
// snap.Revision, as one client stream of chunks of the chunk size (every chunk with the
// same revision; an empty snapshot is one empty chunk). allocd takes the snapshot when
// the stream closes. A snapshot older than the last one accepted is ErrStaleSnapshot.
// The whole stream is retried on UNAVAILABLE: pushing the same revision again is
// harmless.
func (c *Client) PushServiceSnapshot(ctx context.Context,
	snap *allocdv1.ServiceSnapshot) (*allocdv1.PushServiceSnapshotResponse, error) {
	var resp *allocdv1.PushServiceSnapshotResponse
	err := c.retry.do(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.pushOnce(ctx, snap)
		return err
	})
	if err != nil {
		return nil, mapError(allocdv1.RepairService_PushServiceSnapshot_FullMethodName, err)
	}
	return resp, nil
}

// pushOnce sends snap over one stream.
func (c *Client) pushOnce(ctx context.Context,
	snap *allocdv1.ServiceSnapshot) (*allocdv1.PushServiceSnapshotResponse, error) {
	return pushChunks(ctx, c.chunk, snap.GetServices(), c.repair.PushServiceSnapshot,
		func(svcs []*allocdv1.Service) *allocdv1.PushServiceSnapshotRequest {
			return &allocdv1.PushServiceSnapshotRequest{
				Snapshot: &allocdv1.ServiceSnapshot{Revision: snap.GetRevision(), Services: svcs}}
		})
}

// RunRepair runs a repair pass now on the repair leader and returns its report.
// DryRun reports without writing.
func (c *Client) RunRepair(ctx context.Context,
	req *allocdv1.RunRepairRequest) (*allocdv1.RepairReport, error) {
	resp, err := unary(ctx, c, allocdv1.RepairService_RunRepair_FullMethodName, req, c.repair.RunRepair)
	return resp.GetReport(), err
}

// GetRepairStatus returns the last repair report, the leak candidates with their
// strikes left, the repair leader and the last snapshot revision accepted.
func (c *Client) GetRepairStatus(ctx context.Context) (*allocdv1.GetRepairStatusResponse, error) {
	return unary(ctx, c, allocdv1.RepairService_GetRepairStatus_FullMethodName,
		&allocdv1.GetRepairStatusRequest{}, c.repair.GetRepairStatus)
}
