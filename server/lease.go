package server

import (
	"context"
	"log/slog"
	"math"
	"time"

	"google.golang.org/grpc"

	"github.com/allocd/allocd/masterlease"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// LeaseService serves allocd.v1.LeaseService over a masterlease.Manager: the master
// leases of the API-server replicas and the endpoints of the kubernetes Service.
// Validation and etcd work happen in the Manager; errors go out through Status.
type LeaseService struct {
	allocdv1.UnimplementedLeaseServiceServer
	m   *masterlease.Manager
	log *slog.Logger
}

var _ allocdv1.LeaseServiceServer = (*LeaseService)(nil)

// NewLeaseService returns the LeaseService of m. The caller runs m.Run: GetEndpoints
// and WatchEndpoints answer UNAVAILABLE while it is not running.
func NewLeaseService(m *masterlease.Manager, log *slog.Logger) *LeaseService {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &LeaseService{m: m, log: log}
}

// Renew creates or refreshes the lease of req.ip (INVALID_ARGUMENT with BadRequest for
// a bad ip or ttl_seconds, nothing written).
func (s *LeaseService) Renew(ctx context.Context,
	req *allocdv1.RenewRequest) (*allocdv1.RenewResponse, error) {
	l, err := s.m.Renew(ctx, req.GetIp(), req.GetTtlSeconds())
	if err != nil {
		return nil, Status(err)
	}
	return &allocdv1.RenewResponse{Lease: leaseProto(l)}, nil
}

// ListLeases lists the live leases, sorted by address (a linearizable read).
func (s *LeaseService) ListLeases(ctx context.Context,
	_ *allocdv1.ListLeasesRequest) (*allocdv1.ListLeasesResponse, error) {
	ls, rev, err := s.m.List(ctx)
	if err != nil {
		return nil, Status(err)
	}
	resp := &allocdv1.ListLeasesResponse{Revision: rev, Leases: make([]*allocdv1.Lease, 0, len(ls))}
	for _, l := range ls {
		resp.Leases = append(resp.Leases, leaseProto(l))
	}
	return resp, nil
}

// RemoveLease deletes the lease of req.ip; removing an absent lease is OK.
func (s *LeaseService) RemoveLease(ctx context.Context,
	req *allocdv1.RemoveLeaseRequest) (*allocdv1.RemoveLeaseResponse, error) {
	removed, rev, err := s.m.Remove(ctx, req.GetIp(), req.GetShutdown())
	if err != nil {
		return nil, Status(err)
	}
	return &allocdv1.RemoveLeaseResponse{Removed: removed, Revision: rev}, nil
}

// GetEndpoints returns the endpoints of the kubernetes Service, as of a revision at
// least as new as any write acknowledged before the call.
func (s *LeaseService) GetEndpoints(ctx context.Context,
	_ *allocdv1.GetEndpointsRequest) (*allocdv1.GetEndpointsResponse, error) {
	eps, err := s.m.Endpoints(ctx)
	if err != nil {
		return nil, Status(err)
	}
	return &allocdv1.GetEndpointsResponse{Endpoints: endpointsProto(eps)}, nil
}

// WatchEndpoints streams the current endpoints, then one message per change, until
// the client goes away or the server stops.
func (s *LeaseService) WatchEndpoints(_ *allocdv1.WatchEndpointsRequest,
	stream grpc.ServerStreamingServer[allocdv1.WatchEndpointsResponse]) error {
	err := s.m.WatchEndpoints(stream.Context(), func(eps masterlease.Endpoints) error {
		return stream.Send(&allocdv1.WatchEndpointsResponse{Endpoints: endpointsProto(eps)})
	})
	return Status(err)
}

func leaseProto(l masterlease.Lease) *allocdv1.Lease {
	return &allocdv1.Lease{
		Ip:                  l.IP.String(),
		LeaseId:             int64(l.ID),
		TtlSeconds:          leaseSeconds(l.TTL),
		RemainingTtlSeconds: leaseSeconds(l.Remaining),
		Revision:            l.Revision,
	}
}

func leaseSeconds(d time.Duration) int64 { return int64(math.Ceil(d.Seconds())) }

func endpointsProto(e masterlease.Endpoints) *allocdv1.Endpoints {
	out := &allocdv1.Endpoints{Namespace: "default", Name: "kubernetes", Revision: e.Revision}
	if len(e.Addresses) == 0 {
		return out
	}
	sub := &allocdv1.EndpointSubset{}
	for _, a := range e.Addresses {
		sub.Addresses = append(sub.Addresses, a.String())
	}
	for _, p := range e.Ports {
		sub.Ports = append(sub.Ports,
			&allocdv1.EndpointPort{Name: p.Name, Port: int32(p.Port), Protocol: p.Protocol})
	}
	out.Subsets = []*allocdv1.EndpointSubset{sub}
	return out
}
