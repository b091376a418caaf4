package daemon

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func healthStatus(t *testing.T, conn *grpc.ClientConn) (healthpb.HealthCheckResponse_ServingStatus, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return resp.GetStatus(), err
}

// listServices asks server reflection (v1) which services the server has.
func listServices(t *testing.T, conn *grpc.ClientConn) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := rpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatalf("reflection: %v", err)
	}
	if err := st.Send(&rpb.ServerReflectionRequest{
		MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatalf("reflection send: %v", err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatalf("reflection recv: %v", err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	return names
}

func TestServesHealthReflectionMetrics(t *testing.T) {
	d := StartForTest(t)
	conn := dial(t, d.GRPCAddr())
	if got, err := healthStatus(t, conn); err != nil || got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Health.Check = %v, %v; want SERVING", got, err)
	}
	names := listServices(t, conn)
	for _, want := range []string{"allocd.v1.AllocatorService", "allocd.v1.LeaseService",
		"allocd.v1.RepairService",
		"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
		"grpc.reflection.v1alpha.ServerReflection"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection services = %v; want %s among them", names, want)
		}
	}
	resp, err := http.Get("http://" + d.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"grpc_server_handled_total", "grpc_server_handling_seconds",
		"go_goroutines", "process_cpu_seconds_total"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
}

// TestServesPprof: with --pprof-address allocd serves Go's profiles there, and only
// there (not on the metrics listener).
func TestServesPprof(t *testing.T) {
	addr := freeAddr(t)
	d := StartForTest(t, func(c *Config) { c.PprofAddress = addr })
	for _, tc := range []struct {
		url  string
		want int
	}{
		{"http://" + addr + "/debug/pprof/heap?debug=1", http.StatusOK},
		{"http://" + addr + "/debug/pprof/profile?seconds=1", http.StatusOK},
		{"http://" + d.MetricsAddr() + "/debug/pprof/heap?debug=1", http.StatusNotFound},
	} {
		resp, err := http.Get(tc.url)
		if err != nil {
			t.Fatalf("GET %s: %v", tc.url, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want || tc.want == http.StatusOK && len(body) == 0 {
			t.Errorf("GET %s = %s, %d bytes; want %d with a body", tc.url, resp.Status, len(body), tc.want)
		}
	}
}

func TestCloseThenRestartOnSameDataDir(t *testing.T) {
	dir := t.TempDir()
	cfg := TestConfig(dir, func() string { return freeAddr(t) })
	cfg.embeddedEtcdUnsafeNoFsync = false
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if _, err := d.Client().Put(ctx, cfg.EtcdPrefix+"/test/marker", "kept"); err != nil {
		t.Fatalf("Put: %v", err)
	}
	conn := dial(t, d.GRPCAddr())
	start := time.Now()
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Close took %s; want < 10s", took)
	}
	if _, err := healthStatus(t, conn); status.Code(err) != codes.Unavailable {
		t.Errorf("Health.Check after Close: err = %v; want UNAVAILABLE", err)
	}

	d2, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("restart on the same data dir: %v", err)
	}
	defer d2.Close()
	if got, err := healthStatus(t, dial(t, d2.GRPCAddr())); err != nil ||
		got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Health.Check after restart = %v, %v; want SERVING", got, err)
	}
	r, err := d2.Client().Get(ctx, cfg.EtcdPrefix+"/test/marker")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "kept" {
		t.Fatalf("marker after restart = %v, %v; want kept", r, err)
	}
}

func TestTwoSideBySide(t *testing.T) {
	a := StartForTest(t)
	b := StartForTest(t)
	for _, d := range []*Daemon{a, b} {
		if got, err := healthStatus(t, dial(t, d.GRPCAddr())); err != nil ||
			got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Health.Check(%s) = %v, %v; want SERVING", d.GRPCAddr(), got, err)
		}
	}
}

func TestHealthFollowsEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the health check to see etcd gone, and a bounded shutdown: seconds")
	}
	// allocd against an external etcd (another daemon's embedded one), which we stop.
	etcdHost := StartForTest(t)
	d := StartForTest(t, func(c *Config) {
		c.EtcdServers = []string{"http://" + etcdHost.cfg.EmbeddedEtcdClientAddress}
	})
	conn := dial(t, d.GRPCAddr())
	etcdHost.Close()
	etcdtest.WaitFor(t, 15*time.Second, "NOT_SERVING once etcd is gone", func() bool {
		s, err := healthStatus(t, conn)
		return err == nil && s == healthpb.HealthCheckResponse_NOT_SERVING
	})
	// Shutdown stays bounded while etcd is unreachable, even with a call in flight
	// that has no deadline of its own.
	go allocdv1.NewLeaseServiceClient(conn).ListLeases(context.Background(), &allocdv1.ListLeasesRequest{})
	etcdtest.WaitFor(t, 10*time.Second, "ListLeases in flight", func() bool {
		return counterSum(t, d, "grpc_server_started_total", "grpc_method", "ListLeases") == 1
	})
	start := time.Now()
	d.Close()
	took := time.Since(start)
	if took > 10*time.Second {
		t.Errorf("Close with etcd unreachable took %s; want < 10s", took)
	}
	t.Logf("Close with etcd unreachable and a call in flight took %s", took.Round(time.Millisecond))
}

func TestBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		flag   string // refused
		why    error  // the refusal's Kind (or cause)
	}{
		{"cidr", func(c *Config) { c.ServiceClusterIPRange = "10.0.0.0" }, "--service-cluster-ip-range",
			ErrFlagValue},
		{"ports", func(c *Config) { c.ServiceNodePortRange = "32767-30000" }, "--service-node-port-range",
			ErrFlagValue},
		{"format", func(c *Config) { c.LogFormat = "xml" }, "--log-format", ErrFlagValue},
		{"level", func(c *Config) { c.LogLevel = "loud" }, "--log-level", ErrFlagValue},
		{"addr", func(c *Config) { c.GRPCAddress = "8080" }, "--grpc-address", ErrFlagValue},
		{"pprof addr", func(c *Config) { c.PprofAddress = "6060" }, "--pprof-address", ErrFlagValue},
		{"ttl", func(c *Config) { c.MasterLeaseTTL = 2 * time.Hour }, "--master-lease-ttl", ErrFlagValue},
		{"tls", func(c *Config) { c.EtcdCertFile = "x.pem" }, "--etcd-keyfile", ErrFlagsTogether},
		{"tls embedded", func(c *Config) { c.EtcdCAFile = "ca.pem" }, "--etcd-servers", ErrFlagNeeds},
		{"tls http", func(c *Config) {
			c.EtcdCAFile, c.EtcdServers = "ca.pem", []string{"http://etcd:2379"}
		}, "--etcd-servers", ErrFlagConflict},
		{"compaction", func(c *Config) { c.EtcdCompactionInterval = -time.Second },
			"--etcd-compaction-interval", ErrFlagValue},
		{"quota", func(c *Config) { c.QuotaBackendBytes = -1 }, "--quota-backend-bytes", ErrFlagValue},
		{"quota external",
			func(c *Config) { c.QuotaBackendBytes = 8 << 30; c.EtcdServers = []string{"http://etcd:2379"} },
			"--quota-backend-bytes", ErrFlagConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mutate(&c)
			if err := c.Validate(); !refuses(err, tc.flag, tc.why) {
				t.Errorf("Validate() = %v; want a *FlagError of %s for %v", err, tc.flag, tc.why)
			}
		})
	}
	if err := (func() *Config { c := DefaultConfig(); return &c })().Validate(); err != nil {
		t.Errorf("DefaultConfig().Validate() = %v; want nil", err)
	}
}

// refuses reports whether err (an errors.Join of them, say) holds a *FlagError about
// flag that errors.Is why.
func refuses(err error, flag string, why error) bool {
	var walk func(error) bool
	walk = func(err error) bool {
		switch e := err.(type) {
		case *FlagError:
			return slices.Contains(e.Flags, flag) && errors.Is(e, why)
		case interface{ Unwrap() []error }:
			return slices.ContainsFunc(e.Unwrap(), walk)
		case interface{ Unwrap() error }:
			return walk(e.Unwrap())
		}
		return false
	}
	return walk(err)
}

// TestNotServingUntilEtcdAnswers starts allocd against an etcd that is not there yet:
// health says NOT_SERVING and the allocd services answer UNAVAILABLE (never a fake
// answer) until etcd comes up, then SERVING.
func TestNotServingUntilEtcdAnswers(t *testing.T) {
	etcdCfg := TestConfig(t.TempDir(), func() string { return freeAddr(t) })
	cfg := TestConfig(t.TempDir(), func() string { return freeAddr(t) })
	cfg.EtcdServers = []string{"http://" + etcdCfg.EmbeddedEtcdClientAddress}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	started := make(chan *Daemon, 1)
	go func() {
		d, err := Start(ctx, cfg)
		if err != nil {
			t.Errorf("Start: %v", err)
		}
		started <- d
	}()
	conn := dial(t, cfg.GRPCAddress)
	etcdtest.WaitFor(t, 10*time.Second, "NOT_SERVING while etcd is absent", func() bool {
		s, err := healthStatus(t, conn)
		return err == nil && s == healthpb.HealthCheckResponse_NOT_SERVING
	})
	_, err := allocdv1.NewAllocatorServiceClient(conn).ListRanges(ctx, &allocdv1.ListRangesRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("ListRanges before etcd answers = %v; want UNAVAILABLE", err)
	}

	etcdHost, err := Start(ctx, etcdCfg)
	if err != nil {
		t.Fatalf("start the etcd host: %v", err)
	}
	defer etcdHost.Close()
	d := <-started
	if d == nil {
		t.Fatal("allocd did not start once etcd answered")
	}
	defer d.Close()
	if s, err := healthStatus(t, conn); err != nil || s != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("Health.Check once started = %v, %v; want SERVING", s, err)
	}
	if _, err := allocdv1.NewAllocatorServiceClient(conn).ListRanges(ctx,
		&allocdv1.ListRangesRequest{}); err != nil {
		t.Errorf("ListRanges once started = %v", err)
	}
}

// TestWaitReturnsWhenAPartFails: a part that fails (here the metrics listener) ends
// Wait with its error, so that cmd/allocd stops and exits non-zero instead of serving
// on without it.
func TestWaitReturnsWhenAPartFails(t *testing.T) {
	d := StartForTest(t)
	waited := make(chan error, 1)
	go func() { waited <- d.Wait() }()
	d.mlis.Close()
	select {
	case err := <-waited:
		if err == nil {
			t.Errorf("Wait() = nil after the metrics listener failed; want its error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait() did not return after the metrics listener failed")
	}
}
