package daemon

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/allocd/allocd/allocator"
)

// Config is every setting of allocd; DefaultConfig gives the defaults and
// RegisterFlags binds it to command-line flags.
type Config struct {
	// etcd
	EtcdServers               []string
	EtcdPrefix                string
	EtcdCAFile                string
	EtcdCertFile              string
	EtcdKeyFile               string
	DataDir                   string
	EmbeddedEtcdClientAddress string
	EmbeddedEtcdPeerAddress   string
	EtcdCompactionInterval    time.Duration
	QuotaBackendBytes         int64
	embeddedEtcdUnsafeNoFsync bool // tests only
	embeddedEtcdTickMs        uint // tests only
	embeddedEtcdElectionMs    uint // tests only
	// tests only: how often the embedded etcd's status is read (1 s when 0)
	etcdSpacePoll time.Duration
	// ranges
	ServiceClusterIPRange     string
	ServiceNodePortRange      string
	KubernetesServiceNodePort int
	// leases
	MasterLeasePrefix          string
	MasterLeaseTTL             time.Duration
	EndpointReconcilerInterval time.Duration
	KubernetesServicePort      int
	// repair
	RepairInterval      time.Duration
	RepairLeakStrikes   int
	RepairLeakGrace     time.Duration
	ServiceSnapshotFile string
	// endpoint controllers
	Controllers                     string
	ConcurrentEndpointSyncs         int
	EndpointUpdatesBatchPeriod      time.Duration
	ConcurrentServiceEndpointSyncs  int
	EndpointSliceUpdatesBatchPeriod time.Duration
	MaxEndpointsPerSlice            int
	EtcdMaxTxnOps                   int
	// serving
	GRPCAddress      string
	AdvertiseAddress string
	MetricsAddress   string
	PprofAddress     string
	ShutdownTimeout  time.Duration
	// security
	TLSCertFile             string
	TLSPrivateKeyFile       string
	ClientCAFile            string
	AuthorizationPolicyFile string
	MetricsTLS              bool
	securityRefresh         time.Duration // tests only: how often the files are read again
	// logging
	LogFormat string
	LogLevel  string

	// LogOutput is where logs go (os.Stderr in the daemon).
	LogOutput io.Writer
}

// DefaultConfig returns the defaults: embedded etcd in ./allocd-data on loopback,
// kube-apiserver's defaults for ranges, leases and repair, and loopback listeners.
func DefaultConfig() Config {
	return Config{
		EtcdPrefix:                     "/allocd",
		DataDir:                        "allocd-data",
		EmbeddedEtcdClientAddress:      "127.0.0.1:12379",
		EmbeddedEtcdPeerAddress:        "127.0.0.1:12380",
		EtcdCompactionInterval:         5 * time.Minute,
		QuotaBackendBytes:              DefaultQuotaBackendBytes,
		ServiceClusterIPRange:          "10.0.0.0/24",
		ServiceNodePortRange:           "30000-32767",
		MasterLeasePrefix:              "/masterleases/",
		MasterLeaseTTL:                 15 * time.Second,
		EndpointReconcilerInterval:     10 * time.Second,
		KubernetesServicePort:          6443,
		RepairInterval:                 3 * time.Minute,
		RepairLeakStrikes:              3,
		RepairLeakGrace:                60 * time.Second,
		Controllers:                    "endpoint,endpointslice",
		ConcurrentEndpointSyncs:        5,
		ConcurrentServiceEndpointSyncs: 5,
		MaxEndpointsPerSlice:           100,
		EtcdMaxTxnOps:                  128,
		GRPCAddress:                    "127.0.0.1:8080",
		MetricsAddress:                 "127.0.0.1:9090",
		ShutdownTimeout:                5 * time.Second,
		LogFormat:                      "text",
		LogLevel:                       "info",
	}
}

// flagGroup is a heading of `allocd --help` and the flags under it, in order.
type flagGroup struct {
	title string
	names []string
}

