package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/allocd/allocd/bridge/adopt"
	"github.com/allocd/allocd/client"
)

// options are the flags, named as kube-controller-manager names the same things.
type options struct {
	kubeconfig, master string
	qps                float32
	burst              int
	contentType        string
	connPerClient      bool

	allocd                          string
	allocdCA, allocdCert, allocdKey string

	endpointSyncs int
	sliceSyncs    int
	serviceSyncs  int
	adopt         bool
	pendingGrace  time.Duration
	pendingSweep  time.Duration
	kubernetesSvc bool
	healthAddress string
	profiling     bool
	resync        time.Duration
	logLevel      string
}

func defaultOptions() *options {
	return &options{qps: 200, burst: 400, contentType: "application/vnd.kubernetes.protobuf", connPerClient: true,
		allocd: "127.0.0.1:8080", endpointSyncs: 5, sliceSyncs: 5, serviceSyncs: 5,
		adopt: true, pendingGrace: adopt.DefaultPendingGrace, pendingSweep: adopt.DefaultPendingSweepInterval,
		healthAddress: "127.0.0.1:10260", logLevel: "info"}
}

func (o *options) addConnectionFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", o.kubeconfig, "path to a kubeconfig; empty: the in-cluster config")
	fs.StringVar(&o.master, "master", o.master, "address of the API server (overrides the kubeconfig's)")
	fs.Float32Var(&o.qps, "kube-api-qps", o.qps,
		"queries per second to the API server, of each client (the informers', the Endpoints writer's, the EndpointSlice writer's)")
	fs.IntVar(&o.burst, "kube-api-burst", o.burst, "burst of queries to the API server, of each client")
	fs.StringVar(&o.contentType, "kube-api-content-type", o.contentType,
		"content type of requests to the API server (kube-controller-manager's flag and default)")
	fs.BoolVar(&o.connPerClient, "kube-api-connection-per-client", o.connPerClient,
		"give the informers and each writer a connection to the API server of its own (false: one HTTP/2 "+
			"connection carries the watches and every write, their frames in one queue on each side)")
	fs.StringVar(&o.allocd, "allocd-address", o.allocd, "allocd: a gRPC target (host:port, dns:///name:port) or replicas host:port,host:port")
	fs.StringVar(&o.allocdCA, "allocd-ca-file", o.allocdCA, "PEM CA bundle to verify allocd's certificate; with it allocd is reached over TLS")
	fs.StringVar(&o.allocdCert, "allocd-cert-file", o.allocdCert, "PEM client certificate presented to allocd")
	fs.StringVar(&o.allocdKey, "allocd-key-file", o.allocdKey, "PEM private key of --allocd-cert-file")
	fs.StringVar(&o.logLevel, "log-level", o.logLevel, "log level: debug, info, warn or error")
}

func (o *options) addRunFlags(fs *pflag.FlagSet) {
	fs.IntVar(&o.endpointSyncs, "concurrent-endpoint-syncs", o.endpointSyncs,
		"Endpoints written into the cluster at once (kube-controller-manager's flag)")
	fs.IntVar(&o.sliceSyncs, "concurrent-service-endpoint-syncs", o.sliceSyncs,
		"EndpointSlices written into the cluster at once (kube-controller-manager's flag); 0: write none (allocd's EndpointSlice controller off)")
	fs.IntVar(&o.serviceSyncs, "concurrent-service-syncs", o.serviceSyncs,
		"Services whose allocations are adopted into allocd at once")
	fs.BoolVar(&o.adopt, "adopt", o.adopt, "allocate in allocd the ClusterIPs and NodePorts the cluster's Services hold")
	fs.DurationVar(&o.pendingGrace, "pending-grace", o.pendingGrace,
		"age past which an allocation of the admission webhook that no stored Service holds is "+
			"freed; longer than kube-apiserver can take from admission to storing a Service (34 s, "+
			"a constant of kube-apiserver, plus a late etcd commit and the clocks' skew); below 34 s "+
			"it is taken with a warning")
	fs.DurationVar(&o.pendingSweep, "pending-sweep-interval", o.pendingSweep,
		"time between sweeps of the admission webhook's allocations (with --adopt)")
	fs.BoolVar(&o.kubernetesSvc, "manage-kubernetes-service", o.kubernetesSvc,
		"write default/kubernetes' Endpoints from allocd's master leases (kube-apiserver runs with --endpoint-reconciler-type=none)")
	fs.StringVar(&o.healthAddress, "health-address", o.healthAddress, "host:port serving /healthz, /readyz and /metrics; empty: none")
	fs.BoolVar(&o.profiling, "profiling", o.profiling,
		"serve Go's profiles under /debug/pprof/ on --health-address (kube-controller-manager's flag)")
	fs.DurationVar(&o.resync, "resync-period", o.resync, "informers' resync period; 0: none")
}

