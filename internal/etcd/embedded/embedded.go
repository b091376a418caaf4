package embedded

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Config says where the embedded etcd keeps its data and listens.
type Config struct {
	// Name of the member; "allocd" when empty.
	Name string
	// Dir is the data directory. It is created when missing.
	Dir string
	// ClientURL is the client listen and advertise URL, e.g. http://127.0.0.1:2379.
	ClientURL string
	// PeerURL is the peer listen and advertise URL, e.g. http://127.0.0.1:2380.
	PeerURL string
	// UnsafeNoFsync turns fsync off. Only for tests that never crash or restart.
	UnsafeNoFsync bool
	// TickMs and ElectionMs override etcd's raft timing (100 and 1000 by default).
	// Smaller values start faster and lower the minimum lease TTL.
	TickMs, ElectionMs uint
	// LogLevel of etcd's own logger; "panic" (quiet) when empty.
	LogLevel string
	// ReadyTimeout bounds the wait for the member to serve; 60 s when zero.
	ReadyTimeout time.Duration
	// InitialCluster ("name=peerURL,...") and ClusterToken start a member of a new
	// cluster of several (the fault suite's); empty: a cluster of this member alone.
	InitialCluster, ClusterToken string
	// QuotaBackendBytes is etcd's --quota-backend-bytes: the size the database file may
	// reach before etcd raises the NOSPACE alarm and refuses writes; 0: etcd's default
	// (2 GiB).
	QuotaBackendBytes int64
	// MaxTxnOps is etcd's --max-txn-ops: the most operations of one transaction; 0:
	// etcd's default (128).
	MaxTxnOps uint
	// BackendBatchInterval is etcd's --backend-batch-interval: how long etcd's backend
	// may hold writes before it commits them to its database file, whose size in use
	// (Status) moves only then; 0: etcd's default (100 ms).
	BackendBatchInterval time.Duration
}

// Start starts the member and returns once it serves clients, or with an error that
// says what to fix (an unusable data dir, a port in use, a timeout).
func Start(ctx context.Context, c Config) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	if cfg.Name == "" {
		cfg.Name = "allocd"
	}
	if c.Dir == "" {
		return nil, errors.New("embedded etcd: empty data dir")
	}
	if err := checkDir(c.Dir); err != nil {
		return nil, err
	}
	cfg.Dir = c.Dir
	cu, err := url.Parse(c.ClientURL)
	if err != nil || cu.Host == "" {
		return nil, fmt.Errorf("embedded etcd: client URL %q: want http://HOST:PORT", c.ClientURL)
	}
	pu, err := url.Parse(c.PeerURL)
	if err != nil || pu.Host == "" {
		return nil, fmt.Errorf("embedded etcd: peer URL %q: want http://HOST:PORT", c.PeerURL)
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	if c.InitialCluster != "" {
		cfg.InitialCluster, cfg.InitialClusterToken = c.InitialCluster, c.ClusterToken
	}
	cfg.UnsafeNoFsync = c.UnsafeNoFsync
	if c.BackendBatchInterval > 0 {
		cfg.BackendBatchInterval = c.BackendBatchInterval
	}
	cfg.QuotaBackendBytes = c.QuotaBackendBytes
	if c.MaxTxnOps > 0 {
		cfg.MaxTxnOps = c.MaxTxnOps
	}
	if c.TickMs > 0 {
		cfg.TickMs = c.TickMs
	}
	if c.ElectionMs > 0 {
		cfg.ElectionMs = c.ElectionMs
	}
	cfg.LogLevel = c.LogLevel
	if cfg.LogLevel == "" {
		// etcd logs expected listener errors at "error" on every Close; real failures come
		// back from StartEtcd and Err().
		cfg.LogLevel = "panic"
	}
	// No metrics listener of etcd's own: allocd serves its metrics.
	cfg.ListenMetricsUrls = nil

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd in %s: %w", c.Dir, err)
	}
	timeout := c.ReadyTimeout
	if timeout == 0 {
		timeout = time.Minute
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s: %w", c.Dir, err)
	case <-t.C:
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s: not ready after %s", c.Dir, timeout)
	case <-ctx.Done():
		e.Server.Stop()
		e.Close()
		return nil, ctx.Err()
	}
}

// checkDir makes sure dir exists (creating it) and is writable, so that a bad
// --data-dir fails with a clear message rather than deep inside etcd.
func checkDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("data dir %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".allocd-write-check-*")
	if err != nil {
		return fmt.Errorf("data dir %s is not writable: %w", dir, err)
	}
	name := f.Name()
	f.Close()
	os.Remove(name)
	if _, err := os.Stat(filepath.Join(dir, "member")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("data dir %s: %w", dir, err)
	}
	return nil
}
