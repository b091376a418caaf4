package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/allocd/allocd/internal/etcd/call"
	"github.com/allocd/allocd/internal/etcd/embedded"
	"github.com/allocd/allocd/internal/etcd/watch"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
	"github.com/allocd/allocd/server"
)

// Daemon is a running allocd.
type Daemon struct {
	cfg      Config
	log      *slog.Logger
	logOut   *bufferedOutput // standard error's buffer, when the logs go there
	registry *prometheus.Registry
	alarms   *prometheus.GaugeVec     // etcd's alarms (space.go)
	etcdReqs *prometheus.HistogramVec // etcd request latency (etcdmetrics.go)

	etcd    *embed.Etcd // nil with --etcd-servers
	cli     *clientv3.Client
	etcdTLS *tls.Config // of cli; nil without TLS
	// restarts opens the watches anew when a member is left out (watchMembers).
	restarts *watch.Restarts
	grpc     *grpc.Server
	health   *health.Server
	lis      net.Listener
	mlis     net.Listener
	msrv     *http.Server
	plis     net.Listener // --pprof-address; nil without
	psrv     *http.Server
	sec      *security // TLS and authorization; closed last

	ready  atomic.Bool
	gates  gates
	phases []StartPhase // Start's steps, once it returned

	cancel      context.CancelFunc
	runCtx      context.Context    // ends when Close is called or a part fails
	stopStreams context.CancelFunc // ends the server streams (WatchEndpoints) at shutdown
	closers     []func() error     // run after the gRPC server stopped
	group       *errgroup.Group
	closeOnce   sync.Once
	closeErr    error
}

// gates stand in for the allocd services until their backing state is loaded: the gRPC
// server must know every service before it serves, and it serves health and
// reflection from the first moment. Calls before ready answer UNAVAILABLE.
type gates struct {
	alloc struct {
		allocdv1.AllocatorServiceServer
	}
	lease     struct{ allocdv1.LeaseServiceServer }
	repair    struct{ allocdv1.RepairServiceServer }
	endpoints struct {
		allocdv1.EndpointsServiceServer
	}
}

// StartPhase is one step of Start and how long it took.
type StartPhase struct {
	// Name is the step: etcd (the embedded member's start, or the first read of an
	// external etcd), space (compaction and defragmentation set up), services (the
	// allocator's index, the master leases and the controllers loaded).
	Name string
	Took time.Duration
}

// StartPhases returns how long Start's steps took (the "allocd serving" line logs
// them too): a restart's time, split into etcd's and allocd's own.
func (d *Daemon) StartPhases() []StartPhase { return slices.Clone(d.phases) }

// phase records the step name as ending now, begun at the end of the last one.
func (d *Daemon) phase(name string, began time.Time) {
	from := began
	for _, p := range d.phases {
		from = from.Add(p.Took)
	}
	d.phases = append(d.phases, StartPhase{Name: name, Took: time.Since(from)})
}

