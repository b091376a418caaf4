package admit

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// Allocd is what the webhook asks of allocd; *client.Client is one.
type Allocd interface {
	Allocate(ctx context.Context, req *allocdv1.AllocateRequest) (*allocdv1.AllocateResponse, error)
	Transfer(ctx context.Context, req *allocdv1.TransferRequest) (*allocdv1.TransferResponse, error)
	Release(ctx context.Context, req *allocdv1.ReleaseRequest) (*allocdv1.ReleaseResponse, error)
	ListAllocations(ctx context.Context, req *allocdv1.ListAllocationsRequest) (
		*allocdv1.ListAllocationsResponse, error)
	ListServiceCIDRs(ctx context.Context) ([]*allocdv1.ServiceCIDR, error)
}

// ProvisionalPrefix begins the UID of every provisional owner: what the webhook
// allocates for a Service that has no UID yet (a create), or for a change that may
// still be refused (an update), is held under "admission/<AdmissionRequest uid>" until
// the bridge binds it to the stored Service's UID or frees it.
const ProvisionalPrefix = "admission/"

// parkedSegment is in the UID of an owner under which the webhook parks an address
// allocd gave it and the cluster uses for a Service the webhook does not know yet (an
// IPAddress whose parent it has not seen): "<provisional uid>/parked/<address>",
// named after that Service, so that the bridge binds it to the Service once stored, or
// frees it.
const parkedSegment = "/parked/"

// maxRounds bounds how often one admission asks allocd again without getting closer
// to its answer (allocd gave it items the cluster uses, or an item it took back was
// moved meanwhile): allocd that far behind the cluster is reported as an error, and
// the failure policy decides. A round that settles some of the needs (an item taken
// over from an earlier invocation, or back from a Service that no longer uses it) does
// not count: there are at most as many of those as needs.
const maxRounds = 8

// Errors of an admission that allocd could not serve; the webhook answers them with an
// HTTP error, so that the webhook's failurePolicy decides.
var (
	// ErrAllocd is allocd unreachable, or an answer of it the webhook cannot use.
	ErrAllocd = errors.New("allocd")
	// ErrDisagree is allocd handing out, round after round, items the cluster uses.
	ErrDisagree = errors.New("allocd keeps handing out addresses or ports the cluster uses")
	// ErrNotSynced is a request that came before the informers of the cluster synced.
	ErrNotSynced = errors.New("the informers of Services, IPAddresses and ServiceCIDRs have not synced yet")
	// ErrNoFamilies is the cluster's IP families not known yet (no default ServiceCIDR).
	ErrNoFamilies = errors.New("the cluster's IP families are not known: no ServiceCIDR \"kubernetes\" seen")
	// ErrAPIServer is a read of the API server that failed.
	ErrAPIServer = errors.New("the API server")
	// ErrBehind is allocd's ServiceCIDRs behind the cluster's: allocd handed out an
	// address from a ServiceCIDR the cluster is deleting (or that is not ready), or
	// found its ranges full while the cluster has a ready ServiceCIDR allocd lacks.
	// The bridge copies the cluster's ServiceCIDRs into allocd as they change.
	ErrBehind = errors.New("allocd's ServiceCIDRs are behind the cluster's (the bridge copies them)")
)

// admission is the allocation of one admission request.
type admission struct {
	w     *Webhook
	n     *need
	owner *allocdv1.Owner // provisional
	// self is the admitted Service as allocd's owner (an update: it has a UID), nil on
	// a create.
	self *allocdv1.Owner
	// wrote is set once allocd may hold something for owner.
	wrote bool
}

// run allocates what a.n needs. It returns nil when every need has its item, a
// kube-apiserver refusal (*apierrors.StatusError) when kube-apiserver would refuse the
// object, or another error (allocd's, wrapping ErrAllocd, ErrDisagree or ErrBehind).
func (a *admission) run(ctx context.Context) error {
	if a.n.refusal != nil {
		return a.refuseInOrder(ctx)
	}
	return a.rounds(ctx)
}

// rounds asks allocd until every need has its item: a refused item is taken back or
// over where it is this object's (refused), an item the cluster uses is given to its
// user and asked for again (check).
func (a *admission) rounds(ctx context.Context) error {
	for wasted := 0; wasted < maxRounds; {
		ips, ports := a.pending()
		before := len(ips) + len(ports)
		if before == 0 {
			return nil
		}
		if err := a.allocate(ctx, ips, ports); err != nil {
			again, err := a.refused(ctx, err)
			if err != nil || !again {
				return err
			}
		} else if err := a.check(ctx); err != nil {
			return err
		}
		if ips, ports := a.pending(); len(ips)+len(ports) >= before {
			wasted++
		}
	}
	return ErrDisagree
}

