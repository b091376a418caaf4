package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/allocd/allocd/allocator"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// maxOwnerField bounds the length of an owner's namespace, name and uid.
const maxOwnerField = 253

// AllocatorService serves allocd.v1.AllocatorService over an *allocator.Allocator:
// it validates requests (INVALID_ARGUMENT with every bad field, nothing written),
// converts them and maps the allocator's errors through Status.
type AllocatorService struct {
	allocdv1.UnimplementedAllocatorServiceServer
	a   *allocator.Allocator
	log *slog.Logger
	// forceOnlyByRPC refuses Release with force: see RequireForceRelease.
	forceOnlyByRPC bool
}

// ErrForceReleaseRequired is the error of a Release with force after
// RequireForceRelease. It maps to PERMISSION_DENIED, reason FORCE_RELEASE_REQUIRED.
var ErrForceReleaseRequired = errors.New("release with force is refused while authorization is on: " +
	"call allocd.v1.AllocatorService/ForceRelease, which the authorization policy grants apart from Release")

// RequireForceRelease makes Release refuse force (ErrForceReleaseRequired), so that
// forced releases go through ForceRelease alone: an authorization policy sees the
// method, not the request, and must be able to grant Release without granting forced
// releases. Call it before serving.
func (s *AllocatorService) RequireForceRelease() { s.forceOnlyByRPC = true }

// NewAllocatorService returns the service; log may be nil.
func NewAllocatorService(a *allocator.Allocator, log *slog.Logger) *AllocatorService {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &AllocatorService{a: a, log: log}
}

// Allocate implements allocdv1.AllocatorServiceServer.
func (s *AllocatorService) Allocate(ctx context.Context,
	req *allocdv1.AllocateRequest) (*allocdv1.AllocateResponse, error) {
	inv := &InvalidError{}
	o := validOwner(inv, req.GetOwner(), true)
	q := allocator.Request{Owner: o, NoClusterIP: req.GetNoClusterIp(), DryRun: req.GetDryRun(),
		NodePortCount: int(req.GetNodePortCount())}
	for i, f := range req.GetIpFamilies() {
		switch f {
		case allocdv1.IPFamily_IP_FAMILY_IPV4:
			q.Families = append(q.Families, allocator.IPv4)
		case allocdv1.IPFamily_IP_FAMILY_IPV6:
			q.Families = append(q.Families, allocator.IPv6)
		default:
			inv.Add(fmt.Sprintf("ip_families[%d]", i), "must be IP_FAMILY_IPV4 or IP_FAMILY_IPV6")
		}
	}
	switch req.GetIpFamilyPolicy() {
	case allocdv1.IPFamilyPolicy_IP_FAMILY_POLICY_UNSPECIFIED,
		allocdv1.IPFamilyPolicy_IP_FAMILY_POLICY_SINGLE_STACK:
		q.Policy = allocator.SingleStack
	case allocdv1.IPFamilyPolicy_IP_FAMILY_POLICY_PREFER_DUAL_STACK:
		q.Policy = allocator.PreferDualStack
	case allocdv1.IPFamilyPolicy_IP_FAMILY_POLICY_REQUIRE_DUAL_STACK:
		q.Policy = allocator.RequireDualStack
	default:
		inv.Add("ip_family_policy", "unknown policy "+req.GetIpFamilyPolicy().String())
	}
	q.ClusterIPs = parseIPs(inv, "cluster_ips", req.GetClusterIps())
	if req.GetNoClusterIp() && len(req.GetClusterIps()) > 0 {
		inv.Add("no_cluster_ip", "contradicts cluster_ips")
	}
	q.NodePorts = parsePorts(inv, "node_ports", req.GetNodePorts())
	switch n := req.GetNodePortCount(); {
	case n < 0:
		inv.Add("node_port_count", "must not be negative")
	case int(n)+len(req.GetNodePorts())+len(req.GetClusterIps()) > allocator.MaxItems:
		inv.Add("node_port_count",
			fmt.Sprintf("at most %d addresses and ports per request", allocator.MaxItems))
	}
	if err := inv.OrNil(); err != nil {
		return nil, Status(err)
	}
	res, err := s.a.Allocate(ctx, q)
	if err != nil {
		s.log.DebugContext(ctx, "allocate failed", "owner", o.UID, "err", err)
		return nil, Status(err)
	}
	out := &allocdv1.AllocateResponse{Revision: res.Revision, Replayed: res.Replayed}
	for _, ip := range res.ClusterIPs {
		out.ClusterIps = append(out.ClusterIps, ip.String())
	}
	for _, p := range res.NodePorts {
		out.NodePorts = append(out.NodePorts, int32(p))
	}
	return out, nil
}

