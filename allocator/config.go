package allocator

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures an Allocator.
type Config struct {
	// Prefix is the etcd key prefix, e.g. "/allocd" (no trailing slash).
	Prefix string
	// ClusterIPRanges are one or two CIDRs, one per family; the first is primary.
	ClusterIPRanges []netip.Prefix
	// NodePortRange is the --service-node-port-range.
	NodePortRange PortRange
	// KubernetesNodePort is reserved with the kubernetes address; 0 = none.
	KubernetesNodePort int
	// Logger receives the allocator's logs; nil discards them.
	Logger *slog.Logger
	// Registerer receives the allocator's metrics; nil means no metrics.
	Registerer prometheus.Registerer
	// CommitConcurrency is how many group-commit transactions may be in flight at
	// once; 0 means DefaultCommitConcurrency.
	CommitConcurrency int
	// KeepHolders keeps the holders (who holds each item, holders.go) from the start,
	// and again after they are dropped, instead of from the first repair pass: then
	// the first pass of a term of leadership reads only what it must, as every later
	// one does. It costs a listing of every allocation in the background shortly after
	// Run starts (and after a compaction of the watch or a ServiceCIDR change), and
	// about 50 bytes per allocation. A replica that may run repair passes wants it.
	KeepHolders bool
}

// DefaultCommitConcurrency is the default number of transactions in flight.
const DefaultCommitConcurrency = 4

// MaxItems is the most items (ClusterIPs plus NodePorts) one request may name or ask
// for, and the most one owner may hold: one transaction of a request with its owner
// record stays within etcd's 128 operations.
const MaxItems = 64

// maxTxnOps is a stock etcd's --max-txn-ops: the bound of compares, of success
// operations and of failure operations of one transaction, each.
const maxTxnOps = 128

// ValidateConfig checks the configuration as flags are checked: the etcd prefix, one
// or two ClusterIP ranges of different families with 8 to 2^24 addresses and no host
// bits, a node port range inside 1-65535, and the kubernetes node port inside it. It
// returns every problem at once.
func ValidateConfig(cfg Config) error {
	var errs []error
	switch {
	case cfg.Prefix == "":
		errs = append(errs, errors.New("etcd prefix is empty"))
	case !strings.HasPrefix(cfg.Prefix, "/"):
		errs = append(errs, fmt.Errorf("etcd prefix %q must start with /", cfg.Prefix))
	case strings.HasSuffix(cfg.Prefix, "/"):
		errs = append(errs, fmt.Errorf("etcd prefix %q must not end with /", cfg.Prefix))
	}
	switch len(cfg.ClusterIPRanges) {
	case 1, 2:
	case 0:
		errs = append(errs, errors.New("service cluster IP range: none given"))
	default:
		errs = append(errs, fmt.Errorf("service cluster IP range: %d ranges given; at most "+
			"two, one per IP family", len(cfg.ClusterIPRanges)))
	}
	for i, p := range cfg.ClusterIPRanges {
		if err := validatePrefix(p); err != nil {
			errs = append(errs, err)
		}
		if i == 1 && p.Addr().Is4() == cfg.ClusterIPRanges[0].Addr().Is4() {
			errs = append(errs, fmt.Errorf("service cluster IP ranges %s and %s are of the same IP family; "+
				"a second range must be of the other family", cfg.ClusterIPRanges[0], p))
		}
	}
	pr := cfg.NodePortRange
	if pr.Size < 1 || pr.Base < 1 || pr.Base+pr.Size-1 > 65535 {
		errs = append(errs,
			fmt.Errorf("service node port range base %d size %d: must lie within 1-65535", pr.Base, pr.Size))
	} else if cfg.KubernetesNodePort != 0 && !pr.Contains(cfg.KubernetesNodePort) {
		errs = append(errs, fmt.Errorf("kubernetes service node port %d is outside the "+
			"service node port range %s", cfg.KubernetesNodePort, pr))
	}
	return errors.Join(errs...)
}

// validatePrefix refuses a range that prefixProblem finds unusable.
func validatePrefix(p netip.Prefix) error {
	if problem := prefixProblem(p); problem != "" {
		return errors.New("service cluster IP range " + problem)
	}
	return nil
}

// prefixProblem says what makes p unusable as a range, starting with p ("10.0.0.0/31
// holds 2 addresses; ..."), or returns "" when it is usable.
func prefixProblem(p netip.Prefix) string {
	if !p.IsValid() {
		return fmt.Sprintf("%s is not a valid CIDR", p)
	}
	if p.Addr().Is4In6() || p.Addr().Zone() != "" {
		return fmt.Sprintf("%s: use a plain IPv4 or IPv6 CIDR", p)
	}
	if p != p.Masked() {
		return fmt.Sprintf("%s has host bits set; did you mean %s?", p, p.Masked())
	}
	host := p.Addr().BitLen() - p.Bits()
	if host < 3 {
		return fmt.Sprintf(
			"%s holds %d addresses; at least 8 are needed (/31, /32, /127 and /128 are refused)",
			p, 1<<host)
	}
	if host > MaxRangeBits {
		return fmt.Sprintf("%s is larger than 2^%d addresses (an IPv4 /%d or an IPv6 /%d)",
			p, MaxRangeBits, 32-MaxRangeBits, 128-MaxRangeBits)
	}
	return ""
}

// MaxRangeBits is the most host bits a ClusterIP range may have: 2^24 addresses (an
// IPv4 /8 or an IPv6 /104), two bitsets of 2 MiB each in memory.
const MaxRangeBits = 24
