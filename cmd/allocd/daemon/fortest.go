package daemon

import (
	"context"
	"io"
	"time"

	"github.com/allocd/allocd/internal/loopback"
)

// TB is what StartForTest needs of a test: testing.TB has it. The daemon does not
// import package testing, so that the allocd binary does not link it.
type TB interface {
	Helper()
	TempDir() string
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// StartForTest starts allocd for a test: embedded etcd in t.TempDir() with fsync off and
// fast raft timing, every listener on a free loopback port, logs discarded (unless
// mutate sets LogOutput), stopped by t.Cleanup. mutate changes the config first.
func StartForTest(t TB, mutate ...func(*Config)) *Daemon {
	t.Helper()
	cfg := TestConfig(t.TempDir(), func() string { return freeAddr(t) })
	for _, m := range mutate {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start allocd: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestConfig is the configuration StartForTest uses, for callers without a testing.TB
// (examples): data in dir, listeners on addresses from free.
func TestConfig(dir string, free func() string) Config {
	cfg := DefaultConfig()
	cfg.DataDir = dir
	cfg.EmbeddedEtcdClientAddress = free()
	cfg.EmbeddedEtcdPeerAddress = free()
	cfg.GRPCAddress = free()
	cfg.MetricsAddress = free()
	cfg.LogOutput = io.Discard
	cfg.ShutdownTimeout = 2 * time.Second
	cfg.embeddedEtcdUnsafeNoFsync = true
	cfg.embeddedEtcdTickMs = 10
	cfg.embeddedEtcdElectionMs = 100
	return cfg
}

// FreeAddr returns a loopback host:port that was free a moment ago.
func FreeAddr() (string, error) { return loopback.FreeAddr() }

func freeAddr(t TB) string {
	a, err := FreeAddr()
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	return a
}
