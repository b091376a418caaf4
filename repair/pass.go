package repair

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
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
	// slots indexes both by item (its key, which the collector need not scan): one map
	// for the two, the biggest cost of a pass
	// after reading etcd.
	slots map[allocator.ItemKey]slot
	// next are the leak candidates after this pass; nil if it did not get that far.
	next map[allocator.Item]*candidate
	// early is what collect found, recorded after the listing.
	early []early
	// heldRev is the revision heldThen was read at: the snapshot's receipt revision,
	// or the oldest etcd kept if it was compacted. heldThen are the allocations then
	// of the items the pass would allocate (nil when it would allocate none).
	heldRev  int64
	heldThen map[allocator.ItemKey]allocator.Allocation
}

// slot is what a pass knows of one item: its allocation and its claim, if it has them.
type slot struct {
	alloc, claim ref
}

// ref is a position in one of a pass's slices (allocs or claims), or none: the zero
// ref refers to nothing, so that an item missing from the slots has neither. It is
// the position plus one, to keep slots small.
type ref int32

// refTo returns the ref of position i.
func refTo(i int) ref { return ref(i + 1) }

// get returns the position r refers to, and whether it refers to one.
func (r ref) get() (int, bool) { return int(r) - 1, r != 0 }

// claim is one item used by one or more Services of the snapshot.
type claim struct {
	item  allocator.Item
	rng   string
	alloc ref // in allocs, none when not allocated
	first user
	more  []user // other Services using it: duplicates
}

// early is what collect finds before the allocations are read, recorded after they
// are, in the order found (so that a pass that cannot read them records nothing): a
// finding f, or an item outside the pass's ranges used by a user, which is claimed if
// it is allocated after all (in a range added since the pass took its ranges), else
// reported with err, the range lookup's.
type early struct {
	f Finding
	user
	item allocator.Item // KindClusterIP or KindNodePort when an item, zero for f
	err  error
}

// user is a Service using an item, with the address as it wrote it.
type user struct {
	svc int32
	raw string
}

// addUser records that u uses cl too, unless u is its last user already: the same port
// under two protocols, or as the health check node port, counts once.
func (cl *claim) addUser(u user) {
	last := cl.first.svc
	if n := len(cl.more); n > 0 {
		last = cl.more[n-1].svc
	}
	if last != u.svc {
		cl.more = append(cl.more, u)
	}
}

// users returns every user of cl, the first first.
func (cl *claim) users() []user { return append([]user{cl.first}, cl.more...) }

