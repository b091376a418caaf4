package adopt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/allocd/allocd/bridge/admit"
	"github.com/allocd/allocd/bridge/feed"
	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// Adopter allocates in allocd the ClusterIPs and NodePorts a cluster's Services hold,
// under each Service's UID, so that allocd never hands them out. It takes what is free,
// binds what the admission webhook allocated for the Service (held by a provisional
// owner of the Service's namespace and name, or generateName: moved to the Service's
// UID by allocd's Transfer, never free in between), reports what another owner holds (a
// Conflict), and never takes an address from its holder. When a Service gives up an
// address or port, or is deleted, the Adopter releases it in allocd (only what that
// Service's UID holds).
type Adopter struct {
	c   *client.Client
	log *slog.Logger
	// bound counts items moved from a provisional owner to their Service, freed the
	// provisional owners' items no stored Service holds (the Sweeper's).
	bound, freed prometheus.Counter

	mu        sync.Mutex
	conflicts map[string]Conflict // by Service UID and resource
	failures  map[string]Failure  // by Service UID and resource
}

// kubernetesOwnerUID is the owner UID under which allocd reserves the first address of
// its primary range for the kubernetes Service (allocator.KubernetesOwner).
const kubernetesOwnerUID = "default/kubernetes"

// Conflict is an address or port a Service holds in the cluster that allocd gives to
// another owner.
type Conflict struct {
	// Service is namespace/name of the cluster's Service.
	Service string
	// UID of the Service.
	UID string
	// Resource is the ClusterIP or NodePort.
	Resource string
	// Holder is allocd's owner of it ("namespace/name uid").
	Holder string
}

// Failure is an address or port of a Service that could not be adopted for another
// reason than its holder (a ClusterIP outside allocd's ranges or in a terminating
// ServiceCIDR, allocd unreachable): reported and tried again, the Service's other
// addresses and ports adopted meanwhile.
type Failure struct {
	// Service is namespace/name of the cluster's Service.
	Service string
	// UID of the Service.
	UID string
	// Resource is the ClusterIP or NodePort.
	Resource string
	// Err is why.
	Err error
}

// Result is what adopting one Service did.
type Result struct {
	// Adopted are the ClusterIPs and NodePorts newly allocated in allocd.
	Adopted []string
	// Bound are those the admission webhook allocated for the Service, moved from its
	// provisional owner to the Service's UID.
	Bound []string
	// Held are those allocd already had for the Service.
	Held []string
	// Released are those allocd had for the Service and the Service no longer holds.
	Released []string
	// Conflicts are those another owner holds in allocd.
	Conflicts []Conflict
	// Failed are those that could not be adopted for another reason.
	Failed []Failure
}

// New returns an Adopter writing to c.
func New(log *slog.Logger, c *client.Client) *Adopter {
	return &Adopter{c: c, log: log, conflicts: map[string]Conflict{}, failures: map[string]Failure{},
		bound: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "allocd_bridge_pending_bound_total",
			Help: "Addresses and ports the admission webhook allocated, bound to their stored Service's UID.",
		}),
		freed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "allocd_bridge_pending_freed_total",
			Help: "Addresses and ports the admission webhook allocated for a Service never stored, freed " +
				"after the grace.",
		})}
}

// Conflicts returns the conflicts standing now.
func (a *Adopter) Conflicts() []Conflict {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Conflict, 0, len(a.conflicts))
	for _, c := range a.conflicts {
		out = append(out, c)
	}
	slices.SortFunc(out, func(x, y Conflict) int {
		return cmpStrings(x.Service+x.Resource, y.Service+y.Resource)
	})
	return out
}

// Failures returns the failures standing now.
func (a *Adopter) Failures() []Failure {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Failure, 0, len(a.failures))
	for _, f := range a.failures {
		out = append(out, f)
	}
	slices.SortFunc(out, func(x, y Failure) int {
		return cmpStrings(x.Service+x.Resource, y.Service+y.Resource)
	})
	return out
}

func cmpStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// wants is what a Service holds in the cluster: its ClusterIPs and NodePorts.
type wants struct {
	ips   []string
	ports []int32
}

func serviceWants(s *corev1.Service) wants {
	var w wants
	for _, ip := range feed.ClusterIPs(s) {
		if a, err := netip.ParseAddr(ip); err == nil {
			w.ips = append(w.ips, a.String())
		}
	}
	for _, p := range s.Spec.Ports {
		if p.NodePort != 0 && !slices.Contains(w.ports, p.NodePort) {
			w.ports = append(w.ports, p.NodePort)
		}
	}
	if hc := s.Spec.HealthCheckNodePort; hc != 0 && !slices.Contains(w.ports, hc) {
		w.ports = append(w.ports, hc)
	}
	return w
}