func (o *options) logger() *slog.Logger {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(o.logLevel)); err != nil {
		lvl = slog.LevelInfo
	}
	// Times to the microsecond, as klog writes them: the debug lines time each step of
	// a change through the bridge.
	micro := func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey && a.Value.Kind() == slog.KindTime {
			a.Value = slog.StringValue(a.Value.Time().Format("2006-01-02T15:04:05.000000Z07:00"))
		}
		return a
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl, ReplaceAttr: micro}))
}

// kubeClient is a client of the API server named name (its user agent is
// allocd-bridge/name), with a rate limit of its own: as kube-controller-manager gives
// each controller its own client, the informers and each writer have theirs, so that
// one's requests never wait for another's.
func (o *options) kubeClient(name string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if o.kubeconfig == "" && o.master == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags(o.master, o.kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = o.qps, o.burst
	cfg.UserAgent = "allocd-bridge/" + name
	// Protobuf by default, as kube-controller-manager: JSON costs the API server several
	// times the CPU to decode each write and encode each watch event.
	cfg.ContentType = o.contentType
	if o.contentType != "application/json" {
		cfg.AcceptContentTypes = o.contentType + ",application/json"
	}
	// Every write of an Endpoints draws the API server's deprecation warning; as
	// kube-controller-manager's endpoint controller, the bridge writes them anyway.
	cfg.WarningHandler = rest.NoWarnings{}
	if o.connPerClient {
		// A dialer of its own makes client-go build this client a transport of its own
		// (it shares one between configs that differ in nothing it compares).
		cfg.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	return kubernetes.NewForConfig(cfg)
}

// allocdClient connects to --allocd-address: one gRPC target, or a comma-separated list
// of host:port replicas (the connection moves to another when the one it uses fails).
func (o *options) allocdClient() (*client.Client, error) {
	target, opts := o.allocd, []client.Option(nil)
	if strings.Contains(o.allocd, ",") {
		r := manual.NewBuilderWithScheme("allocd-replicas")
		var addrs []resolver.Address
		for _, a := range strings.Split(o.allocd, ",") {
			addrs = append(addrs, resolver.Address{Addr: strings.TrimSpace(a)})
		}
		r.InitialState(resolver.State{Addresses: addrs})
		target = r.Scheme() + ":///replicas"
		opts = append(opts, client.WithDialOptions(grpc.WithResolvers(r)))
	}
	if o.allocdCA == "" {
		if o.allocdCert != "" || o.allocdKey != "" {
			return nil, errors.New("--allocd-cert-file and --allocd-key-file need --allocd-ca-file")
		}
		return client.New(target, opts...)
	}
	pem, err := os.ReadFile(o.allocdCA)
	if err != nil {
		return nil, fmt.Errorf("--allocd-ca-file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--allocd-ca-file %s: no PEM certificate", o.allocdCA)
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if o.allocdCert != "" {
		cert, err := tls.LoadX509KeyPair(o.allocdCert, o.allocdKey)
		if err != nil {
			return nil, fmt.Errorf("--allocd-cert-file: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return client.New(target, append(opts, client.WithTLS(cfg))...)
}