func (p *passRun) run(ctx context.Context) error {
	snap, err := p.c.snapshotForPass(ctx)
	if err != nil {
		return err
	}
	p.snap = snap
	p.rep.SnapshotRevision = snap.Revision
	// The allocations to judge: those of the items no Service uses, or that the
	// allocator does not show held by the Service that uses them (claims.go).
	cl := p.gather()
	held := make([]bool, len(cl))
	_, p.allocs, err = p.c.store.ListExcept(ctx, cl, held)
	if err != nil {
		return fmt.Errorf("list allocations: %w", err)
	}
	p.collect(p.judged(cl, held))
	p.used = make([]bool, len(p.allocs))
	for i := range p.allocs {
		p.allocated(i)
	}
	if err := p.recordEarly(); err != nil {
		return err
	}
	if err := p.checkCurrent(ctx); err != nil {
		return err
	}
	if err := p.readReceipt(ctx); err != nil {
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
	p.add(about{}.finding(msgStale, p.snap.Revision, last))
	return nil
}

// readReceipt reads who held, when the snapshot was received, the items the pass
// would allocate: used by a Service, not allocated, not reserved (the Controller's doc
// says why). A stale pass allocates none of them.
func (p *passRun) readReceipt(ctx context.Context) error {
	p.heldRev = p.snap.receipt.Revision
	if p.stale {
		return nil
	}
	var items []allocator.Item
	for i := range p.claims {
		cl := &p.claims[i]
		if _, ok := cl.alloc.get(); !ok && !p.ranges.IsReserved(cl.item) {
			items = append(items, cl.item)
		}
	}
	if len(items) == 0 {
		return nil
	}
	rev, then, err := p.c.store.HeldAt(ctx, items, p.snap.receipt.Revision)
	if err != nil {
		return fmt.Errorf("read allocations when the snapshot was received: %w", err)
	}
	p.heldRev = rev
	p.heldThen = make(map[allocator.ItemKey]allocator.Allocation, len(then))
	for _, al := range then {
		p.heldThen[al.Item.Key()] = al
	}
	return nil
}

// collect rebuilds the expected state of the items the pass judges (judge, by their
// place in eachItem's order): one claim per item, and a finding for each address that
// cannot be used (early). An item outside the pass's ranges waits for the allocations
// (early): allocated, it is claimed as any other.
func (p *passRun) collect(judge func(i int) bool) {
	i := 0
	p.eachItem(func(svc int32, it allocator.Item, raw string) {
		if judge(i) {
			p.claimItem(svc, it, raw)
		}
		i++
	}, func(svc *Service, raw string) {
		bad := about{item: allocator.Item{Kind: allocator.KindClusterIP}, raw: raw, owner: owner(svc)}
		p.early = append(p.early, early{f: bad.finding(msgNotValid, bad.what())})
	})
}

// claimItem records that Service svc uses it; an item outside the pass's ranges waits
// for the listing (early).
func (p *passRun) claimItem(svc int32, it allocator.Item, raw string) {
	k := it.Key()
	sl := p.slots[k]
	if c, ok := sl.claim.get(); ok {
		p.claims[c].addUser(user{svc: svc, raw: raw})
		return
	}
	rng, err := p.ranges.Of(it)
	if err != nil {
		p.early = append(p.early, early{user: user{svc: svc, raw: raw}, item: it, err: err})
		return
	}
	p.slots[k] = slot{claim: refTo(len(p.claims))}
	p.claims = append(p.claims, claim{item: it, rng: rng, first: user{svc: svc, raw: raw}})
}

// allocated records allocation i in its slot and in its claim, whose range it becomes.
func (p *passRun) allocated(i int) {
	al := &p.allocs[i]
	k := al.Item.Key()
	sl := p.slots[k]
	sl.alloc = refTo(i)
	p.slots[k] = sl
	if c, ok := sl.claim.get(); ok {
		p.claims[c].alloc, p.claims[c].rng = sl.alloc, al.Range
	}
}

// recordEarly records what collect found, in order: its findings, and the items
// outside the pass's ranges, claimed when allocated (their range is the allocation's)
// and reported otherwise.
func (p *passRun) recordEarly() error {
	for _, e := range p.early {
		if e.item.Kind == 0 {
			p.add(e.f)
			continue
		}
		k := e.item.Key()
		sl := p.slots[k]
		if c, ok := sl.claim.get(); ok {
			p.claims[c].addUser(e.user)
			continue
		}
		if a, ok := sl.alloc.get(); ok {
			p.slots[k] = slot{alloc: sl.alloc, claim: refTo(len(p.claims))}
			p.claims = append(p.claims,
				claim{item: e.item, rng: p.allocs[a].Range, alloc: sl.alloc, first: e.user})
			continue
		}
		f, err := p.notInRange(e.svc, e.item, e.raw, e.err)
		if err != nil {
			return err
		}
		p.add(f)
	}
	return nil
}

// notInRange returns the finding of why Service svc cannot use it, from err, the error
// of the range lookup; an error that says nothing about the item is returned.
func (p *passRun) notInRange(svc int32, it allocator.Item, raw string, err error) (Finding, error) {
	a := about{item: it, raw: raw, owner: owner(&p.snap.Services[svc])}
	var nir *allocator.NotInRangeError
	switch {
	case it.Kind == allocator.KindClusterIP && errors.Is(err, allocator.ErrNoRange):
		return a.finding(msgNoFamily, a.what()), nil
	case errors.As(err, &nir) && it.Kind == allocator.KindClusterIP:
		a.rng = nir.Range
		return a.finding(msgIPOutOfRange, a.what(), a.rng), nil
	case errors.As(err, &nir) || errors.Is(err, allocator.ErrNoRange) || errors.Is(err, allocator.ErrInvalid):
		a.rng = p.ranges.NodePort.String()
		if nir != nil {
			a.rng = nir.Range
		}
		return a.finding(msgPortOutOfRange, a.what(), a.rng), nil
	}
	return Finding{}, fmt.Errorf("range of %v: %w", it, err)
}

// about is what a finding about claim cl for its user u is about.
func (p *passRun) about(cl *claim, u user) about {
	return about{item: cl.item, raw: u.raw, rng: cl.rng, owner: owner(&p.snap.Services[u.svc])}
}

// check compares one claim with etcd and repairs what it can.
func (p *passRun) check(ctx context.Context, cl *claim) error {
	var al *allocator.Allocation
	if i, ok := cl.alloc.get(); ok {
		p.used[i] = true
		al = &p.allocs[i]
	}
	if p.ranges.IsReserved(cl.item) {
		return p.checkReserved(ctx, cl, al)
	}
	holder := p.holder(cl, al)
	if len(cl.more) > 0 {
		h := &p.snap.Services[holder.svc]
		for _, u := range cl.users() {
			if u.svc != holder.svc {
				a := p.about(cl, u)
				p.add(a.finding(msgShared, a.what(), h.Namespace, h.Name))
			}
		}
	}
	a := p.about(cl, holder)
	switch {
	case al == nil && p.stale:
		p.add(a.finding(msgNotAllocatedStale, a.what()))
	case al == nil:
		return p.notAllocated(ctx, a)
	case al.Owner.UID == a.owner.UID: // held by the Service that uses it
	case al.ModRevision > p.snap.receipt.Revision:
		p.add(a.finding(msgWrongOwnerNewer, a.what(), al.Owner, al.ModRevision, p.snap.receipt.Revision))
	case len(cl.more) > 0:
		p.add(a.finding(msgWrongOwnerShared, a.what(), al.Owner))
	default:
		return p.reassign(ctx, a, msgWrongOwner, *al, a.owner)
	}
	return nil
}

// notAllocated repairs the item a is about, which its Service uses and nobody holds,
// unless it was held when the snapshot was received: released since, most often by the
// deletion of that Service (the Controller's doc says why it is not repaired).
func (p *passRun) notAllocated(ctx context.Context, a about) error {
	receipt := p.snap.receipt.Revision
	then, held := p.heldThen[a.item.Key()]
	switch {
	case held && p.heldRev == receipt:
		p.add(a.finding(msgNotAllocatedReleased, a.what(), then.Owner, receipt))
	case held:
		p.add(a.finding(msgNotAllocatedReleasedLater, a.what(), receipt, then.Owner, p.heldRev))
	case p.dry:
		p.add(a.finding(msgNotAllocatedDry, a.what()))
	case p.heldRev != receipt:
		return p.assign(ctx, a, a.owner, msgNotAllocatedCompacted, p.heldRev, receipt)
	default:
		return p.assign(ctx, a, a.owner, msgNotAllocated)
	}
	return nil
}

// holder is the user of cl that etcd says holds it (al, nil when none), else its
// first user.
func (p *passRun) holder(cl *claim, al *allocator.Allocation) user {
	holder := cl.first
	if al == nil {
		return holder
	}
	svcs := p.snap.Services
	for _, u := range cl.more {
		if svcs[u.svc].UID == al.Owner.UID && svcs[holder.svc].UID != al.Owner.UID {
			holder = u
		}
	}
	return holder
}

// checkReserved handles the address or port reserved for the kubernetes Service
// (allocator.KubernetesOwner): every other Service using it is reported; if nothing
// holds it, it is allocated to the kubernetes Service again; if an owner that no
// Service of the snapshot is holds it, it is given back to the kubernetes Service
// (with the same fence as any reassign). A leak is never judged for it.
func (p *passRun) checkReserved(ctx context.Context, cl *claim, al *allocator.Allocation) error {
	svcs := p.snap.Services
	kube := allocator.KubernetesOwner
	// The finding about the reservation itself names the kubernetes Service of the
	// snapshot if there is one, else the first user.
	ku := cl.first
	held := false // by a Service of the snapshot
	for _, u := range cl.users() {
		s := &svcs[u.svc]
		held = held || al != nil && s.UID == al.Owner.UID
		if s.Namespace == kube.Namespace && s.Name == kube.Name {
			ku = u
			continue
		}
		a := p.about(cl, u)
		p.add(a.finding(msgReserved, a.what()))
	}
	a := p.about(cl, ku)
	switch {
	case al == nil && p.dry:
		p.add(a.finding(msgReservedNotAllocatedDry, a.what()))
	case al == nil:
		// Not judged from the snapshot: the reservation holds whatever the snapshot
		// says, so a stale snapshot does not stop it.
		return p.assign(ctx, a, kube, msgReservedNotAllocated)
	case al.Owner.UID == kube.UID || held: // held by a Service of the snapshot: reported above
	case al.ModRevision > p.snap.receipt.Revision:
		p.add(a.finding(msgReservedWrongOwnerNewer, a.what(), al.Owner, al.ModRevision,
			p.snap.receipt.Revision))
	default:
		return p.reassign(ctx, a, msgReservedWrongOwner, *al, kube)
	}
	return nil
}

// assign repairs an item that is not allocated by allocating it to o, and reports it
// with the message repairing (over the item, then more) when it is repaired. Only a
// full range (which stops the pass) or the end of ctx is an error: anything else that
// keeps the item from o is a finding not repaired, and the pass goes on with the next
// claim, so that one Service cannot stop every pass.
func (p *passRun) assign(ctx context.Context, a about, o allocator.Owner, repairing message,
	more ...any) error {
	_, err := p.c.store.Assign(ctx, o, a.item)
	var ae *allocator.AllocatedError
	args := append([]any{a.what()}, more...)
	switch {
	case err == nil:
		p.add(a.repaired(repairing, args...))
	case errors.As(err, &ae):
		p.add(a.finding(msgTaken, a.what(), ae.Holder))
	case errors.Is(err, allocator.ErrFull):
		p.add(a.finding(repairing, args...))
		return p.full(a)
	case ctx.Err() != nil:
		return fmt.Errorf("allocate %v to %s/%s: %w", a.item, o.Namespace, o.Name, err)
	default:
		p.add(a.finding(msgAssignFailed, a.what(), o, err))
	}
	return nil
}

// reassign repairs an item held by the wrong owner by moving al to o (if it did not
// change since the pass read it), and reports it with the message repairing (over the
// item and al's owner) when it is repaired. Like assign, only the end of ctx is an
// error.
func (p *passRun) reassign(ctx context.Context, a about, repairing message, al allocator.Allocation,
	o allocator.Owner) error {
	switch {
	case p.stale:
		p.add(a.finding(msgReassignStale, a.what(), al.Owner, o))
		return nil
	case p.dry:
		p.add(a.finding(msgReassignDry, a.what(), al.Owner, o))
		return nil
	}
	_, err := p.c.store.Reassign(ctx, al, o)
	switch {
	case err == nil:
		p.add(a.repaired(repairing, a.what(), al.Owner))
	case errors.Is(err, allocator.ErrConflict) && ctx.Err() == nil:
		p.add(a.finding(msgReassignChanged, a.what(), al.Owner, err))
	case ctx.Err() != nil:
		return fmt.Errorf("reassign %v to %s/%s: %w", a.item, o.Namespace, o.Name, err)
	default:
		p.add(a.finding(msgReassignFailed, a.what(), al.Owner, o, err))
	}
	return nil
}

// full reports the full range of the item a is about and stops the pass.
func (p *passRun) full(a about) error {
	m := msgCIDRFull
	if a.item.Kind == allocator.KindNodePort {
		m = msgPortRangeFull
	}
	f := a.finding(m, a.rng)
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
		kept, err := p.judgeLeak(ctx, cd)
		if err != nil {
			return err
		}
		if kept {
			next[al.Item] = cd
		}
	}
	p.next = next
	return nil
}