var flagGroups = []flagGroup{
	{"etcd", []string{"etcd-servers", "etcd-prefix", "etcd-cafile", "etcd-certfile", "etcd-keyfile",
		"etcd-compaction-interval", "data-dir", "embedded-etcd-client-address", "embedded-etcd-peer-address",
		"quota-backend-bytes"}},
	{"ranges", []string{"service-cluster-ip-range", "service-node-port-range",
		"kubernetes-service-node-port"}},
	{"leases", []string{"master-lease-prefix", "master-lease-ttl", "endpoint-reconciler-interval",
		"kubernetes-service-port"}},
	{"repair", []string{"repair-interval", "repair-leak-strikes", "repair-leak-grace",
		"service-snapshot-file"}},
	{"endpoint controllers", []string{"controllers", "concurrent-endpoint-syncs",
		"endpoint-updates-batch-period", "concurrent-service-endpoint-syncs",
		"endpointslice-updates-batch-period", "max-endpoints-per-slice", "etcd-max-txn-ops"}},
	{"serving", []string{"grpc-address", "advertise-address", "metrics-address", "pprof-address",
		"shutdown-timeout"}},
	{"security", []string{"tls-cert-file", "tls-private-key-file", "client-ca-file",
		"authorization-policy-file", "metrics-tls"}},
	{"logging", []string{"log-format", "log-level"}},
}

// RegisterFlags binds c to fs; c's current values are the defaults shown by --help.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Func("etcd-servers", "etcd client URLs, comma separated; empty: run an embedded etcd in --data-dir",
		func(s string) error {
			c.EtcdServers = nil
			for _, u := range strings.Split(s, ",") {
				if u = strings.TrimSpace(u); u != "" {
					c.EtcdServers = append(c.EtcdServers, u)
				}
			}
			return nil
		})
	fs.StringVar(&c.EtcdPrefix, "etcd-prefix", c.EtcdPrefix, "prefix of every key allocd writes in etcd")
	fs.StringVar(&c.EtcdCAFile, "etcd-cafile", c.EtcdCAFile, "CA bundle to verify the etcd servers (TLS)")
	fs.StringVar(&c.EtcdCertFile, "etcd-certfile", c.EtcdCertFile, "client certificate for etcd (TLS)")
	fs.StringVar(&c.EtcdKeyFile, "etcd-keyfile", c.EtcdKeyFile, "client key for etcd (TLS)")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir,
		"data directory of the embedded etcd (created if missing)")
	fs.StringVar(&c.EmbeddedEtcdClientAddress, "embedded-etcd-client-address", c.EmbeddedEtcdClientAddress,
		"host:port the embedded etcd serves clients on (etcdctl --endpoints)")
	fs.StringVar(&c.EmbeddedEtcdPeerAddress, "embedded-etcd-peer-address", c.EmbeddedEtcdPeerAddress,
		"host:port of the embedded etcd's peer listener")
	fs.DurationVar(&c.EtcdCompactionInterval, "etcd-compaction-interval", c.EtcdCompactionInterval,
		"how often etcd's history older than this is compacted, once for all replicas (kube-apiserver's "+
			"flag); with the embedded etcd also sooner when a burst of writes outgrows the history budget; "+
			"0: never (an etcd shared with kube-apiserver, or with its own --auto-compaction-retention, "+
			"may leave it to them)")
	fs.Int64Var(&c.QuotaBackendBytes, "quota-backend-bytes", c.QuotaBackendBytes,
		"size the embedded etcd's database may reach before etcd raises the NOSPACE alarm and refuses "+
			"writes (etcd's flag); 0: etcd's default, 2 GiB; with --etcd-servers set it on the etcd members")
	c.registerServingFlags(fs)
}

