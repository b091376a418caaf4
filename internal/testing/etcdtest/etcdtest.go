package etcdtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/allocd/allocd/internal/etcd/call"

	"github.com/allocd/allocd/internal/etcd/embedded"
	"github.com/allocd/allocd/internal/loopback"
)

// Server is a running test etcd.
type Server struct {
	// Client is connected to the member; closed by t.Cleanup.
	Client *clientv3.Client
	// Endpoint is the member's client URL.
	Endpoint string

	t       testing.TB
	cfg     embedded.Config
	etcd    *embed.Etcd // the embedded member; nil while stopped or with binaryEnv
	proc    *process    // the member's process with binaryEnv; nil while stopped
	clients []*clientv3.Client
}

// Option changes how the test etcd runs.
type Option func(*embedded.Config)

// WithFsync keeps fsync on: for tests that restart the member or measure durability.
func WithFsync() Option { return func(c *embedded.Config) { c.UnsafeNoFsync = false } }

// New starts a member with fast raft timing (10 ms ticks, 100 ms election timeout, so
// that lease TTLs down to 1 s are granted) and fsync off, and a client for it.
func New(t testing.TB, opts ...Option) *Server {
	t.Helper()
	cfg := embedded.Config{
		Name:          "test",
		Dir:           t.TempDir(),
		ClientURL:     "http://" + freeAddr(t),
		PeerURL:       "http://" + freeAddr(t),
		UnsafeNoFsync: true,
		TickMs:        10,
		ElectionMs:    100,
	}
	for _, o := range opts {
		o(&cfg)
	}
	s := &Server{t: t, cfg: cfg, Endpoint: cfg.ClientURL}
	s.start()
	s.Client = s.NewClient()
	t.Cleanup(s.stop)
	logProcess(t, s.Endpoint)
	return s
}

// NewClient returns one more client of the member (a second allocd replica has its
// own), closed by t.Cleanup.
func (s *Server) NewClient() *clientv3.Client {
	s.t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{s.Endpoint},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		// As allocd's own client: the errors of calls that reached no member say so.
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(call.NotSentInterceptor()),
			grpc.WithDisableRetry()},
	})
	if err != nil {
		s.t.Fatalf("etcd client: %v", err)
	}
	s.clients = append(s.clients, c)
	return c
}

// Restart stops the member and starts it again on the same data dir and ports, as a
// crash and restart would. Use it with WithFsync. Existing clients reconnect.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}

// Stop stops the member without restarting it (to test etcd being unreachable).
func (s *Server) Stop() {
	if s.etcd != nil {
		s.etcd.Close()
		s.etcd = nil
	}
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
}

// Start starts a member stopped by Stop again.
func (s *Server) Start() {
	s.t.Helper()
	if s.etcd == nil && s.proc == nil {
		s.start()
	}
}

func (s *Server) start() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if binary() != "" {
		p, err := startProcess(ctx, s.cfg)
		if err != nil {
			s.t.Fatalf("start etcd: %v", err)
		}
		s.proc = p
		return
	}
	e, err := embedded.Start(ctx, s.cfg)
	if err != nil {
		s.t.Fatalf("start etcd: %v", err)
	}
	s.etcd = e
}

func (s *Server) stop() {
	for _, c := range s.clients {
		c.Close()
	}
	s.Stop()
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	a, err := loopback.FreeAddr()
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	return a
}

// FreeAddr returns a loopback host:port that was free a moment ago, for tests that
// start an allocd server.
func FreeAddr(t testing.TB) string { return freeAddr(t) }

// String describes the member, for test logs.
func (s *Server) String() string { return fmt.Sprintf("etcd %s in %s", s.Endpoint, s.cfg.Dir) }
