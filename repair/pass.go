package repair

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/allocd/allocd/allocator"
)

// pass runs one pass of term t (passes are serialized) and, unless dryRun, keeps its
// report and its leak candidates if t is still the current term.
func (c *Controller) pass(ctx context.Context, t *term, dryRun bool) (*Report, error) {
	c.passMu.Lock()
	defer c.passMu.Unlock()
	rep := &Report{Start: time.Now(), DryRun: dryRun, Counts: map[Reason]int64{}}
	p := &passRun{c: c, rep: rep, dry: dryRun, ranges: c.store.RangeSet()}
	err := p.run(ctx)
	rep.Duration = time.Since(rep.Start)
	result := "ok"
	switch {
	case errors.Is(err, errStopped):
		result, err = "stopped", nil
	case err != nil:
		result = "error"
		rep.Err = err
	}
	if errors.Is(err, ErrNoSnapshot) {
		return rep, err // not a pass: nothing to judge against
	}
	c.metrics.pass(rep.Duration.Seconds(), result)
	if !dryRun {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.term != t {
			// The term ended during the pass: its strikes belong to no term.
			return rep, err
		}
		c.last = rep
		if p.next != nil {
			c.candidates = p.next
			byRange := map[string]int{}
			for _, cd := range p.next {
				byRange[cd.al.Range]++
			}
			c.metrics.leakCandidates(c.store.RangeSet().Names(), byRange)
		}
	}
	return rep, err
}

// errStopped ends a pass early because a range is full; the report says which.
var errStopped = errors.New("repair pass stopped")

// passRun is the state of one pass.
type passRun struct {
	c      *Controller
	rep    *Report
	dry    bool
	ranges allocator.RangeSet

	// stale is set when a snapshot newer than snap was accepted (by any replica)
	// since snap was: the pass then reports, but writes nothing it would judge from
	// snap and counts no strikes.
	stale bool

	snap   *accepted
	allocs []allocator.Allocation
	// used marks the allocations some Service uses.
	used []bool
	// claims are the in-range items the snapshot uses, in snapshot order.
	claims []claim
	// slots indexes both by item: one map for the two, the biggest cost of a pass
	// after reading etcd.
	slots map[allocator.Item]slot
	// next are the leak candidates after this pass; nil if it did not get that far.
	next map[allocator.Item]*candidate
}

// slot is what a pass knows of one item: its allocation and its claim, -1 for none.
type slot struct {
	alloc, claim int32
}

// claim is one item used by one or more Services of the snapshot.
type claim struct {
	item  allocator.Item
	rng   string
	alloc int32 // index in allocs, -1 when not allocated
	first user
	more  []user // other Services using it: duplicates
}

// user is a Service using an item, with the address as it wrote it.
type user struct {
	svc int32
	raw string
}

func (p *passRun) run(ctx context.Context) error {
	snap, err := p.c.snapshotForPass(ctx)
	if err != nil {
		return err
	}
	p.snap = snap
	p.rep.SnapshotRevision = snap.Revision
	_, p.allocs, err = p.c.store.List(ctx)
	if err != nil {
		return fmt.Errorf("list allocations: %w", err)
	}
	p.slots = make(map[allocator.Item]slot, len(p.allocs)+len(p.allocs)/8)
	for i := range p.allocs {
		p.slots[p.allocs[i].Item] = slot{alloc: int32(i), claim: -1}
	}
	p.used = make([]bool, len(p.allocs))
	p.claims = make([]claim, 0, len(p.allocs))
	if err := p.collect(); err != nil {
		return err
	}
	if err := p.checkCurrent(ctx); err != nil {
		return err
	}
	for i := range p.claims {
		if err := p.check(ctx, &p.claims[i]); err != nil {
			return err
		}
	}
	// Again just before releases: a newer snapshot may have been accepted meanwhile.
	if err := p.checkCurrent(ctx); err != nil {
		return err
	}
	if p.stale {
		return nil // candidates stay as they were: no strike counted, none lost
	}
	return p.leaks(ctx)
}