// registerServingFlags binds the flags of the ranges, the leases, repair, the
// endpoint controllers, serving, security and logging to fs.
func (c *Config) registerServingFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.ServiceClusterIPRange, "service-cluster-ip-range", c.ServiceClusterIPRange,
		"ClusterIP CIDRs, one or two (one per family) comma separated, the first primary: they seed the "+
			"ServiceCIDR \"kubernetes\" on first start; later, etcd's ServiceCIDRs win (CreateServiceCIDR "+
			"adds ranges at runtime)")
	fs.StringVar(&c.ServiceNodePortRange, "service-node-port-range", c.ServiceNodePortRange,
		"NodePort range FIRST-LAST, inclusive")
	fs.IntVar(&c.KubernetesServiceNodePort, "kubernetes-service-node-port", c.KubernetesServiceNodePort,
		"NodePort reserved for the kubernetes Service; 0: none")
	fs.StringVar(&c.MasterLeasePrefix, "master-lease-prefix", c.MasterLeasePrefix,
		"key prefix of master leases, under --etcd-prefix")
	fs.DurationVar(&c.MasterLeaseTTL, "master-lease-ttl", c.MasterLeaseTTL,
		"TTL of a master lease when Renew gives none")
	fs.DurationVar(&c.EndpointReconcilerInterval, "endpoint-reconciler-interval",
		c.EndpointReconcilerInterval, "how often the stored Endpoints of default/kubernetes are "+
			"checked against the master leases and put right when they differ (kube-apiserver's "+
			"endpoint reconcile interval)")
	fs.IntVar(&c.KubernetesServicePort, "kubernetes-service-port", c.KubernetesServicePort,
		"port \"https\" of the kubernetes Service's Endpoints")
	fs.DurationVar(&c.RepairInterval, "repair-interval", c.RepairInterval, "time between repair passes")
	fs.IntVar(&c.RepairLeakStrikes, "repair-leak-strikes", c.RepairLeakStrikes,
		"consecutive passes an allocation must be unused before it is freed")
	fs.DurationVar(&c.RepairLeakGrace, "repair-leak-grace", c.RepairLeakGrace,
		"minimum age of an allocation before it may be freed as a leak")
	fs.StringVar(&c.ServiceSnapshotFile, "service-snapshot-file", c.ServiceSnapshotFile,
		"JSON Service snapshot re-read every repair pass; empty: snapshots come by PushServiceSnapshot")
	fs.IntVar(&c.ConcurrentEndpointSyncs, "concurrent-endpoint-syncs", c.ConcurrentEndpointSyncs,
		"Services whose Endpoints are synced at once (kube-controller-manager's flag)")
	fs.DurationVar(&c.EndpointUpdatesBatchPeriod, "endpoint-updates-batch-period",
		c.EndpointUpdatesBatchPeriod, "delay of an Endpoints sync after a Pod event, so that the events of "+
			"one period make one write; 0: none (kube-controller-manager's flag)")
	fs.StringVar(&c.Controllers, "controllers", c.Controllers, "the endpoint controllers to run, comma "+
		"separated, as kube-controller-manager names them: endpoint, endpointslice; '*' is both, -NAME "+
		"turns one off ('*,-endpoint')")
	fs.IntVar(&c.ConcurrentServiceEndpointSyncs, "concurrent-service-endpoint-syncs",
		c.ConcurrentServiceEndpointSyncs,
		"Services whose EndpointSlices are synced at once (kube-controller-manager's flag)")
	fs.DurationVar(&c.EndpointSliceUpdatesBatchPeriod, "endpointslice-updates-batch-period",
		c.EndpointSliceUpdatesBatchPeriod, "delay of an EndpointSlice sync after a Pod or Node event, so "+
			"that the events of one period make one write; 0: none (kube-controller-manager's flag)")
	fs.IntVar(&c.MaxEndpointsPerSlice, "max-endpoints-per-slice", c.MaxEndpointsPerSlice,
		"most endpoints in one EndpointSlice, 1-1000 (kube-controller-manager's flag)")
	fs.IntVar(&c.EtcdMaxTxnOps, "etcd-max-txn-ops", c.EtcdMaxTxnOps,
		"the --max-txn-ops of the etcd servers: the slices one sync writes commit in one transaction while "+
			"they fit (the embedded etcd is started with it)")
	fs.StringVar(&c.GRPCAddress, "grpc-address", c.GRPCAddress, "host:port the gRPC API listens on")
	fs.StringVar(&c.AdvertiseAddress, "advertise-address", c.AdvertiseAddress,
		"host:port other replicas dial to reach this one (repair forwarding); empty: --grpc-address")
	fs.StringVar(&c.MetricsAddress, "metrics-address", c.MetricsAddress,
		"host:port serving Prometheus /metrics; empty: no metrics listener")
	fs.StringVar(&c.PprofAddress, "pprof-address", c.PprofAddress,
		"host:port serving Go's runtime profiles (/debug/pprof/, plain HTTP, no authentication: keep "+
			"it on loopback); empty: none")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout,
		"how long a graceful stop waits for calls in flight before it cuts them")
	fs.StringVar(&c.TLSCertFile, "tls-cert-file", c.TLSCertFile, "PEM certificate (with its chain) of the "+
		"gRPC API: with it the API is served over TLS only; re-read when it changes; with --client-ca-file "+
		"also the client certificate replicas present to each other (server and client auth)")
	fs.StringVar(&c.TLSPrivateKeyFile, "tls-private-key-file", c.TLSPrivateKeyFile,
		"PEM private key of --tls-cert-file, in the same directory; re-read when it changes")
	fs.StringVar(&c.ClientCAFile, "client-ca-file", c.ClientCAFile,
		"PEM CA bundle: client certificates are verified against it when given, and only callers with one "+
			"reach anything but health and reflection (all of the API, or what --authorization-policy-file "+
			"grants); replicas verify each other's server certificates with it; re-read when it changes")
	fs.StringVar(&c.AuthorizationPolicyFile, "authorization-policy-file", c.AuthorizationPolicyFile,
		"gRPC authorization policy (JSON, grpc-go authz) over client certificate identities; re-read when "+
			"it changes; needs --client-ca-file (see deploy/authz)")
	fs.BoolVar(&c.MetricsTLS, "metrics-tls", c.MetricsTLS,
		"serve /metrics over HTTPS with --tls-cert-file (no client certificate asked for)")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "log format: text or json")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel,
		"log level: debug, info, warn or error (debug logs every call)")
}

