package repair

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/allocd/allocd/allocator"
)

// message names one kind of finding; messages holds its reason and its text.
type message uint8

// The findings a pass reports, in the order a pass meets them.
const (
	msgStale message = iota

	// collect: addresses and ports a Service cannot use.
	msgNotValid
	msgNoFamily
	msgIPOutOfRange
	msgPortOutOfRange

	// check: an item used by Services of the snapshot.
	msgShared
	msgNotAllocated
	msgNotAllocatedStale
	msgNotAllocatedDry
	msgNotAllocatedReleased
	msgNotAllocatedReleasedLater
	msgNotAllocatedCompacted
	msgWrongOwner
	msgWrongOwnerNewer
	msgWrongOwnerShared

	// checkReserved: the item reserved for the kubernetes Service.
	msgReserved
	msgReservedNotAllocated
	msgReservedNotAllocatedDry
	msgReservedWrongOwner
	msgReservedWrongOwnerNewer

	// assign and reassign: a repair that is not made.
	msgTaken
	msgAssignFailed
	msgReassignStale
	msgReassignDry
	msgReassignChanged
	msgReassignFailed
	msgCIDRFull
	msgPortRangeFull

	// leaks: allocations no Service uses.
	msgLeakStrike
	msgLeakYoung
	msgLeakDry
	msgLeakReleased
	msgLeakReleaseFailed
	msgLeakChanged
)

// wording is the reason and the text of a message: reason, or portReason (when set)
// for a finding about a NodePort; format takes the arguments the constant's comment in
// messages names.
type wording struct {
	reason, portReason Reason
	format             string
}

// reserved names the kubernetes Service in the messages about its reservation.
const reserved = "reserved for the default/kubernetes service"

// messages are the reasons and texts of every finding, in Kubernetes' words where its
// repair controllers have a message for the case. Most texts start with the item as
// about.what names it.
var messages = [...]wording{
	// revision of the pass's snapshot, revision accepted by another replica
	msgStale: {SnapshotStale, "",
		"service snapshot revision %d is older than revision %d, accepted by another replica: " +
			"no Service repaired and no leak judged until that snapshot (or a newer one) is pushed here"},

	// item
	msgNotValid: {ClusterIPNotValid, "",
		"%s is not a valid IP; please recreate service"},
	// item
	msgNoFamily: {ClusterIPNotValid, "",
		"%s is not a valid IP: no service CIDR of its family; please recreate service"},
	// item, range
	msgIPOutOfRange: {ClusterIPOutOfRange, "",
		"%s is not within the service CIDR %s; please recreate service"},
	// item, range
	msgPortOutOfRange: {PortOutOfRange, "",
		"%s is not within the port range %s; please recreate service"},

	// item, namespace and name of the Service that holds it
	msgShared: {ClusterIPAlreadyAllocated, PortAlreadyAllocated,
		"%s was assigned to multiple services (also %s/%s); please recreate service"},
	// item
	msgNotAllocated: {ClusterIPNotAllocated, PortNotAllocated,
		"%s is not allocated; repairing"},
	// item
	msgNotAllocatedStale: {ClusterIPNotAllocated, PortNotAllocated,
		"%s is not allocated; not repaired: the snapshot is stale"},
	// item
	msgNotAllocatedDry: {ClusterIPNotAllocated, PortNotAllocated,
		"%s is not allocated; would repair (dry run)"},
	// item, its holder at the receipt revision, the receipt revision
	msgNotAllocatedReleased: {ClusterIPNotAllocated, PortNotAllocated,
		"%s is not allocated; not repaired: released after the snapshot was received (held by %s " +
			"at revision %d)"},
	// item, the receipt revision, its holder at the revision read, the revision read
	msgNotAllocatedReleasedLater: {ClusterIPNotAllocated, PortNotAllocated,
		"%s is not allocated; not repaired: released after the snapshot was received (revision %d, " +
			"compacted; held by %s at revision %d, the oldest etcd keeps)"},
	// item, the revision read, the receipt revision
	msgNotAllocatedCompacted: {ClusterIPNotAllocated, PortNotAllocated,
		"%s is not allocated; repairing (not held at revision %d, the oldest etcd keeps: the " +
			"snapshot's, %d, is compacted)"},
	// item, holder
	msgWrongOwner: {ClusterIPWrongOwner, PortWrongOwner,
		"%s is allocated to %s, not to the service that uses it; repairing"},
	// item, holder, its revision, the snapshot's receipt revision
	msgWrongOwnerNewer: {ClusterIPWrongOwner, PortWrongOwner,
		"%s is allocated to %s, which is newer (revision %d) than the snapshot (received at " +
			"revision %d); not corrected"},
	// item, holder
	msgWrongOwnerShared: {ClusterIPWrongOwner, PortWrongOwner,
		"%s is allocated to %s and used by several services; not reassigned"},

	// item
	msgReserved: {ClusterIPAlreadyAllocated, PortAlreadyAllocated,
		"%s is " + reserved + "; please recreate service"},
	// item
	msgReservedNotAllocated: {ClusterIPNotAllocated, PortNotAllocated,
		"%s, " + reserved + ", is not allocated; repairing"},
	// item
	msgReservedNotAllocatedDry: {ClusterIPNotAllocated, PortNotAllocated,
		"%s, " + reserved + ", is not allocated; would repair (dry run)"},
	// item, holder
	msgReservedWrongOwner: {ClusterIPWrongOwner, PortWrongOwner,
		"%s, " + reserved + ", is allocated to %s; repairing"},
	// item, holder, its revision, the snapshot's receipt revision
	msgReservedWrongOwnerNewer: {ClusterIPWrongOwner, PortWrongOwner,
		"%s, " + reserved + ", is allocated to %s, which is newer (revision %d) than the " +
			"snapshot (received at revision %d); not corrected"},

	// item, holder
	msgTaken: {ClusterIPNotAllocated, PortNotAllocated,
		"%s is not allocated, but was allocated to %s since the pass read etcd; not repaired"},
	// item, owner it was allocated to, error
	msgAssignFailed: {ClusterIPNotAllocated, PortNotAllocated,
		"%s is not allocated, and allocating it to %s failed; not repaired: %v"},
	// item, holder, owner it would go to
	msgReassignStale: {ClusterIPWrongOwner, PortWrongOwner,
		"%s is allocated to %s, not to %s; not reassigned: the snapshot is stale"},
	// item, holder, owner it would go to
	msgReassignDry: {ClusterIPWrongOwner, PortWrongOwner,
		"%s is allocated to %s, not to %s; would reassign (dry run)"},
	// item, holder, error
	msgReassignChanged: {ClusterIPWrongOwner, PortWrongOwner,
		"%s is allocated to %s, but changed since the pass read it, or kept changing; not " +
			"reassigned: %v"},
	// item, holder, owner it was to go to, error
	msgReassignFailed: {ClusterIPWrongOwner, PortWrongOwner,
		"%s is allocated to %s, and reassigning it to %s failed; not reassigned: %v"},
	// range
	msgCIDRFull: {ServiceCIDRFull, "",
		"Service CIDR %s is full; you must widen the CIDR in order to create new services"},
	// range
	msgPortRangeFull: {PortRangeFull, "",
		"Port range %s is full; you must widen the port range in order to create new services"},

	// item, owner, strikes, strikes needed
	msgLeakStrike: {LeakSuspected, "",
		"%s of %s may have leaked: flagging for later clean up (strike %d of %d)"},
	// item, owner, its age when the snapshot was received, grace
	msgLeakYoung: {LeakSuspected, "",
		"%s of %s appears to have leaked, but was only %v old when the snapshot was received " +
			"(grace %v): kept"},
	// item, owner
	msgLeakDry: {LeakReleased, "",
		"%s of %s appears to have leaked: would clean up (dry run)"},
	// item, owner
	msgLeakReleased: {LeakReleased, "",
		"%s of %s appears to have leaked: cleaned up"},
	// item, owner, error
	msgLeakReleaseFailed: {LeakSuspected, "",
		"%s of %s appears to have leaked, but cleaning it up failed: kept: %v"},
	// item, owner
	msgLeakChanged: {LeakSuspected, "",
		"%s of %s appeared to have leaked, but changed since the pass read it: kept"},
}