// checkCurrent reads the last accepted snapshot revision of the cluster
// (<prefix>/repair/snapshot-revision, a linearizable read) and marks the pass stale,
// with a SnapshotStale finding, if it is newer than the snapshot in hand: another
// replica accepted a snapshot this one does not have (it led, or took a push, while
// this replica did not lead). Judging leaks against the older snapshot could free an
// allocation that a Service of the newer one uses.
func (p *passRun) checkCurrent(ctx context.Context) error {
	if p.stale {
		return nil
	}
	last, err := p.c.acceptedRevision(ctx)
	if err != nil {
		return err
	}
	if last <= p.snap.Revision {
		return nil
	}
	if cur := p.c.snapshot(); cur != nil && cur.Revision >= last {
		// This replica accepted the newer snapshot while the pass ran: the pass's
		// snapshot was the newest when it started, and the next pass judges the new
		// one. (Counting this pass stale would let frequent pushes stop every pass.)
		return nil
	}
	p.stale = true
	p.add(Finding{Reason: SnapshotStale, Message: fmt.Sprintf(
		"service snapshot revision %d is older than revision %d, accepted by another replica: "+
			"no Service repaired and no leak judged until that snapshot (or a newer one) is pushed here",
		p.snap.Revision, last)})
	return nil
}

// collect rebuilds the expected state: one claim per item the snapshot uses, and a
// finding for each address or port that cannot be used.
func (p *passRun) collect() error {
	svcs := p.snap.Services
	for i := range svcs {
		svc := &svcs[i]
		for _, raw := range svc.ClusterIPs {
			if raw == "" || raw == "None" {
				continue // headless
			}
			a, err := netip.ParseAddr(raw)
			if err != nil || a.Zone() != "" {
				p.add(Finding{Reason: ClusterIPNotValid, ClusterIP: raw, Service: owner(svc),
					Message: fmt.Sprintf("Cluster IP %s is not a valid IP; please recreate service", raw)})
				continue
			}
			if err := p.claimItem(int32(i), allocator.IP(a), raw); err != nil {
				return err
			}
		}
		for _, np := range svc.NodePorts {
			if np.Port != 0 {
				if err := p.claimItem(int32(i), allocator.Port(np.Port), ""); err != nil {
					return err
				}
			}
		}
		if svc.HealthCheckNodePort != 0 {
			if err := p.claimItem(int32(i), allocator.Port(svc.HealthCheckNodePort), ""); err != nil {
				return err
			}
		}
	}
	return nil
}

// claimItem records that Service svc uses it, or reports why it cannot.
func (p *passRun) claimItem(svc int32, it allocator.Item, raw string) error {
	sl, known := p.slots[it]
	if known && sl.claim >= 0 {
		cl := &p.claims[sl.claim]
		last := cl.first.svc
		if n := len(cl.more); n > 0 {
			last = cl.more[n-1].svc
		}
		if last != svc { // the same port under two protocols counts once
			cl.more = append(cl.more, user{svc: svc, raw: raw})
		}
		return nil
	}
	if known { // allocated, so in its range: no need to ask
		p.slots[it] = slot{alloc: sl.alloc, claim: int32(len(p.claims))}
		p.claims = append(p.claims, claim{item: it, rng: p.allocs[sl.alloc].Range, alloc: sl.alloc, first: user{svc: svc, raw: raw}})
		return nil
	}
	rng, err := p.ranges.Of(it)
	if err != nil {
		s := &p.snap.Services[svc]
		var nir *allocator.NotInRangeError
		switch {
		case it.Kind == allocator.KindClusterIP && errors.Is(err, allocator.ErrNoRange):
			p.add(Finding{Reason: ClusterIPNotValid, ClusterIP: raw, Service: owner(s),
				Message: fmt.Sprintf("Cluster IP %s is not a valid IP: no service CIDR of its family; please recreate service", raw)})
		case errors.As(err, &nir) && it.Kind == allocator.KindClusterIP:
			p.add(Finding{Reason: ClusterIPOutOfRange, Range: nir.Range, ClusterIP: raw, Service: owner(s),
				Message: fmt.Sprintf("Cluster IP %s is not within the service CIDR %s; please recreate service", raw, nir.Range)})
		case errors.As(err, &nir) || errors.Is(err, allocator.ErrNoRange) || errors.Is(err, allocator.ErrInvalid):
			rng := p.portRange()
			if nir != nil {
				rng = nir.Range
			}
			p.add(Finding{Reason: PortOutOfRange, Range: rng, NodePort: it.Port, Service: owner(s),
				Message: fmt.Sprintf("Port %d is not within the port range %s; please recreate service", it.Port, rng)})
		default:
			return fmt.Errorf("range of %v: %w", it, err)
		}
		return nil
	}
	p.slots[it] = slot{alloc: -1, claim: int32(len(p.claims))}
	p.claims = append(p.claims, claim{item: it, rng: rng, alloc: -1, first: user{svc: svc, raw: raw}})
	return nil
}

// portRange names the node port range.
func (p *passRun) portRange() string {
	return p.ranges.NodePort.String()
}