// Usage writes the grouped flag help of fs to w.
func Usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, `allocd - etcd-native ClusterIP/NodePort allocator and master-lease service over gRPC

Usage:
  allocd [flags]                  serve (embedded etcd in --data-dir unless --etcd-servers)
  allocd health [--server ADDR] [--tls-ca-file FILE]   exit 0 when ADDR answers grpc.health.v1 SERVING
  allocd --version                print the version and the Go and etcd client versions
`)
	for _, g := range flagGroups {
		fmt.Fprintf(w, "\n%s:\n", strings.ToUpper(g.title[:1])+g.title[1:])
		for _, n := range g.names {
			f := fs.Lookup(n)
			if f == nil {
				continue
			}
			def := f.DefValue
			if def == "" || def == "[]" {
				def = `""`
			}
			fmt.Fprintf(w, "  --%-30s %s (default %s)\n", f.Name, f.Usage, def)
		}
	}
}

// validateRanges checks the etcd prefix, the ranges and the kubernetes node port,
// with the allocator's own checks (sizes, families, host bits).
func (c *Config) validateRanges() []error {
	var errs []error
	ranges, rerr := c.clusterIPRanges()
	if rerr != nil {
		errs = append(errs, rerr)
	}
	ports, perr := allocator.ParsePortRange(c.ServiceNodePortRange)
	if perr != nil {
		errs = append(errs, badValue("--service-node-port-range",
			"--service-node-port-range %q: %w (want FIRST-LAST, like 30000-32767)",
			c.ServiceNodePortRange, perr))
	}
	if !strings.HasPrefix(c.EtcdPrefix, "/") || strings.HasSuffix(c.EtcdPrefix, "/") {
		errs = append(errs, badValue("--etcd-prefix",
			"--etcd-prefix %q: want a path like /allocd (leading slash, no trailing slash)", c.EtcdPrefix))
	} else if rerr == nil && perr == nil {
		if err := allocator.ValidateConfig(allocator.Config{Prefix: c.EtcdPrefix, ClusterIPRanges: ranges,
			NodePortRange: ports, KubernetesNodePort: c.KubernetesServiceNodePort}); err != nil {
			errs = append(errs,
				flagError(ErrFlagValue, []string{"--service-cluster-ip-range", "--service-node-port-range",
					"--kubernetes-service-node-port"}, "--service-cluster-ip-range %q, "+
					"--service-node-port-range %q, --kubernetes-service-node-port %d: %w",
					c.ServiceClusterIPRange, c.ServiceNodePortRange, c.KubernetesServiceNodePort, err))
		}
	}
	return errs
}