// refuseInOrder answers an object that kube-apiserver refuses for a node port (one
// asked for twice, or a health check node port that a port uses) as kube-apiserver
// does: it allocates the ClusterIPs and the node ports before that one first
// (allocateCreate, initNodePorts), so a taken address among them is its refusal; only
// then the node port's. What was allocated is released by the caller.
func (a *admission) refuseInOrder(ctx context.Context) error {
	ports := a.n.ports
	a.n.ports = ports[:a.n.refusalAt]
	err := a.rounds(ctx)
	a.n.ports = ports
	if err != nil {
		return err
	}
	return a.n.refusal
}

// pending are the needs without an item.
func (a *admission) pending() (ips []*ipNeed, ports []*portNeed) {
	for i := range a.n.ips {
		if !a.n.ips[i].got.IsValid() {
			ips = append(ips, &a.n.ips[i])
		}
	}
	for i := range a.n.ports {
		if a.n.ports[i].got == 0 {
			ports = append(ports, &a.n.ports[i])
		}
	}
	return ips, ports
}

// allocate asks allocd for ips and ports in one Allocate; when the ClusterIPs are some
// given and some any (a dual-stack Service that names one address), the others come
// in a second one (allocd's Allocate takes specific addresses or families).
func (a *admission) allocate(ctx context.Context, ips []*ipNeed, ports []*portNeed) error {
	var given, anyIP []*ipNeed
	for _, ip := range ips {
		if ip.want.IsValid() {
			given = append(given, ip)
		} else {
			anyIP = append(anyIP, ip)
		}
	}
	var fixed, anyPort []*portNeed
	for _, p := range ports {
		if p.want != 0 {
			fixed = append(fixed, p)
		} else {
			anyPort = append(anyPort, p)
		}
	}
	req := &allocdv1.AllocateRequest{Owner: a.owner, NodePortCount: int32(len(anyPort))}
	for _, ip := range given {
		req.ClusterIps = append(req.ClusterIps, ip.want.String())
	}
	for _, p := range fixed {
		req.NodePorts = append(req.NodePorts, p.want)
	}
	second := len(given) > 0 && len(anyIP) > 0
	switch {
	case len(given) == 0 && len(anyIP) > 0:
		families(req, anyIP)
	case len(given) == 0:
		req.NoClusterIp = true
	}
	first := append(given, anyIP...)
	if second {
		first = given
	}
	if err := a.call(ctx, req, first, append(fixed, anyPort...)); err != nil || !second {
		return err
	}
	req = &allocdv1.AllocateRequest{Owner: a.owner}
	families(req, anyIP)
	return a.call(ctx, req, anyIP, nil)
}

// families asks for one address of each family of ips, in their order.
func families(req *allocdv1.AllocateRequest, ips []*ipNeed) {
	req.IpFamilyPolicy = allocdv1.IPFamilyPolicy_IP_FAMILY_POLICY_SINGLE_STACK
	if len(ips) == 2 {
		req.IpFamilyPolicy = allocdv1.IPFamilyPolicy_IP_FAMILY_POLICY_REQUIRE_DUAL_STACK
	}
	for _, ip := range ips {
		f := allocdv1.IPFamily_IP_FAMILY_IPV4
		if ip.family == corev1.IPv6Protocol {
			f = allocdv1.IPFamily_IP_FAMILY_IPV6
		}
		req.IpFamilies = append(req.IpFamilies, f)
	}
}

// call makes one Allocate and hands its items to ips and ports, in the order allocd
// answers them (the addresses as asked, the given node ports, then the others).
func (a *admission) call(ctx context.Context, req *allocdv1.AllocateRequest, ips []*ipNeed,
	ports []*portNeed) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: not asked: %w", ErrAllocd, context.Cause(ctx))
	}
	a.wrote = true
	resp, err := a.w.allocd.Allocate(ctx, req)
	if err != nil {
		return err
	}
	if len(resp.GetClusterIps()) != len(ips) || len(resp.GetNodePorts()) != len(ports) {
		return fmt.Errorf("%w: Allocate answered %v %v for %d addresses and %d ports", ErrAllocd,
			resp.GetClusterIps(), resp.GetNodePorts(), len(ips), len(ports))
	}
	for i, s := range resp.GetClusterIps() {
		addr, ok := parseIP(s)
		if !ok {
			return fmt.Errorf("%w: Allocate answered address %q", ErrAllocd, s)
		}
		ips[i].got = addr
	}
	for i, p := range resp.GetNodePorts() {
		ports[i].got = p
	}
	return nil
}

