package client

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// PushPodSnapshot sends the full list of Pods of the caller's store at snap.Revision,
// as one client stream of chunks (every chunk with the same revision; an empty
// snapshot is one empty chunk). The leader applies it when the stream closes, whole or
// not at all. A malformed Pod is ErrInvalid naming the field; a snapshot older than
// the one the leader applied in its term is ErrStaleSnapshot. The whole stream is
// retried on UNAVAILABLE: pushing the same revision again is harmless.
func (c *Client) PushPodSnapshot(ctx context.Context,
	snap *allocdv1.PodSnapshot) (*allocdv1.PushPodSnapshotResponse, error) {
	var resp *allocdv1.PushPodSnapshotResponse
	err := c.retry.do(ctx, func(ctx context.Context) error {
		var err error
		resp, err = pushChunks(ctx, c.chunk, snap.GetPods(), c.eps.PushPodSnapshot,
			func(pods []*allocdv1.Pod) *allocdv1.PushPodSnapshotRequest {
				return &allocdv1.PushPodSnapshotRequest{
					Snapshot: &allocdv1.PodSnapshot{Revision: snap.GetRevision(), Pods: pods}}
			})
		return err
	})
	if err != nil {
		return nil, mapError(allocdv1.EndpointsService_PushPodSnapshot_FullMethodName, err)
	}
	return resp, nil
}

// PushNodeSnapshot pushes a Node snapshot (the EndpointSlice controller's zones and
// topology hints), in chunks like PushPodSnapshot.
func (c *Client) PushNodeSnapshot(ctx context.Context,
	snap *allocdv1.NodeSnapshot) (*allocdv1.PushNodeSnapshotResponse, error) {
	var resp *allocdv1.PushNodeSnapshotResponse
	err := c.retry.do(ctx, func(ctx context.Context) error {
		var err error
		resp, err = pushChunks(ctx, c.chunk, snap.GetNodes(), c.eps.PushNodeSnapshot,
			func(nodes []*allocdv1.Node) *allocdv1.PushNodeSnapshotRequest {
				return &allocdv1.PushNodeSnapshotRequest{
					Snapshot: &allocdv1.NodeSnapshot{Revision: snap.GetRevision(), Nodes: nodes}}
			})
		return err
	})
	if err != nil {
		return nil, mapError(allocdv1.EndpointsService_PushNodeSnapshot_FullMethodName, err)
	}
	return resp, nil
}

// pushChunks sends items over one client stream opened by open, n at a time, each
// chunk wrapped by msg (at least one chunk, empty for no item), and returns the
// answer.
func pushChunks[T, Req, Resp any](ctx context.Context, n int, items []T,
	open func(context.Context, ...grpc.CallOption) (grpc.ClientStreamingClient[Req, Resp], error),
	msg func([]T) *Req) (*Resp, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream if a Send fails
	stream, err := open(ctx)
	if err != nil {
		return nil, err
	}
	for first := true; first || len(items) > 0; first = false {
		k := min(n, len(items))
		err := stream.Send(msg(items[:k]))
		if errors.Is(err, io.EOF) {
			break // the server ended the stream; its status comes from CloseAndRecv
		}
		if err != nil {
			return nil, err
		}
		items = items[k:]
	}
	return stream.CloseAndRecv()
}

// PushEvents sends batches of Service, Pod and Node events over one stream; the leader
// applies them in order, ignoring what is not newer than what it applied. It is
// ErrSnapshotRequired when the leader has no snapshot of an event's kind in its
// current term (push snapshots, then the events again), ErrInvalid (naming the field)
// for a malformed event, whose message is not applied (the batches before it are, those
// after it are not: push them again). It is retried on UNAVAILABLE:
// replayed events are ignored. With no batch it is a heartbeat, which answers
// ErrSnapshotRequired while the leader lacks snapshots.
func (c *Client) PushEvents(ctx context.Context,
	batches ...*allocdv1.PushEventsRequest) (*allocdv1.PushEventsResponse, error) {
	var resp *allocdv1.PushEventsResponse
	err := c.retry.do(ctx, func(ctx context.Context) error {
		var err error
		resp, err = pushEventsOnce(ctx, c.eps, batches)
		return err
	})
	if err != nil {
		return nil, mapError(allocdv1.EndpointsService_PushEvents_FullMethodName, err)
	}
	return resp, nil
}