// Validate checks what can be checked without etcd and says what to fix.
func (c *Config) Validate() error {
	errs := c.validateRanges()
	if !strings.HasPrefix(c.MasterLeasePrefix, "/") || !strings.HasSuffix(c.MasterLeasePrefix, "/") {
		errs = append(errs, badValue("--master-lease-prefix",
			"--master-lease-prefix %q: want a path like /masterleases/ (leading "+
				"and trailing slash)", c.MasterLeasePrefix))
	}
	for _, a := range []struct{ flag, v string }{{"grpc-address", c.GRPCAddress},
		{"metrics-address", c.MetricsAddress},
		{"embedded-etcd-client-address", c.EmbeddedEtcdClientAddress},
		{"embedded-etcd-peer-address", c.EmbeddedEtcdPeerAddress},
		{"advertise-address", c.AdvertiseAddress}, {"pprof-address", c.PprofAddress}} {
		if a.v == "" && a.flag != "grpc-address" && !strings.HasPrefix(a.flag, "embedded-") {
			continue
		}
		if _, _, err := net.SplitHostPort(a.v); err != nil {
			errs = append(errs, badValue("--"+a.flag, "--%s %q: want host:port", a.flag, a.v))
		}
	}
	if c.MasterLeaseTTL < time.Second || c.MasterLeaseTTL > time.Hour {
		errs = append(errs,
			badValue("--master-lease-ttl", "--master-lease-ttl %s: want 1s to 1h", c.MasterLeaseTTL))
	}
	if c.KubernetesServicePort < 1 || c.KubernetesServicePort > 65535 {
		errs = append(errs, badValue("--kubernetes-service-port",
			"--kubernetes-service-port %d: want 1-65535", c.KubernetesServicePort))
	}
	if c.KubernetesServiceNodePort < 0 || c.KubernetesServiceNodePort > 65535 {
		errs = append(errs,
			badValue("--kubernetes-service-node-port", "--kubernetes-service-node-port %d: want 0-65535",
				c.KubernetesServiceNodePort))
	}
	if c.RepairInterval <= 0 {
		errs = append(errs, badValue("--repair-interval", "--repair-interval %s: want > 0", c.RepairInterval))
	}
	if c.EndpointReconcilerInterval <= 0 {
		errs = append(errs, badValue("--endpoint-reconciler-interval",
			"--endpoint-reconciler-interval %s: want > 0", c.EndpointReconcilerInterval))
	}
	errs = append(errs, c.validateEndpointControllers()...)
	if c.RepairLeakStrikes < 1 {
		errs = append(errs,
			badValue("--repair-leak-strikes", "--repair-leak-strikes %d: want >= 1", c.RepairLeakStrikes))
	}
	if c.RepairLeakGrace < 0 {
		errs = append(errs,
			badValue("--repair-leak-grace", "--repair-leak-grace %s: want >= 0", c.RepairLeakGrace))
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		errs = append(errs, badValue("--log-format", "--log-format %q: want text or json", c.LogFormat))
	}
	if _, err := c.logLevel(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.validateSecurity()...)
	errs = append(errs, c.validateEtcdSpace()...)
	errs = append(errs, c.validateEtcdTLS()...)
	return errors.Join(errs...)
}

// validateEtcdTLS checks the TLS flags of an external etcd.
func (c *Config) validateEtcdTLS() []error {
	var errs []error
	if (c.EtcdCertFile == "") != (c.EtcdKeyFile == "") {
		errs = append(errs, flagError(ErrFlagsTogether, []string{"--etcd-certfile", "--etcd-keyfile"},
			"--etcd-certfile and --etcd-keyfile go together"))
	}
	if tls := c.EtcdCAFile != "" || c.EtcdCertFile != ""; tls {
		// The etcd client would drop the credentials for http:// endpoints and talk in
		// plain text: say so rather than run without the TLS that was asked for.
		if len(c.EtcdServers) == 0 {
			errs = append(errs, flagError(ErrFlagNeeds,
				[]string{"--etcd-cafile", "--etcd-certfile", "--etcd-keyfile", "--etcd-servers"},
				"--etcd-cafile/--etcd-certfile/--etcd-keyfile need "+
					"--etcd-servers (the embedded etcd serves plain http on loopback)"))
		}
		for _, u := range c.EtcdServers {
			if !strings.HasPrefix(u, "https://") {
				errs = append(errs,
					flagError(ErrFlagConflict, []string{"--etcd-servers", "--etcd-cafile", "--etcd-certfile"},
						"--etcd-servers %s: use https:// with --etcd-cafile/--etcd-certfile", u))
			}
		}
	}
	return errs
}

