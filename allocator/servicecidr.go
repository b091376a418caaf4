package allocator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/badrequest"
)

// KubernetesCIDR is the name of the ServiceCIDR that --service-cluster-ip-range
// seeds on first start, as Kubernetes' default ServiceCIDR.
const KubernetesCIDR = "kubernetes"

// CIDRState is the state of a ServiceCIDR.
type CIDRState int

const (
	// CIDRReady: addresses are allocated from it.
	CIDRReady CIDRState = iota + 1
	// CIDRTerminating: deleted, no longer allocated from, and removed once no
	// allocated address lies in it alone.
	CIDRTerminating
)

// String returns "ready" or "terminating".
func (s CIDRState) String() string {
	switch s {
	case CIDRReady:
		return "ready"
	case CIDRTerminating:
		return "terminating"
	}
	return "unknown"
}

// ServiceCIDR is a named set of one or two ClusterIP ranges (at most one per family)
// that addresses are allocated from, stored at <prefix>/config/servicecidrs/<name>.
type ServiceCIDR struct {
	Name  string
	CIDRs []netip.Prefix
	State CIDRState
	// Created is when it was created; Terminating when it was deleted (zero while
	// ready).
	Created, Terminating time.Time
	// CreateRevision and Revision are its key's etcd revisions.
	CreateRevision, Revision int64
	// Blockers is, for a terminating ServiceCIDR, how many allocated addresses lie in
	// it and in no ready ServiceCIDR; Sample lists some of them (at most
	// BlockerSample), as the index sees them. Filled by GetServiceCIDR.
	Blockers int
	Sample   []Allocation
}

// BlockerSample is the most blocking allocations GetServiceCIDR lists.
const BlockerSample = 10

// storedCIDR is the JSON of a ServiceCIDR key.
type storedCIDR struct {
	Name        string    `json:"name"`
	CIDRs       []string  `json:"cidrs"`
	State       string    `json:"state"`
	Created     time.Time `json:"created"`
	Terminating time.Time `json:"terminating,omitzero"`
}

var cidrName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)

// validateServiceCIDR checks a ServiceCIDR to create: a DNS-subdomain name, one or two
// CIDRs of different families, each a plain masked prefix of 8 to 2^24 addresses. It
// returns an *InvalidError with every violation.
func validateServiceCIDR(name string, cidrs []string) ([]netip.Prefix, error) {
	var v badrequest.Error
	switch {
	case name == "":
		v.Add("name", "must not be empty")
	case len(name) > 253 || !cidrName.MatchString(name):
		v.Add("name", fmt.Sprintf("%q is not a DNS subdomain: lower-case letters, digits, '-' and '.', at "+
			"most 253, starting and ending with a letter or digit", name))
	}
	switch len(cidrs) {
	case 1, 2:
	case 0:
		v.Add("cidrs", "at least one CIDR is required")
	default:
		v.Add("cidrs", fmt.Sprintf("%d CIDRs given; at most two, one per IP family", len(cidrs)))
	}
	var out []netip.Prefix
	for i, s := range cidrs {
		field := fmt.Sprintf("cidrs[%d]", i)
		p, err := netip.ParsePrefix(s)
		if err != nil {
			v.Add(field, fmt.Sprintf("%q is not a CIDR", s))
			continue
		}
		if problem := prefixProblem(p); problem != "" {
			v.Add(field, problem)
			continue
		}
		if len(out) == 1 && out[0].Addr().Is4() == p.Addr().Is4() {
			v.Add(field, fmt.Sprintf(
				"%s and %s are of the same IP family; a second CIDR must be of the other family", out[0], p))
			continue
		}
		out = append(out, p)
	}
	if err := v.OrNil(); err != nil {
		return nil, err
	}
	return out, nil
}

func (s *store) cidrKey(name string) string { return s.cidrPrefix + name }

func encodeCIDR(c ServiceCIDR) string {
	sc := storedCIDR{Name: c.Name, State: c.State.String(), Created: c.Created.UTC(),
		Terminating: c.Terminating.UTC()}
	for _, p := range c.CIDRs {
		sc.CIDRs = append(sc.CIDRs, p.String())
	}
	b, _ := json.Marshal(sc) // cannot fail: strings and times
	return string(b)
}