// Service makes allocd hold, under s's UID, exactly the ClusterIPs and NodePorts s holds
// (what another owner holds excepted: a Conflict).
func (a *Adopter) Service(ctx context.Context, s *corev1.Service) (Result, error) {
	owner := &allocdv1.Owner{Namespace: s.Namespace, Name: s.Name, Uid: string(s.UID)}
	want := serviceWants(s)
	held, err := a.held(ctx, owner.Uid)
	if err != nil {
		return Result{}, err
	}
	var res Result
	var ips []string
	var ports []int32
	for _, ip := range want.ips {
		if held.ips[ip] {
			res.Held = append(res.Held, ip)
		} else {
			ips = append(ips, ip)
		}
	}
	for _, p := range want.ports {
		if held.ports[p] {
			res.Held = append(res.Held, fmt.Sprint(p))
		} else {
			ports = append(ports, p)
		}
	}
	if err := a.allocate(ctx, s, owner, ips, ports, &res); err != nil {
		return res, err
	}
	if err := a.releaseExtra(ctx, owner, want, held, &res); err != nil {
		return res, err
	}
	a.record(owner, res.Conflicts, res.Failed)
	return res, nil
}

// holdings is what allocd holds for one owner.
type holdings struct {
	ips   map[string]bool
	ports map[int32]bool
}

