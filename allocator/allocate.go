package allocator

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/allocd/allocd/internal/badrequest"
	"github.com/allocd/allocd/internal/etcd/call"
)

// Result is what Allocate allocated.
type Result struct {
	// ClusterIPs in the order of the requested families (or of the specific ones).
	ClusterIPs []netip.Addr
	// NodePorts: the specific ones first, then the dynamic ones.
	NodePorts []int
	// Revision is the etcd revision of the commit (0 for a dry run or an empty
	// request).
	Revision int64
	// Replayed is true when this is the stored result of the owner's identical last
	// request.
	Replayed bool
}

// Allocate allocates what req asks for, for req.Owner, in one etcd transaction
// together with the owner's record: all or nothing. A request identical to the
// owner's last one returns that one's result (Replayed) while the owner still holds
// it; another request of an existing owner allocates more. Errors: *InvalidError,
// ErrNoRange, *NotInRangeError, *AllocatedError (a specific item another owner
// holds), ErrFull, ErrConflict (contention outlasted the retries), etcd errors.
func (a *Allocator) Allocate(ctx context.Context, req Request) (Result, error) {
	start := time.Now()
	res, err := a.allocate(ctx, req)
	a.m.observe(time.Since(start), err)
	return res, err
}

func (a *Allocator) allocate(ctx context.Context, req Request) (Result, error) {
	if err := checkOwner("owner.uid", req.Owner); err != nil {
		return Result{}, err
	}
	o := &op{owner: req.Owner, ownerKey: a.ownerKey(req.Owner.UID), hash: req.hash(), epoch: a.epochs.now()}
	read := false // o.ownerRev and o.record were read from etcd
	if h, ok := a.hints.get(o.owner.UID); ok && !req.DryRun {
		if h.rec.Last == nil || h.rec.Last.Hash != o.hash {
			o.ownerRev, o.record, o.hinted = h.rev, h.rec, true
		} else {
			// Probably a retry of a request this replica committed: etcd says whether
			// the owner still holds its result.
			if res, ok, err := a.replay(ctx, o); err != nil || ok {
				return res, err
			}
			read = true
		}
	}
	for attempt := 0; ; attempt++ {
		res, err := a.planAndCommit(ctx, req, o, read)
		if err := a.rangesChanged(ctx, err, attempt); err != nil {
			return Result{}, err
		}
		if err == nil {
			return res, nil
		}
	}
}

// planAndCommit plans req (o's owner record as read, if read) and commits it.
func (a *Allocator) planAndCommit(ctx context.Context, req Request, o *op, read bool) (Result, error) {
	picks, err := a.plan(req)
	if err != nil {
		// A retry of a request that committed finds the range full (it may have taken
		// the last item itself, or its range may be terminating since) before it gets
		// to the owner record: look there.
		if !req.DryRun && !read &&
			(errors.Is(err, ErrFull) || errors.Is(err, ErrNoRange) || errors.Is(err, ErrTerminating)) {
			if res, ok, rerr := a.replay(ctx, o); rerr != nil || ok {
				return res, rerr
			}
		}
		return Result{}, err
	}
	if len(picks) == 0 {
		return Result{}, nil
	}
	if err := a.confirmHeld(ctx, req.Owner, picks); err != nil {
		releasePicks(picks)
		if !req.DryRun && !read && errors.Is(err, ErrTerminating) {
			if res, ok, rerr := a.replay(ctx, o); rerr != nil || ok {
				return res, rerr
			}
		}
		return Result{}, err
	}
	if req.DryRun {
		return a.dryRun(ctx, req.Owner, picks)
	}
	o.picks = picks
	r := a.committer.submit(ctx, o)
	if r.err != nil {
		return Result{}, r.err
	}
	return Result{ClusterIPs: r.ips, NodePorts: r.ports, Revision: r.rev, Replayed: r.replayed}, nil
}