// check compares one claim with etcd and repairs what it can.
func (p *passRun) check(ctx context.Context, cl *claim) error {
	held := cl.alloc >= 0
	var al *allocator.Allocation
	if held {
		p.used[cl.alloc] = true
		al = &p.allocs[cl.alloc]
	}
	svcs := p.snap.Services
	ip := cl.item.Kind == allocator.KindClusterIP

	if p.ranges.IsReserved(cl.item) {
		return p.checkReserved(ctx, cl, al)
	}

	// The holder is the Service etcd says holds it, else the first in the snapshot.
	holder := cl.first
	if held {
		for _, u := range cl.more {
			if svcs[u.svc].UID == al.Owner.UID && svcs[holder.svc].UID != al.Owner.UID {
				holder = u
			}
		}
	}
	for _, u := range append([]user{cl.first}, cl.more...) {
		if u.svc == holder.svc {
			continue
		}
		h := &svcs[holder.svc]
		p.add(p.itemFinding(reasonFor(ip, ClusterIPAlreadyAllocated, PortAlreadyAllocated), cl, u,
			fmt.Sprintf("%s was assigned to multiple services (also %s/%s); please recreate service",
				describe(cl.item, u.raw), h.Namespace, h.Name)))
	}
	hs := &svcs[holder.svc]

	if !held {
		f := p.itemFinding(reasonFor(ip, ClusterIPNotAllocated, PortNotAllocated), cl, holder,
			fmt.Sprintf("%s is not allocated; repairing", describe(cl.item, holder.raw)))
		switch {
		case p.stale:
			f.Message = fmt.Sprintf("%s is not allocated; not repaired: the snapshot is stale", describe(cl.item, holder.raw))
		case p.dry:
			f.Message = fmt.Sprintf("%s is not allocated; would repair (dry run)", describe(cl.item, holder.raw))
		default:
			return p.assign(ctx, f, cl, holder, owner(hs))
		}
		p.add(f)
		return nil
	}

	if al.Owner.UID == hs.UID {
		return nil
	}
	f := p.itemFinding(reasonFor(ip, ClusterIPWrongOwner, PortWrongOwner), cl, holder,
		fmt.Sprintf("%s is allocated to %s, not to the service that uses it; repairing", describe(cl.item, holder.raw), al.Owner))
	switch {
	case al.ModRevision > p.snap.receipt.Revision:
		f.Message = fmt.Sprintf("%s is allocated to %s, which is newer (revision %d) than the snapshot (received at revision %d); not corrected",
			describe(cl.item, holder.raw), al.Owner, al.ModRevision, p.snap.receipt.Revision)
	case len(cl.more) > 0:
		f.Message = fmt.Sprintf("%s is allocated to %s and used by several services; not reassigned",
			describe(cl.item, holder.raw), al.Owner)
	default:
		return p.reassign(ctx, f, cl, holder, *al, owner(hs))
	}
	p.add(f)
	return nil
}

// checkReserved handles the address or port reserved for the kubernetes Service
// (allocator.KubernetesOwner): every other Service using it is reported; if nothing
// holds it, it is allocated to the kubernetes Service again; if an owner that no
// Service of the snapshot is holds it, it is given back to the kubernetes Service
// (with the same fence as any reassign). A leak is never judged for it.
func (p *passRun) checkReserved(ctx context.Context, cl *claim, al *allocator.Allocation) error {
	svcs := p.snap.Services
	ip := cl.item.Kind == allocator.KindClusterIP
	kube := allocator.KubernetesOwner
	isKube := func(s *Service) bool { return s.Namespace == kube.Namespace && s.Name == kube.Name }
	users := append([]user{cl.first}, cl.more...)
	// The finding about the reservation itself names the kubernetes Service of the
	// snapshot if there is one, else the first user.
	ku := cl.first
	for _, u := range users {
		s := &svcs[u.svc]
		if isKube(s) {
			ku = u
			continue
		}
		p.add(p.itemFinding(reasonFor(ip, ClusterIPAlreadyAllocated, PortAlreadyAllocated), cl, u,
			fmt.Sprintf("%s is reserved for the default/kubernetes service; please recreate service", describe(cl.item, u.raw))))
	}
	what := describe(cl.item, ku.raw)
	if al == nil {
		f := p.itemFinding(reasonFor(ip, ClusterIPNotAllocated, PortNotAllocated), cl, ku,
			fmt.Sprintf("%s, reserved for the default/kubernetes service, is not allocated; repairing", what))
		switch {
		case p.dry:
			f.Message = fmt.Sprintf("%s, reserved for the default/kubernetes service, is not allocated; would repair (dry run)", what)
		default:
			// Not judged from the snapshot: the reservation holds whatever the snapshot
			// says, so a stale snapshot does not stop it.
			return p.assign(ctx, f, cl, ku, kube)
		}
		p.add(f)
		return nil
	}
	if al.Owner.UID == kube.UID {
		return nil
	}
	for _, u := range users {
		if svcs[u.svc].UID == al.Owner.UID {
			return nil // a Service of the snapshot holds it: reported above
		}
	}
	f := p.itemFinding(reasonFor(ip, ClusterIPWrongOwner, PortWrongOwner), cl, ku,
		fmt.Sprintf("%s, reserved for the default/kubernetes service, is allocated to %s; repairing", what, al.Owner))
	if al.ModRevision > p.snap.receipt.Revision {
		f.Message = fmt.Sprintf("%s, reserved for the default/kubernetes service, is allocated to %s, which is newer (revision %d) than the snapshot (received at revision %d); not corrected",
			what, al.Owner, al.ModRevision, p.snap.receipt.Revision)
		p.add(f)
		return nil
	}
	return p.reassign(ctx, f, cl, ku, *al, kube)
}

