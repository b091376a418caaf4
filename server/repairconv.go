package server

import (
	"slices"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/allocd/allocd/allocator"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
	"github.com/allocd/allocd/repair"
)

// ParseServiceSnapshotJSON reads a snapshot file: the protojson form of
// allocd.v1.ServiceSnapshot ({"revision": "12", "services": [{"namespace": ...}]}), for
// repair.Config.ParseSnapshotFile. Repair validates what it returns.
func ParseServiceSnapshotJSON(b []byte) (repair.Snapshot, error) {
	var p allocdv1.ServiceSnapshot
	if err := protojson.Unmarshal(b, &p); err != nil {
		return repair.Snapshot{}, err
	}
	return serviceSnapshotFromProto(&p), nil
}

// serviceSnapshotFromProto converts the wire form. The slices of cluster IPs are shared
// with p, which must not change afterwards.
func serviceSnapshotFromProto(p *allocdv1.ServiceSnapshot) repair.Snapshot {
	s := repair.Snapshot{Revision: p.GetRevision()}
	s.Services = appendRepairServices(make([]repair.Service, 0, len(p.GetServices())), p.GetServices())
	return s
}

// appendRepairServices converts Services of the wire form (one chunk of a snapshot) to
// repair's form and appends them to dst.
func appendRepairServices(dst []repair.Service, ps []*allocdv1.Service) []repair.Service {
	for _, p := range ps {
		dst = append(dst, repairService(p))
	}
	return dst
}

// repairService is what repair needs of a Service: its cluster IPs and node ports.
func repairService(p *allocdv1.Service) repair.Service {
	svc := repair.Service{
		Namespace:           p.GetNamespace(),
		Name:                p.GetName(),
		UID:                 p.GetUid(),
		ClusterIPs:          p.GetClusterIps(),
		HealthCheckNodePort: int(p.GetHealthCheckNodePort()),
	}
	if n := len(p.GetNodePorts()); n > 0 {
		svc.NodePorts = make([]repair.NodePort, n)
		for i, np := range p.GetNodePorts() {
			svc.NodePorts[i] = repair.NodePort{Port: int(np.GetPort()), Protocol: np.GetProtocol()}
		}
	}
	// The node ports of ports[] (the Endpoints feed's form) count too, once.
	for _, sp := range p.GetPorts() {
		if sp.GetNodePort() == 0 {
			continue
		}
		np := repair.NodePort{Port: int(sp.GetNodePort()), Protocol: sp.GetProtocol()}
		if np.Protocol == "" {
			np.Protocol = "TCP"
		}
		if !slices.Contains(svc.NodePorts, np) {
			svc.NodePorts = append(svc.NodePorts, np)
		}
	}
	return svc
}

// repairEvents is the Service part of one validated PushEvents message, in repair's
// form.
func repairEvents(m *allocdv1.PushEventsRequest) []repair.ServiceEvent {
	var out []repair.ServiceEvent
	for _, ev := range m.GetEvents() {
		svc := ev.GetService()
		if svc == nil {
			continue
		}
		rev := ev.GetRevision()
		if rev == 0 {
			rev = m.GetRevision()
		}
		out = append(out, repair.ServiceEvent{
			Revision: rev,
			Deleted:  ev.GetType() == allocdv1.EventType_EVENT_TYPE_DELETE,
			Service:  repairService(svc),
		})
	}
	return out
}

func reportProto(r *repair.Report) *allocdv1.RepairReport {
	p := &allocdv1.RepairReport{
		StartTime:        timestamppb.New(r.Start),
		Duration:         durationpb.New(r.Duration),
		SnapshotRevision: r.SnapshotRevision,
		DryRun:           r.DryRun,
		Counts:           make(map[string]int64, len(r.Counts)),
		Findings:         make([]*allocdv1.Finding, 0, len(r.Findings)),
	}
	for k, v := range r.Counts {
		p.Counts[string(k)] = v
	}
	for _, f := range r.Findings {
		p.Findings = append(p.Findings, &allocdv1.Finding{
			Reason:    string(f.Reason),
			Range:     f.Range,
			ClusterIp: f.ClusterIP,
			NodePort:  int32(f.NodePort),
			Service:   ownerProto(f.Service),
			Message:   f.Message,
			Repaired:  f.Repaired,
		})
	}
	if r.Err != nil {
		p.Error = r.Err.Error()
	}
	return p
}

func statusProto(st repair.Status) *allocdv1.GetRepairStatusResponse {
	resp := &allocdv1.GetRepairStatusResponse{
		Leader:           st.Leader,
		SnapshotRevision: st.SnapshotRevision,
	}
	if st.LastReport != nil {
		resp.LastReport = reportProto(st.LastReport)
	}
	for _, cd := range st.Candidates {
		lc := &allocdv1.LeakCandidate{
			Range:              cd.Allocation.Range,
			Owner:              ownerProto(cd.Allocation.Owner),
			Strikes:            int32(cd.Strikes),
			StrikesLeft:        int32(cd.StrikesLeft),
			Age:                durationpb.New(cd.Age),
			AllocationRevision: cd.Allocation.ModRevision,
		}
		if cd.Allocation.Kind == allocator.KindClusterIP {
			lc.ClusterIp = cd.Allocation.Addr.String()
		} else {
			lc.NodePort = int32(cd.Allocation.Port)
		}
		resp.LeakCandidates = append(resp.LeakCandidates, lc)
	}
	return resp
}

func ownerProto(o allocator.Owner) *allocdv1.Owner {
	return &allocdv1.Owner{Namespace: o.Namespace, Name: o.Name, Uid: o.UID}
}
