package adopt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/allocd/allocd/bridge/admit"
	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// DefaultPendingGrace is how old a provisional owner's allocation must be before the
// Sweeper looks at it: kube-apiserver gives up on a create or an update within
// RequestTimeoutUpperBound of the request's start, admission included, and the rest
// covers an etcd proposal sent before that and committed late across a leader change
// (while etcd keeps its quorum) and the clock skew between allocd (which stamps
// allocate_time) and the bridge.
const DefaultPendingGrace = 2 * time.Minute

// RequestTimeoutUpperBound is kube-apiserver's bound on a create, an update or a patch,
// from its start to its etcd write (requestTimeoutUpperBound of the handlers in
// k8s.io/apiserver/pkg/endpoints/handlers: a constant that no flag changes). A grace
// below it lets the Sweeper free what kube-apiserver may still store a Service with.
const RequestTimeoutUpperBound = 34 * time.Second

// DefaultPendingSweepInterval is how often the Sweeper lists the provisional owners.
const DefaultPendingSweepInterval = 10 * time.Second

// SweeperConfig configures a Sweeper.
type SweeperConfig struct {
	// Grace is the age (from allocd's allocate_time) past which an item of a
	// provisional owner is judged: DefaultPendingGrace when 0. It must exceed the
	// longest time kube-apiserver can take from admission to storing the object.
	Grace time.Duration
	// Interval is the time between sweeps: DefaultPendingSweepInterval when 0.
	Interval time.Duration
	// Clock is the bridge's clock (the real one when nil).
	Clock clockwork.Clock
}

// Sweeper settles the admission webhook's allocations that no adoption bound: every
// Interval it lists allocd's provisional owners (UID "admission/..."), and each item
// older than Grace is bound to the stored Service that holds it (allocd's Transfer), or
// freed when none does. Whether a Service holds it is a quorum read of the API server:
// the Service of the owner's namespace and name, then the Services of the namespace
// whose generateName is the owner's name. The grace is what makes the read final: no
// Service the admission was for can be stored after it.
//
// It settles, item by item:
//   - a Service of the name (or generateName) holds it: moved to its UID (bound);
//   - none does (the create or update was refused after admission, the client gave up,
//     kube-apiserver timed out, a later invocation of the admission replaced it): freed;
//   - bound or freed by someone else meanwhile (the adoption of its Service, allocd's
//     repair): nothing, allocd's ErrNotOwner says so;
//   - the API server or allocd unreachable: left for the next sweep.
type Sweeper struct {
	a    *Adopter
	kube kubernetes.Interface
	log  *slog.Logger
	cfg  SweeperConfig
}

// NewSweeper returns a Sweeper acting in allocd through a's client (and counting in a's
// metrics) and reading Services from kube. A Grace below RequestTimeoutUpperBound is
// taken, with a warning: tests use a short one on purpose.
func NewSweeper(a *Adopter, kube kubernetes.Interface, log *slog.Logger, cfg SweeperConfig) *Sweeper {
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultPendingGrace
	}
	if cfg.Grace < RequestTimeoutUpperBound {
		log.Warn("the grace of the admission webhook's allocations is below kube-apiserver's bound on a "+
			"create or update: an allocation can be freed while kube-apiserver may still store its Service "+
			"(only for tests)", "grace", cfg.Grace, "bound", RequestTimeoutUpperBound)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultPendingSweepInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	return &Sweeper{a: a, kube: kube, log: log, cfg: cfg}
}

// Sweep is what one sweep did.
type Sweep struct {
	// Owners is the number of provisional owners listed.
	Owners int
	// Bound and Freed are the items moved to their Service and freed.
	Bound, Freed []string
	// Young is the number of items not yet past the grace.
	Young int
}

// Run sweeps every Interval until ctx ends, the first time once ready reports true
// (the bridge's informers synced and its adoption run over every Service once, so that
// a bridge that was down longer than the grace binds what was stored meanwhile before
// it frees anything). A failed sweep is logged and tried again at the next interval.
func (s *Sweeper) Run(ctx context.Context, ready func() bool) error {
	t := s.cfg.Clock.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		if ready() {
			if _, err := s.RunOnce(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("sweep of the admission webhook's allocations failed; trying again", "error", err,
					"retry", s.cfg.Interval)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.Chan():
		}
	}
}

// pending is one provisional owner and its items.
type pending struct {
	owner *allocdv1.Owner
	items []*allocdv1.Allocation
}

// RunOnce is one sweep.
func (s *Sweeper) RunOnce(ctx context.Context) (Sweep, error) {
	owners, err := s.list(ctx)
	if err != nil {
		return Sweep{}, err
	}
	res := Sweep{Owners: len(owners)}
	now := s.cfg.Clock.Now()
	lists := map[string][]corev1.Service{} // the namespace's Services, listed once a sweep
	var errs []error
	for _, p := range owners {
		var old []*allocdv1.Allocation
		for _, al := range p.items {
			if now.Sub(al.GetAllocateTime().AsTime()) >= s.cfg.Grace {
				old = append(old, al)
			} else {
				res.Young++
			}
		}
		if len(old) == 0 {
			continue
		}
		if err := s.settle(ctx, p.owner, old, lists, &res); err != nil {
			errs = append(errs, err)
		}
	}
	return res, errors.Join(errs...)
}