// assign repairs a claim that is not allocated by allocating it to o, and records f
// (repaired or not). Only a full range (which stops the pass) or the end of ctx is
// an error: anything else that keeps the item from o is a finding not repaired, and
// the pass goes on with the next claim, so that one Service cannot stop every pass.
func (p *passRun) assign(ctx context.Context, f Finding, cl *claim, u user, o allocator.Owner) error {
	what := describe(cl.item, u.raw)
	_, err := p.c.store.Assign(ctx, o, cl.item)
	var ae *allocator.AllocatedError
	switch {
	case err == nil:
		f.Repaired = true
	case errors.As(err, &ae):
		f.Message = fmt.Sprintf("%s is not allocated, but was allocated to %s since the pass read etcd; not repaired",
			what, ae.Holder)
	case errors.Is(err, allocator.ErrFull):
		p.add(f)
		return p.full(cl, u)
	case ctx.Err() != nil:
		return fmt.Errorf("allocate %v to %s/%s: %w", cl.item, o.Namespace, o.Name, err)
	default:
		f.Message = fmt.Sprintf("%s is not allocated, and allocating it to %s failed; not repaired: %v", what, o, err)
	}
	p.add(f)
	return nil
}

// reassign repairs a claim held by the wrong owner by moving al to o (if it did not
// change since the pass read it), and records f. Like assign, only the end of ctx is
// an error.
func (p *passRun) reassign(ctx context.Context, f Finding, cl *claim, u user, al allocator.Allocation, o allocator.Owner) error {
	what := describe(cl.item, u.raw)
	switch {
	case p.stale:
		f.Message = fmt.Sprintf("%s is allocated to %s, not to %s; not reassigned: the snapshot is stale", what, al.Owner, o)
		p.add(f)
		return nil
	case p.dry:
		f.Message = fmt.Sprintf("%s is allocated to %s, not to %s; would reassign (dry run)", what, al.Owner, o)
		p.add(f)
		return nil
	}
	_, err := p.c.store.Reassign(ctx, al, o)
	switch {
	case err == nil:
		f.Repaired = true
	case errors.Is(err, allocator.ErrConflict) && ctx.Err() == nil:
		f.Message = fmt.Sprintf("%s is allocated to %s, but changed since the pass read it, or kept changing; not reassigned: %v",
			what, al.Owner, err)
	case ctx.Err() != nil:
		return fmt.Errorf("reassign %v to %s/%s: %w", cl.item, o.Namespace, o.Name, err)
	default:
		f.Message = fmt.Sprintf("%s is allocated to %s, and reassigning it to %s failed; not reassigned: %v", what, al.Owner, o, err)
	}
	p.add(f)
	return nil
}

// full reports a full range and stops the pass.
func (p *passRun) full(cl *claim, u user) error {
	s := &p.snap.Services[u.svc]
	f := Finding{Range: cl.rng, Service: owner(s)}
	if cl.item.Kind == allocator.KindClusterIP {
		f.Reason, f.ClusterIP = ServiceCIDRFull, u.raw
		f.Message = fmt.Sprintf("Service CIDR %s is full; you must widen the CIDR in order to create new services", cl.rng)
	} else {
		f.Reason, f.NodePort = PortRangeFull, cl.item.Port
		f.Message = fmt.Sprintf("Port range %s is full; you must widen the port range in order to create new services", cl.rng)
	}
	p.add(f)
	p.rep.Err = fmt.Errorf("%s: %w", f.Message, allocator.ErrFull)
	return errStopped
}

