package admit

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
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

// maxRounds bounds how often one admission asks allocd again after allocd gave it an
// item the cluster uses (or one an earlier invocation holds): allocd that far behind
// the cluster is reported as an error, and the failure policy decides.
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
// object, or another error (allocd's, wrapping ErrAllocd or ErrDisagree).
func (a *admission) run(ctx context.Context) error {
	if a.n.refusal != nil {
		return a.n.refusal
	}
	for range maxRounds {
		ips, ports := a.pending()
		if len(ips)+len(ports) == 0 {
			return nil
		}
		if err := a.allocate(ctx, ips, ports); err != nil {
			again, err := a.refused(ctx, err)
			if err != nil || !again {
				return err
			}
			continue
		}
		if err := a.check(ctx); err != nil {
			return err
		}
	}
	return ErrDisagree
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

// refused handles an Allocate that allocd refused: a specific item held by this
// Service (an update: moved to the provisional owner) or by an earlier invocation of
// the same admission (kept where it is) is asked again (again); one held by someone
// else, outside allocd's ranges, or a full range, is kube-apiserver's refusal; the rest
// is allocd's error.
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
		if a.self != nil && held.HolderUID == a.self.Uid {
			return true, a.takeBack(ctx, held.Resource, ip, port)
		}
		if a.ours(e.Metadata["holder_namespace"], e.Metadata["holder_name"], held.HolderUID) {
			if ip != nil {
				ip.got, ip.held = ip.want, true
			} else {
				port.got, port.held = port.want, true
			}
			return true, nil
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
		return false, a.full(err)
	}
	if errors.Is(err, ErrAllocd) {
		return false, err
	}
	return false, fmt.Errorf("%w: %w", ErrAllocd, err)
}

// ours reports whether an item's holder is a provisional owner for the same object:
// an earlier invocation of this admission (reinvoked after another webhook changed the
// object, with a request uid of its own).
func (a *admission) ours(namespace, name, uid string) bool {
	return strings.HasPrefix(uid, ProvisionalPrefix) && uid != a.owner.Uid &&
		namespace == a.owner.Namespace && name == a.owner.Name
}

// takeBack moves an item that the updated Service itself holds in allocd (it gave it up
// in an earlier update the bridge has not seen yet) to the provisional owner, so that
// the bridge's release of the earlier state cannot free what this update uses.
func (a *admission) takeBack(ctx context.Context, item string, ip *ipNeed, port *portNeed) error {
	req := &allocdv1.TransferRequest{From: a.self, To: a.owner}
	if ip != nil {
		req.ClusterIps = []string{item}
	} else {
		req.NodePorts = []int32{port.want}
	}
	if _, err := a.w.allocd.Transfer(ctx, req); err != nil && !errors.Is(err, client.ErrNotOwner) {
		return fmt.Errorf("%w: transfer %s from %s: %w", ErrAllocd, item, a.self.Uid, err)
	}
	// Moved, or freed meanwhile (ErrNotOwner): asked for again.
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
		why, ok := ipOutside(ip.want, a.w.cluster.prefixes())
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
// when the full range is a CIDR, else the node ports'.
func (a *admission) full(err error) error {
	var f *client.FullError
	if errors.As(err, &f) {
		for _, v := range f.Violations {
			if strings.Contains(v.Subject, "/") {
				return a.n.ipFull()
			}
		}
	}
	_, ports := a.pending()
	for _, p := range ports {
		if p.want == 0 {
			return a.n.portFull(*p)
		}
	}
	return a.n.ipFull()
}

// check looks at the items allocd just gave against the cluster's: an address or port
// the cluster uses (allocd has not adopted it yet) is moved to the Service that uses
// it, or parked for it, and asked for again; one the user asked for is kube-apiserver's
// refusal, as it would be without the webhook.
func (a *admission) check(ctx context.Context) error {
	for i := range a.n.ips {
		ip := &a.n.ips[i]
		if !ip.got.IsValid() || ip.held {
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