// replay reads o's owner record (a linearizable read) into o and reports, with the
// stored result, whether the owner's last request was o's and the owner still holds
// its result.
func (a *Allocator) replay(ctx context.Context, o *op) (Result, bool, error) {
	resp, err := a.get(ctx, o.ownerKey)
	if err != nil {
		return Result{}, false, call.Unapplied(fmt.Errorf("read owner record: %w", err))
	}
	o.ownerRev, o.record = 0, nil
	if len(resp.Kvs) == 0 {
		a.hints.del(o.owner.UID)
		return Result{}, false, nil
	}
	kv := resp.Kvs[0]
	rec, err := decodeOwnerRecord(kv.Value)
	if err != nil {
		// Left to the transaction's read-back, which rewrites it.
		a.log.Warn("undecodable owner record", "key", o.ownerKey, "err", err)
		return Result{}, false, nil
	}
	o.ownerRev, o.record = kv.ModRevision, rec
	a.hints.put(o.owner.UID, kv.ModRevision, rec)
	if rec.Last == nil || rec.Last.Hash != o.hash || !rec.holdsLast() {
		return Result{}, false, nil
	}
	return Result{ClusterIPs: rec.Last.ClusterIPs, NodePorts: rec.Last.NodePorts, Revision: kv.ModRevision,
		Replayed: true}, true, nil
}

// plan validates req and reserves (pending) the items it asks for.
func (a *Allocator) plan(req Request) (picks []*pick, err error) {
	defer func() {
		if err != nil {
			for _, p := range picks {
				if p.pending {
					p.r.Unpend(p.off)
				}
			}
			picks = nil
		}
	}()
	if req.NodePortCount < 0 {
		return nil, badrequest.New("node_port_count", "must not be negative")
	}
	if n := len(req.ClusterIPs) + len(req.NodePorts) + req.NodePortCount; n > MaxItems {
		return nil, badrequest.New("node_ports",
			fmt.Sprintf("%d items asked for; at most %d per request", n, MaxItems))
	}
	t := a.idx.tab.Load()
	specific := func(it Item) error {
		p, err := a.specificPick(it)
		if err != nil {
			return err
		}
		picks = append(picks, p)
		return nil
	}
	dynamic := func(r *rng) error {
		off, ok := r.Pick()
		if !ok {
			return &FullError{Range: r.name}
		}
		it := r.item(off)
		picks = append(picks, &pick{r: r, off: off, item: it, key: a.key(it), pending: true})
		return nil
	}
	if !req.NoClusterIP {
		if len(req.ClusterIPs) > 0 {
			if len(req.ClusterIPs) > 2 {
				return picks, badrequest.New("cluster_ips", "at most two addresses, one per IP family")
			}
			if len(req.ClusterIPs) == 2 && req.ClusterIPs[0].Is4() == req.ClusterIPs[1].Is4() {
				return picks, badrequest.New("cluster_ips", "at most one address per IP family")
			}
			for _, addr := range req.ClusterIPs {
				if err := specific(IP(addr)); err != nil {
					return picks, err
				}
			}
		} else {
			fams, err := a.families(req.Families, req.Policy)
			if err != nil {
				return picks, err
			}
			for _, f := range fams {
				p, err := a.pickIP(t, f)
				if err != nil {
					return picks, err
				}
				picks = append(picks, p)
			}
		}
	}
	for i, p := range req.NodePorts {
		if slices.Contains(req.NodePorts[:i], p) {
			return picks, badrequest.New("node_ports", "port "+strconv.Itoa(p)+" asked for twice")
		}
		if err := specific(Port(p)); err != nil {
			return picks, err
		}
	}
	for range req.NodePortCount {
		if err := dynamic(a.idx.portRange); err != nil {
			return picks, err
		}
	}
	return picks, nil
}