func decodeCIDR(v []byte, createRev, modRev int64) (ServiceCIDR, error) {
	var sc storedCIDR
	if err := json.Unmarshal(v, &sc); err != nil {
		return ServiceCIDR{}, err
	}
	c := ServiceCIDR{Name: sc.Name, Created: sc.Created, Terminating: sc.Terminating,
		CreateRevision: createRev, Revision: modRev}
	switch sc.State {
	case "ready":
		c.State = CIDRReady
	case "terminating":
		c.State = CIDRTerminating
	default:
		return ServiceCIDR{}, fmt.Errorf("unknown state %q", sc.State)
	}
	for _, s := range sc.CIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return ServiceCIDR{}, err
		}
		c.CIDRs = append(c.CIDRs, p)
	}
	if len(c.CIDRs) == 0 {
		return ServiceCIDR{}, errors.New("no CIDRs")
	}
	return c, nil
}

// decodeCIDRs decodes ServiceCIDR keys, skipping (and logging) what does not decode.
func (s *store) decodeCIDRs(kvs []*mvccpb.KeyValue) []ServiceCIDR {
	out := make([]ServiceCIDR, 0, len(kvs))
	for _, kv := range kvs {
		c, err := decodeCIDR(kv.Value, kv.CreateRevision, kv.ModRevision)
		if err != nil {
			s.log.Warn("undecodable ServiceCIDR; ignored", "key", string(kv.Key), "err", err)
			continue
		}
		out = append(out, c)
	}
	return out
}

// readCIDR reads the ServiceCIDR name: a *CIDRNotFoundError when etcd has none.
func (s *store) readCIDR(ctx context.Context, name string) (ServiceCIDR, error) {
	key := s.cidrKey(name)
	resp, err := s.cli.Get(ctx, key)
	if err != nil {
		return ServiceCIDR{}, fmt.Errorf("read ServiceCIDR %s: %w", name, err)
	}
	if len(resp.Kvs) == 0 {
		return ServiceCIDR{}, &CIDRNotFoundError{Name: name}
	}
	kv := resp.Kvs[0]
	c, err := decodeCIDR(kv.Value, kv.CreateRevision, kv.ModRevision)
	if err != nil {
		return ServiceCIDR{}, fmt.Errorf("ServiceCIDR at %s: %w", key, err)
	}
	return c, nil
}

// seedKubernetesCIDR creates the kubernetes ServiceCIDR from cidrs unless it exists,
// and returns it (the stored one wins, as in Kubernetes: first writer wins).
func (s *store) seedKubernetesCIDR(ctx context.Context, cidrs []netip.Prefix) (ServiceCIDR, error) {
	key := s.cidrKey(KubernetesCIDR)
	c := ServiceCIDR{Name: KubernetesCIDR, CIDRs: cidrs, State: CIDRReady, Created: time.Now()}
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, encodeCIDR(c))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return ServiceCIDR{}, fmt.Errorf("create the kubernetes ServiceCIDR: %w", err)
	}
	if resp.Succeeded {
		c.CreateRevision, c.Revision = resp.Header.Revision, resp.Header.Revision
		s.log.Info("created the kubernetes ServiceCIDR", "key", key, "cidrs", prefixes(cidrs))
		return c, nil
	}
	kv := resp.Responses[0].GetResponseRange().Kvs[0]
	stored, err := decodeCIDR(kv.Value, kv.CreateRevision, kv.ModRevision)
	if err != nil {
		return ServiceCIDR{}, fmt.Errorf("ServiceCIDR at %s: %w", key, err)
	}
	if !slices.Equal(stored.CIDRs, cidrs) {
		s.log.Warn("the kubernetes ServiceCIDR in etcd differs from --service-cluster-ip-range; the stored "+
			"one is used (add ranges with CreateServiceCIDR)",
			"stored", prefixes(stored.CIDRs), "flag", prefixes(cidrs))
	}
	return stored, nil
}

func prefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// CreateServiceCIDR creates a ready ServiceCIDR. Errors: *InvalidError,
// *CIDRExistsError, etcd's. Every replica allocates from it once its watch has seen
// it; the Allocator that created it has when CreateServiceCIDR returns.
func (a *Allocator) CreateServiceCIDR(ctx context.Context, name string, cidrs []string) (ServiceCIDR, error) {
	ps, err := validateServiceCIDR(name, cidrs)
	if err != nil {
		return ServiceCIDR{}, err
	}
	key := a.cidrKey(name)
	c := ServiceCIDR{Name: name, CIDRs: ps, State: CIDRReady, Created: time.Now().UTC().Truncate(time.Second)}
	resp, err := a.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, encodeCIDR(c))).Commit()
	if err != nil {
		return ServiceCIDR{}, fmt.Errorf("create ServiceCIDR %s: %w", name, err)
	}
	if !resp.Succeeded {
		return ServiceCIDR{}, &CIDRExistsError{Name: name}
	}
	c.CreateRevision, c.Revision = resp.Header.Revision, resp.Header.Revision
	a.log.Info("created ServiceCIDR", "name", name, "cidrs", prefixes(ps), "revision", c.Revision)
	a.waitIndex(ctx, c.Revision)
	return c, nil
}