// refused handles an Allocate that allocd refused. A specific item is asked for again
// (again) when it is this object's: held by the updated Service itself (moved to the
// provisional owner: takeBack), by an earlier invocation of the same admission or an
// earlier admission of the same name (moved over: takeOver), or by a Service of the
// cluster that no longer uses it (moved over: reclaim). One held by anyone else,
// outside allocd's ranges, or a full range, is kube-apiserver's refusal; the rest is
// allocd's error.
func (a *admission) refused(ctx context.Context, err error) (again bool, _ error) {
	var held *client.AlreadyAllocatedError
	var e *client.Error
	switch {
	case errors.As(err, &held) && errors.As(err, &e):
		ip, port := a.needOf(held.Resource)
		if ip == nil && port == nil {
			return false, fmt.Errorf("%w: refused %s, which was not asked for: %w", ErrAllocd,
				held.Resource, err)
		}
		holder := &allocdv1.Owner{Namespace: e.Metadata["holder_namespace"], Name: e.Metadata["holder_name"],
			Uid: held.HolderUID}
		switch {
		case a.self != nil && holder.Uid == a.self.Uid:
			return true, a.takeBack(ctx)
		case a.ours(holder):
			return true, a.takeOver(ctx, holder)
		case a.w.cluster.known(holder.Uid):
			if again, err := a.reclaim(ctx, holder, held.Resource); again || err != nil {
				return again, err
			}
		}
		if ip != nil {
			return false, a.n.ipRefused(*ip, msgIPAllocated)
		}
		return false, a.n.portRefused(*port, msgPortAllocated)
	case errors.Is(err, client.ErrInvalid) && errors.As(err, &e) &&
		e.Reason == allocdv1.ErrorReason_NOT_IN_RANGE.String():
		return false, a.outside(e, err)
	case errors.Is(err, client.ErrTerminating) && errors.As(err, &e):
		if ip, _ := a.needOf(e.Metadata["item"]); ip != nil {
			return false, a.n.ipRefused(*ip, msgIPOtherNetwork)
		}
	case errors.Is(err, client.ErrFull):
		return false, a.full(ctx, err)
	}
	if errors.Is(err, ErrAllocd) {
		return false, err
	}
	return false, fmt.Errorf("%w: %w", ErrAllocd, err)
}

// ours reports whether an item's holder is a provisional owner for the same object: an
// earlier invocation of this admission (reinvoked after another webhook changed the
// object, with a request uid of its own), or an earlier admission of the same
// namespace and name (a create retried after a refusal that came after admission, an
// update retried after a conflict, a create of the same generateName).
func (a *admission) ours(holder *allocdv1.Owner) bool {
	return strings.HasPrefix(holder.Uid, ProvisionalPrefix) && holder.Uid != a.owner.Uid &&
		holder.Namespace == a.owner.Namespace && holder.Name == a.owner.Name
}

// takeOver moves to this admission's provisional owner, in one Transfer, every item it
// asks for that from, an earlier provisional owner of the same object, holds. Left
// where it is, an item would keep from's allocate_time, and the bridge's sweeper would
// free it once from's grace has passed (no Service of the name holds it yet) while the
// object that carries it may still be stored; moved, its grace starts again with this
// admission. The items are settled as held (nothing to check: they were checked when
// from got them). From holding none of them any more (the sweeper freed them, or the
// bridge bound them meanwhile: allocd's NOT_OWNER), they are asked for again.
func (a *admission) takeOver(ctx context.Context, from *allocdv1.Owner) error {
	holds, err := a.holdings(ctx, from.Uid)
	if err != nil {
		return err
	}
	ips, ports := a.wanted(holds, nil)
	if _, err := a.transfer(ctx, from, ips, ports); err != nil || len(ips)+len(ports) == 0 {
		return err
	}
	a.settle(ips, ports, true)
	return nil
}