// Release implements allocdv1.AllocatorServiceServer.
func (s *AllocatorService) Release(ctx context.Context,
	req *allocdv1.ReleaseRequest) (*allocdv1.ReleaseResponse, error) {
	if req.GetForce() && s.forceOnlyByRPC {
		return nil, Status(ErrForceReleaseRequired)
	}
	out, err := s.release(ctx, req.GetOwner(), req.GetClusterIps(), req.GetNodePorts(), req.GetForce())
	if err != nil {
		return nil, err
	}
	return &allocdv1.ReleaseResponse{ReleasedClusterIps: out.ReleasedClusterIps,
		ReleasedNodePorts: out.ReleasedNodePorts,
		Revision:          out.Revision}, nil
}

// ForceRelease implements allocdv1.AllocatorServiceServer: Release with force.
func (s *AllocatorService) ForceRelease(ctx context.Context,
	req *allocdv1.ForceReleaseRequest) (*allocdv1.ForceReleaseResponse, error) {
	return s.release(ctx, req.GetOwner(), req.GetClusterIps(), req.GetNodePorts(), true)
}

// release validates and runs a release for Release and ForceRelease.
func (s *AllocatorService) release(ctx context.Context, owner *allocdv1.Owner, ips []string, ports []int32,
	force bool) (*allocdv1.ForceReleaseResponse, error) {
	inv := &InvalidError{}
	o := validOwner(inv, owner, !force)
	var items []allocator.Item
	for _, ip := range parseIPs(inv, "cluster_ips", ips) {
		items = append(items, allocator.IP(ip))
	}
	for _, p := range parsePorts(inv, "node_ports", ports) {
		items = append(items, allocator.Port(p))
	}
	if len(items) > allocator.MaxItems {
		inv.Add("cluster_ips", fmt.Sprintf("at most %d addresses and ports per request", allocator.MaxItems))
	}
	if o.UID == "" && len(items) == 0 {
		inv.Add("owner.uid", "required to release all of an owner's allocations")
	}
	if err := inv.OrNil(); err != nil {
		return nil, Status(err)
	}
	released, rev, err := s.a.Release(ctx, o, items, force)
	if err != nil {
		return nil, Status(err)
	}
	out := &allocdv1.ForceReleaseResponse{Revision: rev}
	for _, it := range released {
		if it.Kind == allocator.KindClusterIP {
			out.ReleasedClusterIps = append(out.ReleasedClusterIps, it.Addr.String())
		} else {
			out.ReleasedNodePorts = append(out.ReleasedNodePorts, int32(it.Port))
		}
	}
	return out, nil
}

// Transfer implements allocdv1.AllocatorServiceServer: it moves items from one owner to
// another in one transaction (allocator.Transfer). The authorization policy grants it
// apart from Release: it can move anyone's items to anyone.
func (s *AllocatorService) Transfer(ctx context.Context,
	req *allocdv1.TransferRequest) (*allocdv1.TransferResponse, error) {
	inv := &InvalidError{}
	from := validOwnerAt(inv, "from", req.GetFrom(), true)
	to := validOwnerAt(inv, "to", req.GetTo(), true)
	var items []allocator.Item
	for _, ip := range parseIPs(inv, "cluster_ips", req.GetClusterIps()) {
		items = append(items, allocator.IP(ip))
	}
	for _, p := range parsePorts(inv, "node_ports", req.GetNodePorts()) {
		items = append(items, allocator.Port(p))
	}
	if n := len(req.GetClusterIps()) + len(req.GetNodePorts()); n > allocator.MaxItems {
		inv.Add("cluster_ips", fmt.Sprintf("at most %d addresses and ports per request", allocator.MaxItems))
	}
	if err := inv.OrNil(); err != nil {
		return nil, Status(err)
	}
	moved, rev, err := s.a.Transfer(ctx, from, to, items)
	if err != nil {
		s.log.DebugContext(ctx, "transfer failed", "from", from.UID, "to", to.UID, "err", err)
		return nil, Status(err)
	}
	out := &allocdv1.TransferResponse{Revision: rev}
	for _, it := range moved {
		if it.Kind == allocator.KindClusterIP {
			out.TransferredClusterIps = append(out.TransferredClusterIps, it.Addr.String())
		} else {
			out.TransferredNodePorts = append(out.TransferredNodePorts, int32(it.Port))
		}
	}
	return out, nil
}