// families resolves the families of a dynamic ClusterIP request, in order.
func (a *Allocator) families(fams []Family, pol Policy) ([]Family, error) {
	for i, f := range fams {
		if f != IPv4 && f != IPv6 {
			return nil, badrequest.New("ip_families", "unknown IP family "+strconv.Itoa(int(f)))
		}
		if slices.Contains(fams[:i], f) {
			return nil, badrequest.New("ip_families", f.String()+" listed twice")
		}
	}
	t := a.idx.tab.Load()
	configured := func(f Family) bool {
		return slices.ContainsFunc(t.ip, func(r *rng) bool { return r.span.is4 == (f == IPv4) })
	}
	primary := IPv6
	if a.kubeIP.Is4() {
		primary = IPv4
	}
	order := slices.Clone(fams)
	if len(order) == 0 {
		order = []Family{primary}
	}
	if !configured(order[0]) {
		return nil, fmt.Errorf("%s: %w", order[0], ErrNoRange)
	}
	other := IPv4
	if order[0] == IPv4 {
		other = IPv6
	}
	switch pol {
	case SingleStack:
		if len(fams) > 1 {
			return nil, badrequest.New("ip_families", "single stack takes one family")
		}
		return order[:1], nil
	case PreferDualStack:
		// The second family only when a ready range can give it: one whose ranges
		// are all terminating would fail the request instead of leaving it single.
		if len(t.ready[famIndex(other == IPv4)]) > 0 {
			return []Family{order[0], other}, nil
		}
		return order[:1], nil
	case RequireDualStack:
		if !configured(other) {
			return nil, fmt.Errorf("require dual stack: %s: %w", other, ErrNoRange)
		}
		return []Family{order[0], other}, nil
	}
	return nil, badrequest.New("ip_family_policy", "unknown policy "+strconv.Itoa(int(pol)))
}

// dryRun reports what an Allocate would do, writing nothing: specific items are
// looked up in etcd when the index sees them used.
func (a *Allocator) dryRun(ctx context.Context, o Owner, picks []*pick) (Result, error) {
	var res Result
	defer func() {
		for _, p := range picks {
			if p.pending {
				p.r.Unpend(p.off)
			}
		}
	}()
	for _, p := range picks {
		if p.specific && !p.pending {
			al, err := a.Get(ctx, p.item)
			switch {
			case err == nil && al.Owner.UID != o.UID:
				return Result{}, &AllocatedError{Item: p.item, Holder: al.Owner}
			case err != nil && err != ErrNotFound:
				return Result{}, err
			}
		}
		if p.item.Kind == KindClusterIP {
			res.ClusterIPs = append(res.ClusterIPs, p.item.Addr)
		} else {
			res.NodePorts = append(res.NodePorts, p.item.Port)
		}
	}
	return res, nil
}

// Assign gives the specific item it to o, and records it in o's record. It is a
// no-op when o holds it already, and fails with a *AllocatedError when another owner
// does.
func (a *Allocator) Assign(ctx context.Context, o Owner, it Item) (Allocation, error) {
	if err := checkOwner("owner.uid", o); err != nil {
		return Allocation{}, err
	}
	ep := a.epochs.now()
	for attempt := 0; ; attempt++ {
		p, err := a.specificPick(it)
		if err != nil {
			return Allocation{}, err
		}
		if err := a.confirmHeld(ctx, o, []*pick{p}); err != nil {
			releasePicks([]*pick{p})
			return Allocation{}, err
		}
		op := &op{owner: o, ownerKey: a.ownerKey(o.UID), assign: true, picks: []*pick{p}, epoch: ep}
		if h, ok := a.hints.get(o.UID); ok {
			op.ownerRev, op.record, op.hinted = h.rev, h.rec, true
		}
		res := a.committer.submit(ctx, op)
		if err := a.rangesChanged(ctx, res.err, attempt); err != nil {
			return Allocation{}, err
		}
		if res.err == nil {
			return Allocation{Item: it, Range: p.r.name, Owner: o, AllocateTime: p.at,
				CreateRevision: p.createRev, ModRevision: p.modRev}, nil
		}
	}
}

// maxReplans bounds how often one call plans again after a ServiceCIDR it drew from
// changed under it.
const maxReplans = 8

// rangesChanged returns nil when err says that a ServiceCIDR an op drew from changed
// and the call may plan again (after the index has seen the change), and err
// otherwise (nil for nil).
func (a *Allocator) rangesChanged(ctx context.Context, err error, attempt int) error {
	var rc *rangesChangedError
	if !errors.As(err, &rc) {
		return err
	}
	if attempt >= maxReplans {
		return err
	}
	if werr := a.idx.progress.Wait(ctx, rc.rev, a.idx.syncTimeout); werr != nil {
		return fmt.Errorf("%w (%w)", err, werr)
	}
	return nil
}
