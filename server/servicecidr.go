package server

import (
	"context"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/allocd/allocd/allocator"
	"github.com/allocd/allocd/internal/badrequest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// CreateServiceCIDR implements allocdv1.AllocatorServiceServer.
func (s *AllocatorService) CreateServiceCIDR(ctx context.Context,
	req *allocdv1.CreateServiceCIDRRequest) (*allocdv1.CreateServiceCIDRResponse, error) {
	c, err := s.a.CreateServiceCIDR(ctx, req.GetName(), req.GetCidrs())
	if err != nil {
		return nil, Status(err)
	}
	return &allocdv1.CreateServiceCIDRResponse{ServiceCidr: s.serviceCIDR(c)}, nil
}

// GetServiceCIDR implements allocdv1.AllocatorServiceServer.
func (s *AllocatorService) GetServiceCIDR(ctx context.Context,
	req *allocdv1.GetServiceCIDRRequest) (*allocdv1.GetServiceCIDRResponse, error) {
	if req.GetName() == "" {
		return nil, Status(badrequest.New("name", "required"))
	}
	c, err := s.a.GetServiceCIDR(ctx, req.GetName())
	if err != nil {
		return nil, Status(syncErr(err))
	}
	return &allocdv1.GetServiceCIDRResponse{ServiceCidr: s.serviceCIDR(c)}, nil
}

// ListServiceCIDRs implements allocdv1.AllocatorServiceServer.
func (s *AllocatorService) ListServiceCIDRs(ctx context.Context,
	_ *allocdv1.ListServiceCIDRsRequest) (*allocdv1.ListServiceCIDRsResponse, error) {
	cs, err := s.a.ListServiceCIDRs(ctx)
	if err != nil {
		return nil, Status(syncErr(err))
	}
	out := &allocdv1.ListServiceCIDRsResponse{}
	for _, c := range cs {
		out.ServiceCidrs = append(out.ServiceCidrs, s.serviceCIDR(c))
	}
	return out, nil
}

// DeleteServiceCIDR implements allocdv1.AllocatorServiceServer.
func (s *AllocatorService) DeleteServiceCIDR(ctx context.Context,
	req *allocdv1.DeleteServiceCIDRRequest) (*allocdv1.DeleteServiceCIDRResponse, error) {
	if req.GetName() == "" {
		return nil, Status(badrequest.New("name", "required"))
	}
	c, err := s.a.DeleteServiceCIDR(ctx, req.GetName())
	if err != nil {
		return nil, Status(err)
	}
	return &allocdv1.DeleteServiceCIDRResponse{ServiceCidr: s.serviceCIDR(c)}, nil
}

func (s *AllocatorService) serviceCIDR(c allocator.ServiceCIDR) *allocdv1.ServiceCIDR {
	out := &allocdv1.ServiceCIDR{Name: c.Name, Revision: c.Revision, BlockingAllocations: uint64(c.Blockers)}
	for _, p := range c.CIDRs {
		out.Cidrs = append(out.Cidrs, p.String())
	}
	switch c.State {
	case allocator.CIDRReady:
		out.State = allocdv1.ServiceCIDRState_SERVICE_CIDR_STATE_READY
	case allocator.CIDRTerminating:
		out.State = allocdv1.ServiceCIDRState_SERVICE_CIDR_STATE_TERMINATING
	}
	if !c.Created.IsZero() {
		out.CreateTime = timestamppb.New(c.Created)
	}
	if !c.Terminating.IsZero() {
		out.DeleteTime = timestamppb.New(c.Terminating)
	}
	for _, al := range c.Sample {
		out.BlockingSample = append(out.BlockingSample, s.allocation(al))
	}
	return out
}