// reclaim takes items this admission asks for from holder, the owner in allocd of a
// Service of this cluster (Cluster.known), when that Service no longer uses them: it
// was deleted (kubectl replace --force, a Service recreated with its pinned address)
// or changed (a node port moved to another Service), and the bridge has not released
// them yet. The API server is read at its current state (a quorum read): a Service of
// holder's namespace and name that uses item, whatever its UID, keeps it (again false:
// kube-apiserver refuses it too). Else every wanted item holder holds and that Service
// does not use moves to this admission's provisional owner, in one Transfer that
// allocd applies only while holder still holds each (the bridge releasing holder's
// items meanwhile: NOT_OWNER, and they are asked for again, free). The bridge's later
// release of holder then finds nothing of them. The items are checked against the
// cluster as allocd's answers are.
func (a *admission) reclaim(ctx context.Context, holder *allocdv1.Owner, item string) (again bool,
	_ error) {
	svc, err := a.w.cluster.serviceNow(ctx, holder.Namespace, holder.Name)
	if err != nil {
		return false, err
	}
	var used []string
	if svc != nil {
		used = serviceItems(svc)
	}
	if slices.Contains(used, item) {
		return false, nil
	}
	holds, err := a.holdings(ctx, holder.Uid)
	if err != nil {
		return false, err
	}
	ips, ports := a.wanted(holds, used)
	moved, err := a.transfer(ctx, holder, ips, ports)
	if err != nil || !moved {
		return true, err
	}
	a.w.log.Info("took back from a Service that no longer uses them", "service",
		a.owner.Namespace+"/"+a.owner.Name, "owner_uid", a.owner.Uid, "from",
		holder.Namespace+"/"+holder.Name, "from_uid", holder.Uid, "cluster_ips", ips, "node_ports", ports)
	a.settle(ips, ports, false)
	return true, nil
}