// Start starts allocd and returns once it serves (health SERVING), or with an error that
// says what to fix. Close stops it.
func Start(ctx context.Context, cfg Config) (_ *Daemon, err error) {
	began := time.Now()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, restarts: watch.NewRestarts()}
	d.log = d.newLogger()
	defer func() {
		if err != nil && d.logOut != nil {
			d.logOut.close() // the lines that say why, before the caller exits
		}
	}()
	d.registry = prometheus.NewRegistry()
	d.registry.MustRegister(collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	d.etcdReqs = newEtcdRequestMetrics(d.registry)

	if d.sec, err = newSecurity(cfg, d.log); err != nil {
		return nil, err
	}
	if err := d.listen(); err != nil {
		d.sec.close()
		return nil, err
	}
	// Authorization before the gates: a caller the policy refuses learns nothing of
	// allocd's state, not even that it is starting.
	d.grpc, d.health = server.NewGRPCServer(server.Options{
		Logger:     d.log,
		Registerer: d.registry,
		ServerOptions: append(d.sec.serverOptions(),
			grpc.ChainUnaryInterceptor(d.gateUnary), grpc.ChainStreamInterceptor(d.gateStream)),
	})
	d.registerGates()

	runCtx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	d.group, runCtx = errgroup.WithContext(runCtx)
	d.runCtx = runCtx
	d.group.Go(func() error {
		if err := d.grpc.Serve(d.lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("grpc: %w", err)
		}
		return nil
	})
	if d.mlis != nil {
		d.serveMetrics()
	}
	if d.plis != nil {
		d.servePprof()
	}
	d.log.Info("allocd starting", "grpc", d.lis.Addr().String(), "metrics", cfg.MetricsAddress,
		"etcd", d.etcdDescription(), "tls", d.sec.server != nil, "authorization", d.sec.authorizing())

	d.phase("listen", began)
	if err := d.startEtcd(ctx); err != nil {
		d.Close()
		return nil, err
	}
	d.phase("etcd", began)
	if err := d.startSpace(ctx, runCtx); err != nil {
		d.Close()
		return nil, err
	}
	if err := d.watchMembers(runCtx); err != nil {
		d.Close()
		return nil, err
	}
	d.phase("space", began)
	if err := d.startServices(ctx, watch.WithRestarts(runCtx, d.restarts)); err != nil {
		d.Close()
		return nil, outOfSpaceHint(err)
	}
	d.phase("services", began)
	d.serve(runCtx, began)
	return d, nil
}

// serve turns health SERVING, watches etcd's health from then on, and logs the start's
// steps (begun at began).
func (d *Daemon) serve(runCtx context.Context, began time.Time) {
	d.ready.Store(true)
	d.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	d.group.Go(func() error { d.watchEtcdHealth(runCtx); return nil })
	took := []any{"total", time.Since(began).Round(time.Millisecond)}
	for _, p := range d.phases {
		took = append(took, p.Name, p.Took.Round(time.Millisecond))
	}
	d.log.Info("allocd serving", "grpc", d.lis.Addr().String(), slog.Group("start", took...))
}

// newLogger is the daemon's logger: to cfg.LogOutput, or through a buffer to standard
// error (bufferedOutput).
func (d *Daemon) newLogger() *slog.Logger {
	out := d.cfg.LogOutput
	if out == nil {
		d.logOut = newBufferedOutput(os.Stderr)
		out = d.logOut
	}
	return newLogger(d.cfg, out)
}

// registerGates registers the allocd services on d.grpc through d.gates, unimplemented
// until their state is loaded.
func (d *Daemon) registerGates() {
	d.gates.alloc.AllocatorServiceServer = allocdv1.UnimplementedAllocatorServiceServer{}
	d.gates.lease.LeaseServiceServer = allocdv1.UnimplementedLeaseServiceServer{}
	d.gates.repair.RepairServiceServer = allocdv1.UnimplementedRepairServiceServer{}
	d.gates.endpoints.EndpointsServiceServer = allocdv1.UnimplementedEndpointsServiceServer{}
	allocdv1.RegisterAllocatorServiceServer(d.grpc, &d.gates.alloc)
	allocdv1.RegisterLeaseServiceServer(d.grpc, &d.gates.lease)
	allocdv1.RegisterRepairServiceServer(d.grpc, &d.gates.repair)
	allocdv1.RegisterEndpointsServiceServer(d.grpc, &d.gates.endpoints)
}

// listen opens the listeners of the gRPC API, /metrics and pprof.
func (d *Daemon) listen() error {
	var err error
	if d.lis, err = net.Listen("tcp", d.cfg.GRPCAddress); err != nil {
		return fmt.Errorf("--grpc-address %s: %w", d.cfg.GRPCAddress, err)
	}
	if d.cfg.MetricsAddress != "" {
		if d.mlis, err = net.Listen("tcp", d.cfg.MetricsAddress); err != nil {
			d.lis.Close()
			return fmt.Errorf("--metrics-address %s: %w", d.cfg.MetricsAddress, err)
		}
	}
	if d.cfg.PprofAddress != "" {
		if d.plis, err = net.Listen("tcp", d.cfg.PprofAddress); err != nil {
			d.lis.Close()
			if d.mlis != nil {
				d.mlis.Close()
			}
			return fmt.Errorf("--pprof-address %s: %w", d.cfg.PprofAddress, err)
		}
	}
	return nil
}