// DeleteServiceCIDR marks a ServiceCIDR terminating: once it returns, no replica
// allocates an address from it that no other ready ServiceCIDR holds (every
// allocation compares the state of the ServiceCIDR it draws from, in its
// transaction). It is removed once no allocated address lies in it alone. Deleting a
// terminating ServiceCIDR again is a no-op. Errors: *CIDRNotFoundError, etcd's.
func (a *Allocator) DeleteServiceCIDR(ctx context.Context, name string) (ServiceCIDR, error) {
	key := a.cidrKey(name)
	for range maxConflicts {
		c, err := a.readCIDR(ctx, name)
		if err != nil || c.State == CIDRTerminating {
			return c, err
		}
		c.State, c.Terminating = CIDRTerminating, time.Now().UTC().Truncate(time.Second)
		put, err := a.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", c.Revision)).
			Then(clientv3.OpPut(key, encodeCIDR(c))).Commit()
		if err != nil {
			return ServiceCIDR{}, fmt.Errorf("delete ServiceCIDR %s: %w", name, err)
		}
		if put.Succeeded {
			c.Revision = put.Header.Revision
			a.log.Info("ServiceCIDR terminating", "name", name, "cidrs", prefixes(c.CIDRs),
				"revision", c.Revision)
			a.waitIndex(ctx, c.Revision)
			return c, nil
		}
	}
	return ServiceCIDR{}, fmt.Errorf("delete ServiceCIDR %s: %w", name, ErrConflict)
}

// waitIndex lets the index catch up with rev, so that the caller's next call sees
// its own change; a watch that lags only delays that, so its error is dropped.
func (a *Allocator) waitIndex(ctx context.Context, rev int64) {
	_ = a.progress.Wait(ctx, rev, a.syncTimeout)
}

// GetServiceCIDR returns a ServiceCIDR as etcd holds it, with its blockers when
// terminating. Errors: *CIDRNotFoundError, ErrNotSynced, ErrNotRunning, etcd's.
func (a *Allocator) GetServiceCIDR(ctx context.Context, name string) (ServiceCIDR, error) {
	if err := a.Sync(ctx); err != nil {
		return ServiceCIDR{}, err
	}
	c, err := a.readCIDR(ctx, name)
	if err != nil {
		return ServiceCIDR{}, err
	}
	if c.State == CIDRTerminating {
		if err := a.blockers(ctx, &c); err != nil {
			return ServiceCIDR{}, err
		}
	}
	return c, nil
}

// ListServiceCIDRs returns every ServiceCIDR, by name, with the blockers of the
// terminating ones.
func (a *Allocator) ListServiceCIDRs(ctx context.Context) ([]ServiceCIDR, error) {
	if err := a.Sync(ctx); err != nil {
		return nil, err
	}
	resp, err := a.cli.Get(ctx, a.cidrPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list ServiceCIDRs: %w", err)
	}
	out := a.decodeCIDRs(resp.Kvs)
	for i := range out {
		if out[i].State == CIDRTerminating {
			if err := a.blockers(ctx, &out[i]); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// blockers fills c's Blockers and Sample from the index: the allocated addresses of
// its CIDRs that no ready ServiceCIDR holds, with their holders read from etcd.
func (a *Allocator) blockers(ctx context.Context, c *ServiceCIDR) error {
	var sample []Item
	c.Blockers = 0
	a.tab.Load().eachBlocker(c.CIDRs, func(addr netip.Addr) bool {
		c.Blockers++
		if len(sample) < BlockerSample {
			sample = append(sample, IP(addr))
		}
		return true
	})
	c.Sample = nil
	for _, it := range sample {
		al, err := a.Get(ctx, it)
		if errors.Is(err, ErrNotFound) {
			continue // released since the index saw it
		}
		if err != nil {
			return err
		}
		c.Sample = append(c.Sample, al)
	}
	return nil
}