// GetAllocation implements allocdv1.AllocatorServiceServer.
func (s *AllocatorService) GetAllocation(ctx context.Context,
	req *allocdv1.GetAllocationRequest) (*allocdv1.GetAllocationResponse, error) {
	inv := &InvalidError{}
	var it allocator.Item
	switch t := req.GetTarget().(type) {
	case *allocdv1.GetAllocationRequest_ClusterIp:
		if ips := parseIPs(inv, "cluster_ip", []string{t.ClusterIp}); len(ips) == 1 {
			it = allocator.IP(ips[0])
		}
	case *allocdv1.GetAllocationRequest_NodePort:
		if ps := parsePorts(inv, "node_port", []int32{t.NodePort}); len(ps) == 1 {
			it = allocator.Port(ps[0])
		}
	default:
		inv.Add("target", "set cluster_ip or node_port")
	}
	if err := inv.OrNil(); err != nil {
		return nil, Status(err)
	}
	al, err := s.a.Get(ctx, it)
	if err != nil {
		return nil, Status(err)
	}
	return &allocdv1.GetAllocationResponse{Allocation: s.allocation(al)}, nil
}

// ListAllocations implements allocdv1.AllocatorServiceServer.
func (s *AllocatorService) ListAllocations(ctx context.Context,
	req *allocdv1.ListAllocationsRequest) (*allocdv1.ListAllocationsResponse, error) {
	if req.GetPageSize() < 0 {
		return nil, Status(Invalid("page_size", "must not be negative"))
	}
	page, err := s.a.ListPage(ctx, allocator.ListOptions{Range: req.GetRange(), OwnerUID: req.GetOwnerUid(),
		OwnerUIDPrefix: req.GetOwnerUidPrefix(), PageSize: int(req.GetPageSize()),
		PageToken: req.GetPageToken()})
	if err != nil {
		return nil, Status(err)
	}
	out := &allocdv1.ListAllocationsResponse{NextPageToken: page.NextPageToken, Revision: page.Revision}
	for _, al := range page.Allocations {
		out.Allocations = append(out.Allocations, s.allocation(al))
	}
	return out, nil
}

// ListRanges implements allocdv1.AllocatorServiceServer. The counts come from the
// allocator's index, which follows etcd through a watch: the call first waits (a few
// seconds at most, then UNAVAILABLE) until the index has caught up with etcd, so that
// it reflects every Allocate and Release acknowledged before it.
func (s *AllocatorService) ListRanges(ctx context.Context,
	_ *allocdv1.ListRangesRequest) (*allocdv1.ListRangesResponse, error) {
	if err := s.a.Sync(ctx); err != nil {
		return nil, Status(syncErr(err))
	}
	out := &allocdv1.ListRangesResponse{}
	for _, ri := range s.a.Ranges() {
		r := &allocdv1.Range{Name: ri.Name, Primary: ri.Primary, Size: ri.Size, Used: ri.Used,
			Free:       ri.Size - ri.Used,
			StaticBand: band(ri.Static), DynamicBand: band(ri.Dynamic), ServiceCidrs: ri.ServiceCIDRs}
		if ri.Kind == allocator.KindClusterIP {
			r.State = allocdv1.ServiceCIDRState_SERVICE_CIDR_STATE_READY
			if ri.State == allocator.CIDRTerminating {
				r.State = allocdv1.ServiceCIDRState_SERVICE_CIDR_STATE_TERMINATING
			}
			r.Kind = allocdv1.RangeKind_RANGE_KIND_CLUSTER_IP
			r.Family = allocdv1.IPFamily_IP_FAMILY_IPV6
			if ri.Prefix.Addr().Is4() {
				r.Family = allocdv1.IPFamily_IP_FAMILY_IPV4
			}
		} else {
			r.Kind = allocdv1.RangeKind_RANGE_KIND_NODE_PORT
		}
		out.Ranges = append(out.Ranges, r)
	}
	return out, nil
}