// leaks judges every allocation no Service uses, and releases those whose countdown
// has ended.
func (p *passRun) leaks(ctx context.Context) error {
	c := p.c
	c.mu.Lock()
	prev := c.candidates
	c.mu.Unlock()
	now := c.cfg.Clock.Now()
	next := make(map[allocator.Item]*candidate)
	for i := range p.allocs {
		if p.used[i] {
			continue
		}
		al := &p.allocs[i]
		if c.store.RangeSet().IsReserved(al.Item) {
			continue
		}
		if al.ModRevision > p.snap.receipt.Revision {
			// Committed after the snapshot was received: the snapshot cannot know of
			// its Service (#8295). Not judged, and any earlier streak is over.
			continue
		}
		cd := &candidate{al: *al, strikes: 1, firstSeen: now}
		if old, ok := prev[al.Item]; ok && old.al.ModRevision == al.ModRevision && old.al.Owner == al.Owner {
			cd.strikes, cd.firstSeen = min(old.strikes+1, c.cfg.LeakStrikes), old.firstSeen
		}
		f := Finding{Reason: LeakSuspected, Range: al.Range, Service: al.Owner}
		what := describe(al.Item, "")
		if al.Kind == allocator.KindClusterIP {
			f.ClusterIP = al.Addr.String()
		} else {
			f.NodePort = al.Port
		}
		ageAtReceipt := p.snap.receipt.Time.Sub(al.AllocateTime)
		switch {
		case cd.strikes < c.cfg.LeakStrikes:
			f.Message = fmt.Sprintf("%s of %s may have leaked: flagging for later clean up (strike %d of %d)",
				what, al.Owner, cd.strikes, c.cfg.LeakStrikes)
		case ageAtReceipt < c.cfg.LeakGrace:
			f.Message = fmt.Sprintf("%s of %s appears to have leaked, but was only %v old when the snapshot was received (grace %v): kept",
				what, al.Owner, ageAtReceipt.Round(time.Millisecond), c.cfg.LeakGrace)
		case p.dry:
			f.Reason = LeakReleased
			f.Message = fmt.Sprintf("%s of %s appears to have leaked: would clean up (dry run)", what, al.Owner)
		default:
			ok, err := c.store.ReleaseIf(ctx, *al)
			if err != nil && ctx.Err() != nil {
				return fmt.Errorf("release leaked %v: %w", al.Item, err)
			}
			if err != nil {
				// Kept as a candidate, at its last strike: the next pass tries again.
				f.Message = fmt.Sprintf("%s of %s appears to have leaked, but cleaning it up failed: kept: %v", what, al.Owner, err)
				break
			}
			if ok {
				f.Reason, f.Repaired = LeakReleased, true
				f.Message = fmt.Sprintf("%s of %s appears to have leaked: cleaned up", what, al.Owner)
				p.add(f)
				continue
			}
			f.Message = fmt.Sprintf("%s of %s appeared to have leaked, but changed since the pass read it: kept", what, al.Owner)
			p.add(f)
			continue
		}
		p.add(f)
		next[al.Item] = cd
	}
	p.next = next
	return nil
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

// itemFinding is a finding about a claimed item for the Service u.
func (p *passRun) itemFinding(r Reason, cl *claim, u user, msg string) Finding {
	f := Finding{Reason: r, Range: cl.rng, Service: owner(&p.snap.Services[u.svc]), Message: msg}
	if cl.item.Kind == allocator.KindClusterIP {
		f.ClusterIP = u.raw
	} else {
		f.NodePort = cl.item.Port
	}
	return f
}

func reasonFor(ip bool, ipReason, portReason Reason) Reason {
	if ip {
		return ipReason
	}
	return portReason
}

// describe names an item as Kubernetes' events do: "Cluster IP 10.0.0.1", "Port 30001".
func describe(it allocator.Item, raw string) string {
	if it.Kind == allocator.KindClusterIP {
		if raw == "" {
			raw = it.Addr.String()
		}
		return "Cluster IP " + raw
	}
	return "Port " + strconv.Itoa(it.Port)
}

func owner(s *Service) allocator.Owner {
	return allocator.Owner{Namespace: s.Namespace, Name: s.Name, UID: s.UID}
}

// sortCandidates orders candidates by range, then address or port.
func sortCandidates(cs []LeakCandidate) {
	slices.SortFunc(cs, func(a, b LeakCandidate) int {
		x, y := a.Allocation, b.Allocation
		if c := cmp.Compare(x.Kind, y.Kind); c != 0 {
			return c
		}
		if c := cmp.Compare(x.Range, y.Range); c != 0 {
			return c
		}
		if c := x.Addr.Compare(y.Addr); c != 0 {
			return c
		}
		return cmp.Compare(x.Port, y.Port)
	})
}