func pushEventsOnce(ctx context.Context, eps allocdv1.EndpointsServiceClient,
	batches []*allocdv1.PushEventsRequest) (*allocdv1.PushEventsResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := eps.PushEvents(ctx)
	if err != nil {
		return nil, err
	}
	for _, b := range batches {
		if err := stream.Send(b); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, err
		}
	}
	return stream.CloseAndRecv()
}

// GetServiceEndpoints returns the stored Endpoints of one Service; ErrNotFound when none.
func (c *Client) GetServiceEndpoints(ctx context.Context, namespace,
	name string) (*allocdv1.ServiceEndpoints, error) {
	resp, err := unary(ctx, c, allocdv1.EndpointsService_GetServiceEndpoints_FullMethodName,
		&allocdv1.GetServiceEndpointsRequest{Namespace: namespace, Name: name}, c.eps.GetServiceEndpoints)
	return resp.GetEndpoints(), err
}

// ListServiceEndpoints returns one page of Endpoints; pass NextPageToken back as
// PageToken (with the same namespace) for the next one. Every page of one listing is
// read at its Revision: watch from it to follow on.
func (c *Client) ListServiceEndpoints(ctx context.Context,
	req *allocdv1.ListServiceEndpointsRequest) (*allocdv1.ListServiceEndpointsResponse, error) {
	return unary(ctx, c, allocdv1.EndpointsService_ListServiceEndpoints_FullMethodName, req,
		c.eps.ListServiceEndpoints)
}

// WatchServiceEndpoints opens one watch and calls fn with each change, in order, from
// the calling goroutine. It returns fn's error if fn fails, ctx's error when ctx ends,
// ErrCompacted when req.StartRevision was compacted (list again), and otherwise what
// broke the stream. Resume a broken watch from the last Revision fn saw.
func (c *Client) WatchServiceEndpoints(ctx context.Context, req *allocdv1.WatchServiceEndpointsRequest,
	fn func(*allocdv1.WatchServiceEndpointsResponse) error) error {
	return watchStream(ctx, allocdv1.EndpointsService_WatchServiceEndpoints_FullMethodName, "endpoints",
		func(ctx context.Context) (grpc.ServerStreamingClient[allocdv1.WatchServiceEndpointsResponse],
			error) {
			return c.eps.WatchServiceEndpoints(ctx, req)
		}, fn)
}

// ListEndpointSlices returns one page of EndpointSlices, of every namespace, one
// namespace, or one Service (ServiceName with its Namespace); pass NextPageToken back
// as PageToken (with the same namespace and service) for the next one. Every page of
// one listing is read at its Revision: watch from it to follow on.
func (c *Client) ListEndpointSlices(ctx context.Context,
	req *allocdv1.ListEndpointSlicesRequest) (*allocdv1.ListEndpointSlicesResponse, error) {
	return unary(ctx, c, allocdv1.EndpointsService_ListEndpointSlices_FullMethodName, req,
		c.eps.ListEndpointSlices)
}

// WatchEndpointSlices opens one watch of EndpointSlices and calls fn with each change,
// as WatchServiceEndpoints does.
func (c *Client) WatchEndpointSlices(ctx context.Context, req *allocdv1.WatchEndpointSlicesRequest,
	fn func(*allocdv1.WatchEndpointSlicesResponse) error) error {
	return watchStream(ctx, allocdv1.EndpointsService_WatchEndpointSlices_FullMethodName, "endpoint slices",
		func(ctx context.Context) (grpc.ServerStreamingClient[allocdv1.WatchEndpointSlicesResponse], error) {
			return c.eps.WatchEndpointSlices(ctx, req)
		}, fn)
}

// watchStream runs one watch stream that open opens, calling fn with each message.
func watchStream[Resp any](ctx context.Context, method, what string,
	open func(context.Context) (grpc.ServerStreamingClient[Resp], error), fn func(*Resp) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := open(ctx)
	if err != nil {
		return watchEnd(ctx, mapError(method, err))
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return watchEnd(ctx, fmt.Errorf("client: %s watch ended by the server: %w", what, ErrUnavailable))
		}
		if err != nil {
			return watchEnd(ctx, mapError(method, err))
		}
		if err := fn(msg); err != nil {
			return err
		}
	}
}