// list returns allocd's provisional owners with their items.
func (s *Sweeper) list(ctx context.Context) ([]*pending, error) {
	byUID := map[string]*pending{}
	var out []*pending
	req := &allocdv1.ListAllocationsRequest{OwnerUidPrefix: admit.ProvisionalPrefix, PageSize: 500}
	for {
		resp, err := s.a.c.ListAllocations(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("adopt: list the provisional owners' allocations: %w", err)
		}
		for _, al := range resp.GetAllocations() {
			uid := al.GetOwner().GetUid()
			p := byUID[uid]
			if p == nil {
				p = &pending{owner: al.GetOwner()}
				byUID[uid] = p
				out = append(out, p)
			}
			p.items = append(p.items, al)
		}
		if resp.GetNextPageToken() == "" {
			return out, nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// settle binds each of items (owner's, past the grace) to the stored Service that holds
// it, and frees the rest.
func (s *Sweeper) settle(ctx context.Context, owner *allocdv1.Owner, items []*allocdv1.Allocation,
	lists map[string][]corev1.Service, res *Sweep) error {
	rest := items
	candidates, err := s.services(ctx, owner, lists)
	if err != nil {
		return err
	}
	for _, svc := range candidates {
		var mine, others []*allocdv1.Allocation
		w := serviceWants(svc)
		for _, al := range rest {
			if holds(w, al) {
				mine = append(mine, al)
			} else {
				others = append(others, al)
			}
		}
		if len(mine) > 0 {
			ips, ports := split(mine)
			bound, err := s.a.bind(ctx, owner, ownerOf(svc), ips, ports)
			if err != nil {
				return err
			}
			if bound {
				res.Bound = append(res.Bound, names(mine)...)
			}
		}
		rest = others
	}
	if len(rest) == 0 {
		return nil
	}
	ips, ports := split(rest)
	resp, err := s.a.c.Release(ctx, &allocdv1.ReleaseRequest{Owner: owner, ClusterIps: ips, NodePorts: ports})
	switch {
	case errors.Is(err, client.ErrNotOwner):
		return nil // bound meanwhile: the next sweep frees what is left, if anything
	case err != nil:
		return fmt.Errorf("adopt: free %v %v of %s: %w", ips, ports, owner.GetUid(), err)
	}
	freed := len(resp.GetReleasedClusterIps()) + len(resp.GetReleasedNodePorts())
	s.a.freed.Add(float64(freed))
	if freed > 0 {
		s.log.Info("freed the admission webhook's allocation: no Service holds it", "owner",
			owner.GetNamespace()+"/"+owner.GetName(), "uid", owner.GetUid(), "cluster_ips",
			resp.GetReleasedClusterIps(), "node_ports", resp.GetReleasedNodePorts())
	}
	res.Freed = append(res.Freed, names(rest)...)
	return nil
}

// services returns the stored Services that owner's items may be for, read from the
// API server at its current state (a quorum read): the one of owner's namespace and
// name, and those of the namespace whose generateName is owner's name.
func (s *Sweeper) services(ctx context.Context, owner *allocdv1.Owner, lists map[string][]corev1.Service) (
	[]*corev1.Service, error) {
	ns, name := owner.GetNamespace(), owner.GetName()
	if ns == "" || name == "" {
		return nil, nil
	}
	var out []*corev1.Service
	svc, err := s.kube.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil:
		out = append(out, svc)
	case !apierrors.IsNotFound(err) && !apierrors.IsInvalid(err) && !apierrors.IsBadRequest(err):
		return nil, fmt.Errorf("adopt: read Service %s/%s: %w", ns, name, err)
	}
	list, ok := lists[ns]
	if !ok {
		if list, err = s.listNamespace(ctx, ns); err != nil {
			return nil, err
		}
		lists[ns] = list
	}
	for i := range list {
		if g := &list[i]; g.GenerateName == name && g.Name != name {
			out = append(out, g)
		}
	}
	return out, nil
}

// listNamespace lists the Services of ns that were named from a generateName, in pages.
func (s *Sweeper) listNamespace(ctx context.Context, ns string) ([]corev1.Service, error) {
	var out []corev1.Service
	opts := metav1.ListOptions{Limit: 500}
	for {
		list, err := s.kube.CoreV1().Services(ns).List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("adopt: list the Services of %s: %w", ns, err)
		}
		for _, svc := range list.Items {
			if svc.GenerateName != "" {
				out = append(out, svc)
			}
		}
		if list.Continue == "" {
			return out, nil
		}
		opts.Continue = list.Continue
	}
}

func ownerOf(s *corev1.Service) *allocdv1.Owner {
	return &allocdv1.Owner{Namespace: s.Namespace, Name: s.Name, Uid: string(s.UID)}
}

func holds(w wants, al *allocdv1.Allocation) bool {
	if ip := al.GetClusterIp(); ip != "" {
		return slices.Contains(w.ips, ip)
	}
	return slices.Contains(w.ports, al.GetNodePort())
}

func split(als []*allocdv1.Allocation) (ips []string, ports []int32) {
	for _, al := range als {
		if al.GetClusterIp() != "" {
			ips = append(ips, al.GetClusterIp())
		} else {
			ports = append(ports, al.GetNodePort())
		}
	}
	return ips, ports
}

func names(als []*allocdv1.Allocation) []string {
	var out []string
	for _, al := range als {
		if al.GetClusterIp() != "" {
			out = append(out, al.GetClusterIp())
		} else {
			out = append(out, fmt.Sprint(al.GetNodePort()))
		}
	}
	return out
}

// isProvisional reports whether uid is a provisional owner's.
func isProvisional(uid string) bool { return strings.HasPrefix(uid, admit.ProvisionalPrefix) }