// holdings returns the ClusterIPs and node ports owner uid holds in allocd.
func (a *admission) holdings(ctx context.Context, uid string) ([]string, error) {
	var out []string
	req := &allocdv1.ListAllocationsRequest{OwnerUid: uid, PageSize: 100}
	for {
		resp, err := a.w.allocd.ListAllocations(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("%w: list the allocations of %s: %w", ErrAllocd, uid, err)
		}
		for _, al := range resp.GetAllocations() {
			if ip := al.GetClusterIp(); ip != "" {
				out = append(out, ip)
			} else {
				out = append(out, strconv.Itoa(int(al.GetNodePort())))
			}
		}
		if resp.GetNextPageToken() == "" {
			return out, nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// wanted returns the specific items this admission still needs that are among holds
// and not among used.
func (a *admission) wanted(holds, used []string) (ips []string, ports []int32) {
	ipNeeds, portNeeds := a.pending()
	for _, ip := range ipNeeds {
		if s := ip.want.String(); ip.want.IsValid() && slices.Contains(holds, s) && !slices.Contains(used, s) {
			ips = append(ips, s)
		}
	}
	for _, p := range portNeeds {
		s := strconv.Itoa(int(p.want))
		if p.want != 0 && slices.Contains(holds, s) && !slices.Contains(used, s) &&
			!slices.Contains(ports, p.want) {
			ports = append(ports, p.want)
		}
	}
	return ips, ports
}

// transfer moves ips and ports from one owner to this admission's provisional owner;
// moved is false when from no longer holds one of them (allocd's NOT_OWNER: nothing
// moved), or there is nothing to move.
func (a *admission) transfer(ctx context.Context, from *allocdv1.Owner, ips []string, ports []int32) (
	moved bool, _ error) {
	if len(ips)+len(ports) == 0 {
		return false, nil
	}
	if ctx.Err() != nil {
		return false, fmt.Errorf("%w: not asked: %w", ErrAllocd, context.Cause(ctx))
	}
	a.wrote = true
	_, err := a.w.allocd.Transfer(ctx, &allocdv1.TransferRequest{From: from, To: a.owner, ClusterIps: ips,
		NodePorts: ports})
	switch {
	case errors.Is(err, client.ErrNotOwner):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("%w: transfer %v %v from %s: %w", ErrAllocd, ips, ports, from.Uid, err)
	}
	return true, nil
}

// settle gives the needs of ips and ports their item, held (checked already) or not.
func (a *admission) settle(ips []string, ports []int32, held bool) {
	for _, s := range ips {
		if ip, _ := a.needOf(s); ip != nil {
			ip.got, ip.held = ip.want, held
		}
	}
	for _, p := range ports {
		for i := range a.n.ports {
			if pn := &a.n.ports[i]; pn.want == p && pn.got == 0 {
				pn.got, pn.held = p, held
			}
		}
	}
}

// takeBack moves to the provisional owner, in one Transfer, every item this update
// asks for that the updated Service itself holds in allocd (it gave them up in an
// earlier update the bridge has not seen yet), so that the bridge's release of the
// earlier state cannot free what this update uses. Freed or moved meanwhile (allocd's
// NOT_OWNER), they are asked for again.
func (a *admission) takeBack(ctx context.Context) error {
	holds, err := a.holdings(ctx, a.self.Uid)
	if err != nil {
		return err
	}
	ips, ports := a.wanted(holds, nil)
	moved, err := a.transfer(ctx, a.self, ips, ports)
	if err != nil || !moved {
		return err
	}
	a.settle(ips, ports, false)
	return nil
}

// needOf finds the pending need of a specific item, as allocd names it.
func (a *admission) needOf(item string) (*ipNeed, *portNeed) {
	if addr, ok := parseIP(item); ok {
		for i := range a.n.ips {
			if ip := &a.n.ips[i]; ip.want == addr && !ip.got.IsValid() {
				return ip, nil
			}
		}
		return nil, nil
	}
	p, err := strconv.Atoi(item)
	if err != nil {
		return nil, nil
	}
	for i := range a.n.ports {
		if pn := &a.n.ports[i]; pn.want == int32(p) && pn.got == 0 {
			return nil, pn
		}
	}
	return nil, nil
}

// outside is kube-apiserver's refusal of a specific item allocd has no range for.
func (a *admission) outside(e *client.Error, err error) error {
	ip, port := a.needOf(e.Metadata["item"])
	switch {
	case ip != nil:
		prefixes, _ := a.w.cluster.readyPrefixes()
		why, ok := ipOutside(ip.want, prefixes)
		if !ok {
			return fmt.Errorf("%w: allocd has no range for %s, which a ServiceCIDR of the cluster holds: %w",
				ErrAllocd, ip.want, err)
		}
		return a.n.ipRefused(*ip, why)
	case port != nil:
		return a.n.portRefused(*port, portOutside(e.Metadata["range"]))
	}
	return fmt.Errorf("%w: %w", ErrAllocd, err)
}

// full is kube-apiserver's error when a range has nothing left: the ClusterIP range's
// when the full range is a CIDR, else the node ports'. A full ClusterIP range while a
// ServiceCIDR kube-apiserver allocates from is missing from allocd (the bridge has not
// copied it yet) is not kube-apiserver's answer: kube-apiserver would allocate from
// it. That is ErrBehind, and the failure policy decides.
func (a *admission) full(ctx context.Context, err error) error {
	var f *client.FullError
	if errors.As(err, &f) {
		for _, v := range f.Violations {
			if strings.Contains(v.Subject, "/") {
				return a.ipFull(ctx, err)
			}
		}
	}
	_, ports := a.pending()
	for _, p := range ports {
		if p.want == 0 {
			return a.n.portFull(*p)
		}
	}
	return a.ipFull(ctx, err)
}

// ipFull is kube-apiserver's refusal of a full ClusterIP range, unless allocd lacks a
// ServiceCIDR of the cluster of a family asked for.
func (a *admission) ipFull(ctx context.Context, err error) error {
	ips, _ := a.pending()
	var fams []corev1.IPFamily
	for _, ip := range ips {
		fams = append(fams, ip.family)
	}
	missing, lerr := a.missingCIDR(ctx, fams)
	switch {
	case lerr != nil:
		return fmt.Errorf("%w: %w; list its ServiceCIDRs: %w", ErrAllocd, err, lerr)
	case missing != "":
		return fmt.Errorf("%w: allocd's ranges are full and it lacks %s: %w", ErrBehind, missing, err)
	}
	return a.n.ipFull()
}

// missingCIDR names a CIDR (and its ServiceCIDR) of families that kube-apiserver
// allocates from and that no ready ServiceCIDR of allocd covers; "" when there is none.
func (a *admission) missingCIDR(ctx context.Context, fams []corev1.IPFamily) (string, error) {
	have, err := a.w.allocd.ListServiceCIDRs(ctx)
	if err != nil {
		return "", err
	}
	var covered []netip.Prefix
	for _, sc := range have {
		if sc.GetState() != allocdv1.ServiceCIDRState_SERVICE_CIDR_STATE_READY {
			continue
		}
		for _, c := range sc.GetCidrs() {
			if p, err := netip.ParsePrefix(c); err == nil {
				covered = append(covered, p.Masked())
			}
		}
	}
	prefixes, names := a.w.cluster.readyPrefixes()
	for i, p := range prefixes {
		if !slices.Contains(fams, familyOfAddr(p.Addr())) {
			continue
		}
		if !slices.ContainsFunc(covered, func(q netip.Prefix) bool {
			return q.Bits() <= p.Bits() && q.Contains(p.Addr())
		}) {
			return fmt.Sprintf("ServiceCIDR %s (%s)", names[i], p), nil
		}
	}
	return "", nil
}

// check looks at the items allocd just gave against the cluster's: an address or port
// the cluster uses (allocd has not adopted it yet) is moved to the Service that uses
// it, or parked for it, and asked for again; one the user asked for is kube-apiserver's
// refusal, as it would be without the webhook.
func (a *admission) check(ctx context.Context) error {
	for i := range a.n.ips {
		ip := &a.n.ips[i]
		if !ip.got.IsValid() {
			continue
		}
		if err := a.usable(ip); err != nil {
			return err
		}
		if ip.held {
			continue
		}
		holder, used := a.w.cluster.ipUser(ip.got)
		if !used || a.self != nil && holder != nil && holder.Uid == a.self.Uid {
			continue
		}
		if err := a.giveAway(ctx, holder, ip.got.String(), 0); err != nil {
			return err
		}
		if ip.want.IsValid() {
			return a.n.ipRefused(*ip, msgIPAllocated)
		}
		ip.got = netip.Addr{}
	}
	for i := range a.n.ports {
		p := &a.n.ports[i]
		if p.got == 0 || p.held {
			continue
		}
		holder, used := a.w.cluster.portUser(p.got, a.n.svc.Namespace, a.n.svc.Name)
		if !used {
			continue
		}
		if err := a.giveAway(ctx, holder, "", p.got); err != nil {
			return err
		}
		if p.want != 0 {
			return a.n.portRefused(*p, msgPortAllocated)
		}
		p.got = 0
	}
	return nil
}

// usable refuses an address that kube-apiserver would not allocate, as none of the
// ServiceCIDRs it allocates from holds it (one being deleted, or not ready, or none):
// the user's is kube-apiserver's refusal, in its words; one allocd picked means allocd
// allocates from a ServiceCIDR the cluster no longer does (ErrBehind).
func (a *admission) usable(ip *ipNeed) error {
	prefixes, _ := a.w.cluster.readyPrefixes()
	why, refused := ipOutside(ip.got, prefixes)
	switch {
	case !refused:
		return nil
	case ip.want.IsValid():
		return a.n.ipRefused(*ip, why)
	}
	return fmt.Errorf("%w: allocd gave %s, which no ServiceCIDR the cluster allocates from holds (one "+
		"being deleted, or not ready)", ErrBehind, ip.got)
}

// giveAway moves ip or port from the provisional owner to holder, the Service of the
// cluster that uses it, or to a parked owner named after the address's IPAddress
// parent when that Service is not known.
func (a *admission) giveAway(ctx context.Context, holder *allocdv1.Owner, ip string, port int32) error {
	to := holder
	if to == nil {
		to = a.parked(ip)
	}
	req := &allocdv1.TransferRequest{From: a.owner, To: to}
	item := ip
	if ip != "" {
		req.ClusterIps = []string{ip}
	} else {
		req.NodePorts = []int32{port}
		item = strconv.Itoa(int(port))
	}
	_, err := a.w.allocd.Transfer(ctx, req)
	switch {
	case err == nil:
		a.w.log.Info("allocd gave an item the cluster uses; moved to its holder", "item", item,
			"service", a.owner.Namespace+"/"+a.owner.Name, "to", to.Namespace+"/"+to.Name, "to_uid", to.Uid)
		a.w.m.disagreed.Inc()
		return nil
	case errors.Is(err, client.ErrNotOwner):
		return nil // the bridge bound it to its holder meanwhile
	}
	return fmt.Errorf("%w: transfer %s to %s: %w", ErrAllocd, item, to.Uid, err)
}

// parked is the owner an address the cluster uses for an unknown holder moves to: the
// parent of its IPAddress, under a provisional UID.
func (a *admission) parked(ip string) *allocdv1.Owner {
	ns, name := a.w.cluster.ipParent(ip)
	return &allocdv1.Owner{Namespace: ns, Name: name, Uid: a.owner.Uid + parkedSegment + ip}
}