// servePprof serves Go's runtime profiles (net/http/pprof's /debug/pprof/) on d.plis:
// plain HTTP without authentication, for the study of allocd's CPU and memory on a
// loopback address (tools/epbench -profile-dir).
func (d *Daemon) servePprof() {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	addr := d.plis.Addr().String()
	if ap, err := netip.ParseAddrPort(addr); err == nil && !ap.Addr().IsLoopback() {
		d.log.Warn("pprof serves profiles and the command line without authentication on a "+
			"non-loopback address", "pprof", addr)
	} else {
		d.log.Info("pprof serving", "pprof", addr)
	}
	d.psrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelDebug)}
	d.group.Go(func() error {
		if err := d.psrv.Serve(d.plis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("pprof: %w", err)
		}
		return nil
	})
}

// serveMetrics serves /metrics on d.mlis, over HTTPS with --metrics-tls (the gRPC API's
// certificate, re-read the same way; no client certificate asked for).
func (d *Daemon) serveMetrics() {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(d.registry, promhttp.HandlerOpts{Registry: d.registry}))
	d.msrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		// The TLS handshake errors of scrapers, say.
		ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelDebug)}
	if d.cfg.MetricsTLS {
		d.msrv.TLSConfig = d.sec.server.Config()
		d.msrv.TLSConfig.GetConfigForClient = nil
	}
	d.group.Go(func() error {
		var err error
		if d.cfg.MetricsTLS {
			err = d.msrv.ServeTLS(d.mlis, "", "")
		} else {
			err = d.msrv.Serve(d.mlis)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("metrics: %w", err)
		}
		return nil
	})
}

func (d *Daemon) etcdDescription() string {
	if len(d.cfg.EtcdServers) > 0 {
		return strings.Join(d.cfg.EtcdServers, ",")
	}
	return "embedded in " + d.cfg.DataDir + " at http://" + d.cfg.EmbeddedEtcdClientAddress
}

// embeddedTickMs is the raft tick of the embedded etcd (see startEtcd).
const embeddedTickMs = 10

// startEtcd starts the embedded member (when no --etcd-servers) and connects to etcd.
func (d *Daemon) startEtcd(ctx context.Context) error {
	endpoints := d.cfg.EtcdServers
	var tlsCfg *tls.Config
	if len(endpoints) == 0 {
		// The embedded etcd is a cluster of one: after a restart it elects itself
		// once the rest of a randomized election timeout has passed, up to 1.1 s with
		// etcd's 100 ms ticks (it skips all but one tick of the first 10). With 10 ms
		// ticks that is at most 110 ms of the restart; it has no peer to lose a
		// heartbeat to.
		tick, election := d.cfg.embeddedEtcdTickMs, d.cfg.embeddedEtcdElectionMs
		if tick == 0 {
			tick, election = embeddedTickMs, 10*embeddedTickMs
		}
		e, err := embedded.Start(ctx, embedded.Config{
			Dir:               d.cfg.DataDir,
			ClientURL:         "http://" + d.cfg.EmbeddedEtcdClientAddress,
			PeerURL:           "http://" + d.cfg.EmbeddedEtcdPeerAddress,
			UnsafeNoFsync:     d.cfg.embeddedEtcdUnsafeNoFsync,
			TickMs:            tick,
			ElectionMs:        election,
			QuotaBackendBytes: d.cfg.QuotaBackendBytes,
			MaxTxnOps:         uint(d.cfg.EtcdMaxTxnOps),
		})
		if err != nil {
			return fmt.Errorf(
				"%w (check --data-dir and --embedded-etcd-client-address/--embedded-etcd-peer-address)", err)
		}
		d.etcd = e
		endpoints = []string{"http://" + d.cfg.EmbeddedEtcdClientAddress}
	} else if d.cfg.EtcdCAFile != "" || d.cfg.EtcdCertFile != "" {
		info := transport.TLSInfo{CertFile: d.cfg.EtcdCertFile, KeyFile: d.cfg.EtcdKeyFile,
			TrustedCAFile: d.cfg.EtcdCAFile}
		var err error
		if tlsCfg, err = info.ClientConfig(); err != nil {
			return fmt.Errorf("etcd TLS (--etcd-cafile/--etcd-certfile/--etcd-keyfile): %w", err)
		}
	}
	cli, err := clientv3.New(d.etcdConfig(endpoints, tlsCfg))
	if err != nil {
		return fmt.Errorf("etcd client for %s: %w", strings.Join(endpoints, ","), err)
	}
	d.cli = cli
	d.etcdTLS = tlsCfg
	// Wait for etcd to answer a linearizable read, retrying while the caller waits.
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := cli.Get(rctx, d.cfg.EtcdPrefix+"/health", clientv3.WithCountOnly())
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("etcd %s does not answer: %w", strings.Join(endpoints, ","), err)
		}
		d.log.Warn("waiting for etcd", "endpoints", endpoints, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// etcdConfig is the configuration of allocd's etcd client over endpoints.
func (d *Daemon) etcdConfig(endpoints []string, tlsCfg *tls.Config) clientv3.Config {
	return clientv3.Config{
		Endpoints:            endpoints,
		TLS:                  tlsCfg,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		Logger:               zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(etcdRequestMetrics(d.etcdReqs),
			slowEtcdCalls(d.log), call.NotSentInterceptor()), grpc.WithDisableRetry()},
		MaxCallSendMsgSize: 8 << 20,
		MaxCallRecvMsgSize: 64 << 20,
	}
}