// validateEndpointControllers checks the flags of the Endpoints and EndpointSlice
// controllers.
func (c *Config) validateEndpointControllers() []error {
	var errs []error
	if c.ConcurrentEndpointSyncs < 1 {
		errs = append(errs, badValue("--concurrent-endpoint-syncs",
			"--concurrent-endpoint-syncs %d: want >= 1", c.ConcurrentEndpointSyncs))
	}
	if _, _, err := c.controllers(); err != nil {
		errs = append(errs, err)
	}
	if c.ConcurrentServiceEndpointSyncs < 1 {
		errs = append(errs, badValue("--concurrent-service-endpoint-syncs",
			"--concurrent-service-endpoint-syncs %d: want >= 1", c.ConcurrentServiceEndpointSyncs))
	}
	if c.EndpointSliceUpdatesBatchPeriod < 0 {
		errs = append(errs, badValue("--endpointslice-updates-batch-period",
			"--endpointslice-updates-batch-period %v: want >= 0", c.EndpointSliceUpdatesBatchPeriod))
	}
	if c.MaxEndpointsPerSlice < 1 || c.MaxEndpointsPerSlice > 1000 {
		errs = append(errs, badValue("--max-endpoints-per-slice", "--max-endpoints-per-slice %d: want 1-1000",
			c.MaxEndpointsPerSlice))
	}
	if c.EtcdMaxTxnOps < 2 {
		errs = append(errs, badValue("--etcd-max-txn-ops",
			"--etcd-max-txn-ops %d: want >= 2 (etcd's default is 128)", c.EtcdMaxTxnOps))
	}
	if c.EndpointUpdatesBatchPeriod < 0 {
		errs = append(errs, badValue("--endpoint-updates-batch-period",
			"--endpoint-updates-batch-period %v: want >= 0", c.EndpointUpdatesBatchPeriod))
	}
	return errs
}

// clusterIPRanges parses --service-cluster-ip-range into masked prefixes.
func (c *Config) clusterIPRanges() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range strings.Split(c.ServiceClusterIPRange, ",") {
		s = strings.TrimSpace(s)
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, badValue("--service-cluster-ip-range",
				"--service-cluster-ip-range %q: %q is not a CIDR like 10.0.0.0/24",
				c.ServiceClusterIPRange, s)
		}
		out = append(out, p) // host bits are refused by allocator.ValidateConfig, not masked
	}
	if len(out) > 2 {
		return nil, badValue("--service-cluster-ip-range",
			"--service-cluster-ip-range %q: at most two CIDRs, one per family",
			c.ServiceClusterIPRange)
	}
	return out, nil
}

func (c *Config) logLevel() (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return 0, badValue("--log-level", "--log-level %q: want debug, info, warn or error", c.LogLevel)
	}
	return l, nil
}

// controllers reads --controllers: which of the endpoint controllers run, as
// kube-controller-manager reads it (IsControllerEnabled): "-name" turns one off
// whatever else is listed, "name" turns it on, '*' turns on both. An unknown name is an
// error (kube-controller-manager's other controllers are not allocd's).
func (c *Config) controllers() (endpoint, endpointslice bool, err error) {
	on, off, star := map[string]bool{}, map[string]bool{}, false
	for _, n := range strings.Split(c.Controllers, ",") {
		n = strings.TrimSpace(n)
		name, disable := strings.CutPrefix(n, "-")
		switch {
		case n == "":
		case n == "*":
			star = true
		case name == "endpoint" || name == "endpointslice":
			if disable {
				off[name] = true
			} else {
				on[name] = true
			}
		default:
			return false, false, badValue("--controllers",
				"--controllers %q: %q is not an endpoint controller (want "+
					"endpoint, endpointslice, '*', or -NAME)",
				c.Controllers, n)
		}
	}
	enabled := func(name string) bool { return !off[name] && (on[name] || star) }
	return enabled("endpoint"), enabled("endpointslice"), nil
}