// judgeLeak reports the leak candidate cd and releases it if its countdown has ended;
// kept is whether it stays a candidate.
func (p *passRun) judgeLeak(ctx context.Context, cd *candidate) (kept bool, err error) {
	al, cfg := cd.al, p.c.cfg
	a := about{item: al.Item, rng: al.Range, owner: al.Owner}
	age := p.snap.receipt.Time.Sub(al.AllocateTime) // when the snapshot was received
	switch {
	case cd.strikes < cfg.LeakStrikes:
		p.add(a.finding(msgLeakStrike, a.what(), al.Owner, cd.strikes, cfg.LeakStrikes))
	case age < cfg.LeakGrace:
		p.add(a.finding(msgLeakYoung, a.what(), al.Owner, age.Round(time.Millisecond), cfg.LeakGrace))
	case p.dry:
		p.add(a.finding(msgLeakDry, a.what(), al.Owner))
	default:
		return p.release(ctx, a, al)
	}
	return true, nil
}

// release deletes the leaked allocation al if it did not change since the pass read
// it; kept is whether it stays a candidate: when the release failed, at its last
// strike, so that the next pass tries again.
func (p *passRun) release(ctx context.Context, a about, al allocator.Allocation) (kept bool, err error) {
	ok, err := p.c.store.ReleaseIf(ctx, al)
	switch {
	case err != nil && ctx.Err() != nil:
		return false, fmt.Errorf("release leaked %v: %w", al.Item, err)
	case err != nil:
		p.add(a.finding(msgLeakReleaseFailed, a.what(), al.Owner, err))
		return true, nil
	case ok:
		p.add(a.repaired(msgLeakReleased, a.what(), al.Owner))
	default:
		p.add(a.finding(msgLeakChanged, a.what(), al.Owner))
	}
	return false, nil
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