// watchMembers keeps the etcd client's endpoints to the members that answer
// (call.Members), when --etcd-servers lists more than one.
func (d *Daemon) watchMembers(ctx context.Context) error {
	if len(d.cfg.EtcdServers) < 2 {
		return nil
	}
	m, err := call.NewMembers(d.cli, d.cfg.EtcdServers, d.cfg.EtcdPrefix+"/health", d.log,
		func(ep string) (*clientv3.Client, error) {
			return clientv3.New(d.etcdConfig([]string{ep}, d.etcdTLS))
		})
	if err != nil {
		return fmt.Errorf("etcd member probes: %w", err)
	}
	m.OnLeftOut = d.restarts.Fire
	d.closers = append(d.closers, func() error { m.Close(); return nil })
	d.group.Go(func() error { m.Run(ctx); return nil })
	return nil
}

// watchEtcdHealth keeps the health status in step with etcd: NOT_SERVING while etcd does
// not answer a linearizable read, or while its NOSPACE alarm is raised (it refuses every
// write; allocd still answers reads, and writes with RESOURCE_EXHAUSTED), SERVING again
// when neither holds.
func (d *Daemon) watchEtcdHealth(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	state := etcdServing
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next, err := d.checkEtcd(ctx)
		if ctx.Err() != nil {
			return
		}
		if next != state && next != etcdUnknown {
			d.etcdStateChanged(state, next, err)
			state = next
		}
	}
}

// gateUnary answers UNAVAILABLE for allocd calls that arrive before the state is loaded.
func (d *Daemon) gateUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo,
	h grpc.UnaryHandler) (any, error) {
	if !d.ready.Load() && isAllocdMethod(info.FullMethod) {
		return nil, notReady()
	}
	return h(ctx, req)
}

func (d *Daemon) gateStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo,
	h grpc.StreamHandler) error {
	if !d.ready.Load() && isAllocdMethod(info.FullMethod) {
		return notReady()
	}
	return h(srv, ss)
}

func isAllocdMethod(m string) bool { return strings.HasPrefix(m, "/allocd.") }

func notReady() error {
	return server.Status(fmt.Errorf("allocd is starting: state not loaded yet: %w", server.ErrNotReady))
}

// GRPCAddr is the address the gRPC server listens on.
func (d *Daemon) GRPCAddr() string { return d.lis.Addr().String() }

// MetricsAddr is the address of the metrics listener ("" when none).
func (d *Daemon) MetricsAddr() string {
	if d.mlis == nil {
		return ""
	}
	return d.mlis.Addr().String()
}