func (a *Adopter) held(ctx context.Context, uid string) (holdings, error) {
	h := holdings{ips: map[string]bool{}, ports: map[int32]bool{}}
	req := &allocdv1.ListAllocationsRequest{OwnerUid: uid, PageSize: 100}
	for {
		resp, err := a.c.ListAllocations(ctx, req)
		if err != nil {
			return h, fmt.Errorf("adopt: list allocations of %s: %w", uid, err)
		}
		for _, al := range resp.GetAllocations() {
			if al.GetClusterIp() != "" {
				h.ips[al.GetClusterIp()] = true
			}
			if al.GetNodePort() != 0 {
				h.ports[al.GetNodePort()] = true
			}
		}
		if resp.GetNextPageToken() == "" {
			return h, nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// allocate allocates ips and ports for owner, Service s, all at once, or one at a time
// when that fails (another owner holds some of them, an address is outside allocd's
// ranges), so that each is adopted (or bound) on its own and what cannot be is reported
// in res.
func (a *Adopter) allocate(ctx context.Context, s *corev1.Service, owner *allocdv1.Owner, ips []string,
	ports []int32, res *Result) error {
	if len(ips)+len(ports) == 0 {
		return nil
	}
	err := a.allocateOnce(ctx, owner, ips, ports)
	if err == nil {
		res.Adopted = append(res.Adopted, ips...)
		for _, p := range ports {
			res.Adopted = append(res.Adopted, fmt.Sprint(p))
		}
		return nil
	}
	if ctx.Err() != nil {
		return err
	}
	for _, ip := range ips {
		if err := a.one(ctx, s, owner, []string{ip}, nil, ip, res); err != nil {
			return err
		}
	}
	for _, p := range ports {
		if err := a.one(ctx, s, owner, nil, []int32{p}, fmt.Sprint(p), res); err != nil {
			return err
		}
	}
	return nil
}

func (a *Adopter) one(ctx context.Context, s *corev1.Service, owner *allocdv1.Owner, ips []string,
	ports []int32, name string, res *Result) error {
	err := a.allocateOnce(ctx, owner, ips, ports)
	var held *client.AlreadyAllocatedError
	if from := provisionalHolder(err, s); from != nil {
		bound, berr := a.bind(ctx, from, owner, ips, ports)
		switch {
		case berr == nil && bound:
			res.Bound = append(res.Bound, name)
			return nil
		case berr == nil:
			// Moved or freed since allocd answered: once more, as any other item.
			err = a.allocateOnce(ctx, owner, ips, ports)
		default:
			err = berr
		}
	}
	switch {
	case err == nil:
		res.Adopted = append(res.Adopted, name)
	case errors.As(err, &held) && held.HolderUID == kubernetesOwnerUID &&
		owner.Namespace == "default" && owner.Name == "kubernetes":
		// allocd reserves the kubernetes Service's address at start, as kube-apiserver
		// does, under an owner of its own: the same Service.
		res.Held = append(res.Held, name)
	case errors.As(err, &held):
		res.Conflicts = append(res.Conflicts, Conflict{Service: owner.Namespace + "/" + owner.Name,
			UID: owner.Uid, Resource: name, Holder: held.Holder})
	case ctx.Err() != nil:
		return err
	default:
		res.Failed = append(res.Failed, Failure{Service: owner.Namespace + "/" + owner.Name,
			UID: owner.Uid, Resource: name, Err: err})
	}
	return nil
}

func (a *Adopter) allocateOnce(ctx context.Context, owner *allocdv1.Owner, ips []string,
	ports []int32) error {
	_, err := a.c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: owner, ClusterIps: ips, NodePorts: ports,
		NoClusterIp: len(ips) == 0})
	if err != nil {
		return fmt.Errorf("adopt: allocate %v %v for %s/%s: %w", ips, ports, owner.Namespace, owner.Name, err)
	}
	return nil
}

// provisionalHolder returns the provisional owner that holds the item err (an
// Allocate's) refused, when it holds it for Service s: a provisional owner (admission
// webhook) of s's namespace named after s, or after its generateName.
func provisionalHolder(err error, s *corev1.Service) *allocdv1.Owner {
	var held *client.AlreadyAllocatedError
	var e *client.Error
	if !errors.As(err, &held) || !errors.As(err, &e) || !isProvisional(held.HolderUID) {
		return nil
	}
	ns, name := e.Metadata["holder_namespace"], e.Metadata["holder_name"]
	if ns != s.Namespace || name != s.Name && (s.GenerateName == "" || name != s.GenerateName) {
		return nil
	}
	return &allocdv1.Owner{Namespace: ns, Name: name, Uid: held.HolderUID}
}

// bind moves ips and ports from a provisional owner to owner in one transaction; bound
// is false when from no longer holds them (bound or freed by someone else meanwhile).
func (a *Adopter) bind(ctx context.Context, from, owner *allocdv1.Owner, ips []string, ports []int32) (
	bound bool, _ error) {
	resp, err := a.c.Transfer(ctx, &allocdv1.TransferRequest{From: from, To: owner, ClusterIps: ips,
		NodePorts: ports})
	switch {
	case errors.Is(err, client.ErrNotOwner):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("adopt: bind %v %v of %s to %s/%s: %w", ips, ports, from.Uid,
			owner.Namespace, owner.Name, err)
	}
	n := len(resp.GetTransferredClusterIps()) + len(resp.GetTransferredNodePorts())
	a.bound.Add(float64(n))
	if n > 0 {
		a.log.Info("bound the admission webhook's allocation to its Service", "service",
			owner.Namespace+"/"+owner.Name, "uid", owner.Uid, "from", from.Uid, "cluster_ips",
			resp.GetTransferredClusterIps(), "node_ports", resp.GetTransferredNodePorts())
	}
	return true, nil
}

// releaseExtra releases what allocd holds for owner that the Service no longer holds.
func (a *Adopter) releaseExtra(ctx context.Context, owner *allocdv1.Owner, want wants, held holdings,
	res *Result) error {
	var ips []string
	var ports []int32
	for ip := range held.ips {
		if !slices.Contains(want.ips, ip) {
			ips = append(ips, ip)
		}
	}
	for p := range held.ports {
		if !slices.Contains(want.ports, p) {
			ports = append(ports, p)
		}
	}
	if len(ips)+len(ports) == 0 {
		return nil
	}
	resp, err := a.c.Release(ctx, &allocdv1.ReleaseRequest{Owner: owner, ClusterIps: ips, NodePorts: ports})
	if err != nil {
		return fmt.Errorf("adopt: release %v %v of %s/%s: %w", ips, ports, owner.Namespace, owner.Name, err)
	}
	res.Released = append(res.Released, resp.GetReleasedClusterIps()...)
	for _, p := range resp.GetReleasedNodePorts() {
		res.Released = append(res.Released, fmt.Sprint(p))
	}
	return nil
}

// Deleted releases everything allocd holds for the deleted Service of uid.
func (a *Adopter) Deleted(ctx context.Context, namespace, name, uid string) error {
	owner := &allocdv1.Owner{Namespace: namespace, Name: name, Uid: uid}
	if _, err := a.c.Release(ctx, &allocdv1.ReleaseRequest{Owner: owner}); err != nil {
		return fmt.Errorf("adopt: release %s/%s: %w", namespace, name, err)
	}
	a.record(owner, nil, nil)
	return nil
}

// record replaces the conflicts and failures standing for owner.
func (a *Adopter) record(owner *allocdv1.Owner, conflicts []Conflict, failures []Failure) {
	a.mu.Lock()
	defer a.mu.Unlock()
	maps.DeleteFunc(a.conflicts, func(_ string, c Conflict) bool { return c.UID == owner.Uid })
	maps.DeleteFunc(a.failures, func(_ string, f Failure) bool { return f.UID == owner.Uid })
	for _, c := range conflicts {
		a.conflicts[c.UID+" "+c.Resource] = c
		a.log.Warn("address held by the cluster's Service is allocated to another owner in allocd; not taken",
			"service", c.Service, "uid", c.UID, "resource", c.Resource, "holder", c.Holder)
	}
	for _, f := range failures {
		a.failures[f.UID+" "+f.Resource] = f
		a.log.Warn("address held by the cluster's Service could not be adopted; trying again",
			"service", f.Service, "uid", f.UID, "resource", f.Resource, "error", f.Err)
	}
}

// CIDRSync is what one sync of the cluster's ServiceCIDRs into allocd changed.
type CIDRSync struct {
	// Created are the ServiceCIDRs created in allocd, Deleted those deleted
	// (terminating) in allocd, Failed those whose creation or deletion failed (allocd
	// unreachable, say: worth trying again).
	Created, Deleted, Failed []string
}

// ServiceCIDRs makes allocd's ServiceCIDRs follow the cluster's, cidrs, by name: one
// kube-apiserver allocates from (admit.ServiceCIDRReady) that allocd lacks is created;
// one the cluster is deleting that allocd has ready is deleted in allocd (terminating:
// allocd allocates nothing new from it, as kube-apiserver does not, and removes it once
// no address lies in it alone); one whose Ready condition is false otherwise is left as
// it is. A name allocd has with other CIDRs is reported, neither changed nor deleted,
// and so is one the cluster has ready and allocd terminating (allocd creates it again
// once it is removed). allocd's ServiceCIDRs that the cluster lacks are left alone:
// allocd may serve more than the cluster.
func (a *Adopter) ServiceCIDRs(ctx context.Context, cidrs []networkingv1.ServiceCIDR) (CIDRSync, error) {
	have, err := a.c.ListServiceCIDRs(ctx)
	if err != nil {
		return CIDRSync{}, fmt.Errorf("adopt: list allocd's ServiceCIDRs: %w", err)
	}
	byName := map[string]*allocdv1.ServiceCIDR{}
	for _, sc := range have {
		byName[sc.GetName()] = sc
	}
	var res CIDRSync
	var errs []error
	for i := range cidrs {
		sc := &cidrs[i]
		want, cur := canonical(sc.Spec.CIDRs), byName[sc.Name]
		switch {
		case cur != nil && !slices.Equal(canonical(cur.GetCidrs()), want):
			errs = append(errs, fmt.Errorf("adopt: ServiceCIDR %s is %v in the cluster and %v in allocd",
				sc.Name, sc.Spec.CIDRs, cur.GetCidrs()))
		case sc.DeletionTimestamp != nil:
			if cur == nil || cur.GetState() != allocdv1.ServiceCIDRState_SERVICE_CIDR_STATE_READY {
				continue
			}
			_, err := a.c.DeleteServiceCIDR(ctx, sc.Name)
			if err != nil && !errors.Is(err, client.ErrNotFound) {
				errs = append(errs, fmt.Errorf("adopt: delete ServiceCIDR %s %v: %w", sc.Name, want, err))
				res.Failed = append(res.Failed, sc.Name)
				continue
			}
			res.Deleted = append(res.Deleted, sc.Name)
		case !admit.ServiceCIDRReady(sc):
		case cur != nil && cur.GetState() != allocdv1.ServiceCIDRState_SERVICE_CIDR_STATE_READY:
			errs = append(errs, fmt.Errorf("adopt: ServiceCIDR %s is ready in the cluster and terminating "+
				"in allocd: created again once allocd removed it", sc.Name))
		case cur == nil:
			_, err := a.c.CreateServiceCIDR(ctx, sc.Name, want...)
			if err != nil && !errors.Is(err, client.ErrAlreadyExists) {
				errs = append(errs, fmt.Errorf("adopt: create ServiceCIDR %s %v: %w", sc.Name, want, err))
				res.Failed = append(res.Failed, sc.Name)
				continue
			}
			res.Created = append(res.Created, sc.Name)
		}
	}
	return res, errors.Join(errs...)
}

func canonical(cidrs []string) []string {
	out := make([]string, 0, len(cidrs))
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p.Masked().String())
		} else {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}