// about is what a finding is about: an item, as the Service wrote it (raw, for an
// address; "" for a port or a leak), its range ("" when it has none) and the Service
// (for a leak, the allocation's owner). The zero about is the pass itself.
type about struct {
	item  allocator.Item
	raw   string
	rng   string
	owner allocator.Owner
}

// finding is the one constructor of findings: a finding about a, with m's reason
// and m's text over args.
func (a about) finding(m message, args ...any) Finding {
	w := messages[m]
	f := Finding{Reason: w.reason, Range: a.rng, Service: a.owner, Message: fmt.Sprintf(w.format, args...)}
	switch {
	case a.item.Kind == allocator.KindNodePort:
		f.NodePort = a.item.Port
		if w.portReason != "" {
			f.Reason = w.portReason
		}
	case a.raw != "":
		f.ClusterIP = a.raw
	case a.item.Addr.IsValid():
		f.ClusterIP = a.item.Addr.String()
	}
	return f
}

// repaired is finding, marked repaired.
func (a about) repaired(m message, args ...any) Finding {
	f := a.finding(m, args...)
	f.Repaired = true
	return f
}

// what names the item as Kubernetes' events do: "Cluster IP 10.0.0.1", "Port 30001".
func (a about) what() string {
	switch {
	case a.item.Kind == allocator.KindNodePort:
		return "Port " + strconv.Itoa(a.item.Port)
	case a.raw != "":
		return "Cluster IP " + a.raw
	}
	return "Cluster IP " + a.item.Addr.String()
}

// add records a finding: in the report, as a log line and (unless a dry run) as a metric.
func (p *passRun) add(f Finding) {
	p.rep.Findings = append(p.rep.Findings, f)
	p.rep.Counts[f.Reason]++
	attrs := []slog.Attr{
		slog.String("reason", string(f.Reason)),
		slog.String("range", f.Range),
		slog.String("namespace", f.Service.Namespace),
		slog.String("name", f.Service.Name),
		slog.String("uid", f.Service.UID),
		slog.Bool("repaired", f.Repaired),
		slog.Bool("dry_run", p.dry),
		slog.Int64("snapshot_revision", p.snap.Revision),
	}
	if f.ClusterIP != "" {
		attrs = append(attrs, slog.String("cluster_ip", f.ClusterIP))
	}
	if f.NodePort != 0 {
		attrs = append(attrs, slog.Int("node_port", f.NodePort))
	}
	p.c.log.LogAttrs(context.Background(), slog.LevelWarn, f.Message, attrs...)
	if !p.dry {
		p.c.metrics.finding(f.Range, f.Reason)
	}
}

func owner(s *Service) allocator.Owner {
	return allocator.Owner{Namespace: s.Namespace, Name: s.Name, UID: s.UID}
}