// syncErr marks an index that stays behind etcd as unavailable: a retry may work.
func syncErr(err error) error {
	if errors.Is(err, allocator.ErrNotSynced) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

func band(b allocator.Band) *allocdv1.Band {
	out := &allocdv1.Band{Size: b.Size, Used: b.Used, Free: b.Size - b.Used}
	if b.Size > 0 {
		out.First, out.Last = b.First.String(), b.Last.String()
	}
	return out
}

func (s *AllocatorService) allocation(al allocator.Allocation) *allocdv1.Allocation {
	out := &allocdv1.Allocation{Range: al.Range,
		Owner: &allocdv1.Owner{Namespace: al.Owner.Namespace, Name: al.Owner.Name,
			Uid: al.Owner.UID},
		CreateRevision: al.CreateRevision, ModRevision: al.ModRevision, StaticBand: s.a.IsStatic(al.Item)}
	if !al.AllocateTime.IsZero() {
		out.AllocateTime = timestamppb.New(al.AllocateTime)
	}
	if al.Kind == allocator.KindClusterIP {
		out.ClusterIp = al.Addr.String()
	} else {
		out.NodePort = int32(al.Port)
	}
	return out
}

// validOwner is validOwnerAt of the request field owner.
func validOwner(inv *InvalidError, o *allocdv1.Owner, uidRequired bool) allocator.Owner {
	return validOwnerAt(inv, "owner", o, uidRequired)
}

// validOwnerAt validates the owner in the request field named field (its uid when
// uidRequired, or when set; the length of every field) and converts it.
func validOwnerAt(inv *InvalidError, field string, o *allocdv1.Owner, uidRequired bool) allocator.Owner {
	if o == nil {
		if uidRequired {
			inv.Add(field, "required")
		}
		return allocator.Owner{}
	}
	if why := allocator.CheckUID(o.GetUid()); why != "" && (uidRequired || o.GetUid() != "") {
		inv.Add(field+".uid", why)
	}
	for _, f := range []struct{ name, v string }{{field + ".namespace", o.GetNamespace()},
		{field + ".name", o.GetName()}, {field + ".uid", o.GetUid()}} {
		if len(f.v) > maxOwnerField {
			inv.Add(f.name, fmt.Sprintf("longer than %d bytes", maxOwnerField))
		}
	}
	return allocator.Owner{Namespace: o.GetNamespace(), Name: o.GetName(), UID: o.GetUid()}
}

func parseIPs(inv *InvalidError, field string, ss []string) []netip.Addr {
	var out []netip.Addr
	for i, s := range ss {
		f := field
		if len(ss) > 1 || field == "cluster_ips" {
			f = field + "[" + strconv.Itoa(i) + "]"
		}
		a, err := netip.ParseAddr(s)
		switch {
		case err != nil:
			inv.Add(f, fmt.Sprintf("%q is not an IP address", s))
		case a.Zone() != "":
			inv.Add(f, fmt.Sprintf("%q has a zone", s))
		case a.Is4In6():
			inv.Add(f, fmt.Sprintf("%q is an IPv4-mapped IPv6 address; use %s", s, a.Unmap()))
		default:
			out = append(out, a)
		}
	}
	return out
}

func parsePorts(inv *InvalidError, field string, ps []int32) []int {
	var out []int
	for i, p := range ps {
		f := field
		if field == "node_ports" {
			f = field + "[" + strconv.Itoa(i) + "]"
		}
		if p < 1 || p > 65535 {
			inv.Add(f, fmt.Sprintf("%d is not a port (1-65535)", p))
			continue
		}
		out = append(out, int(p))
	}
	return out
}
