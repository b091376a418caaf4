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

// ServiceCIDRs in etcd: their validation, their JSON, reading them and seeding the
// kubernetes one.

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