// Client is the daemon's etcd client (for tests that look inside etcd).
func (d *Daemon) Client() *clientv3.Client { return d.cli }

// Wait blocks until a part of the daemon fails (and returns its error) or Close is
// called (and returns nil). The caller then calls Close.
func (d *Daemon) Wait() error {
	<-d.runCtx.Done()
	if err := context.Cause(d.runCtx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// Close stops allocd gracefully: health NOT_SERVING, GracefulStop bounded by
// --shutdown-timeout (then Stop), the services stopped, etcd closed. It is safe to call
// more than once.
func (d *Daemon) Close() error {
	d.closeOnce.Do(func() {
		d.log.Info("allocd stopping")
		if d.health != nil {
			d.health.Shutdown()
		}
		if d.stopStreams != nil {
			d.stopStreams()
		}
		if d.grpc != nil {
			stopped := make(chan struct{})
			go func() { d.grpc.GracefulStop(); close(stopped) }()
			t := time.NewTimer(d.cfg.ShutdownTimeout)
			select {
			case <-stopped:
			case <-t.C:
				d.log.Warn("graceful stop timed out; cutting calls in flight",
					"timeout", d.cfg.ShutdownTimeout)
				d.grpc.Stop()
				<-stopped
			}
			t.Stop()
		}
		for _, srv := range []*http.Server{d.msrv, d.psrv} {
			if srv != nil {
				ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				srv.Shutdown(ctx)
				cancel()
			}
		}
		for _, c := range d.closers {
			c()
		}
		if d.cancel != nil {
			d.cancel()
		}
		if d.group != nil {
			// The loops end with their context, within a second when etcd answers. One
			// stuck on an unreachable etcd is cut loose by closing the etcd client
			// under it; after that Close gives up waiting, so that the whole of Close
			// stays within --shutdown-timeout + 3 s (SIGTERM exits within 10 s).
			waited := make(chan error, 1)
			go func() { waited <- d.group.Wait() }()
			var err error
			select {
			case err = <-waited:
			case <-time.After(time.Second):
				d.log.Warn("background loops still running; closing the etcd client under them")
				if d.cli != nil {
					d.cli.Close()
				}
				select {
				case err = <-waited:
				case <-time.After(time.Second):
					d.log.Error("background loops did not stop; exiting anyway")
				}
			}
			if err != nil && !errors.Is(err, context.Canceled) {
				d.closeErr = err
			}
		}
		if d.cli != nil {
			d.cli.Close()
		}
		if d.etcd != nil {
			d.etcd.Close()
		}
		if d.sec != nil {
			d.sec.close()
		}
		d.log.Info("allocd stopped")
		if d.logOut != nil {
			d.logOut.close()
		}
	})
	return d.closeErr
}

func newLogger(c Config, out io.Writer) *slog.Logger {
	lvl, _ := c.logLevel()
	opts := &slog.HandlerOptions{Level: lvl}
	newHandler := func(w io.Writer) slog.Handler {
		if c.LogFormat == "json" {
			return slog.NewJSONHandler(w, opts)
		}
		return slog.NewTextHandler(w, opts)
	}
	if b, ok := out.(*bufferedOutput); ok {
		return slog.New(newUrgentHandler(b, newHandler)) // warnings and errors at once
	}
	return slog.New(newHandler(out))
}

// slowEtcdCall is how long an etcd call may take before it is logged (at debug: the
// member that held it, for the study of member faults).
const slowEtcdCall = 500 * time.Millisecond

// slowEtcdCalls logs unary etcd calls that took longer than slowEtcdCall, with the
// member's address.
func slowEtcdCalls(log *slog.Logger) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		var p peer.Peer
		start := time.Now()
		err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Peer(&p))...)
		if d := time.Since(start); d > slowEtcdCall && log.Enabled(ctx, slog.LevelDebug) {
			addr := ""
			if p.Addr != nil {
				addr = p.Addr.String()
			}
			log.Debug("slow etcd call", "method", method, "member", addr, "took", d.Round(time.Millisecond),
				"err", err)
		}
		return err
	}
}
