package compactor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	// defaultPoll is how often a Member reads its status.
	defaultPoll = time.Second
	// statusTimeout bounds one status read.
	statusTimeout = 2 * time.Second
	// defragTimeout bounds one defragmentation (etcd goes on with it if the call gives up).
	defragTimeout = 5 * time.Minute
	// defragRetry is the pause after a failed defragmentation.
	defragRetry = time.Minute
)

// Maintainer is what a Member needs of etcd's maintenance API: clientv3.Maintenance
// (and so *clientv3.Client) has it. (v3client's in-process one cannot defragment: its
// server has no health notifier.)
type Maintainer interface {
	Status(ctx context.Context, endpoint string) (*clientv3.StatusResponse, error)
	Defragment(ctx context.Context, endpoint string) (*clientv3.DefragmentResponse, error)
}

// MemberConfig says how a Member looks after the etcd member allocd runs.
type MemberConfig struct {
	// Endpoint is the member's client URL: Status and Defragment go to it (a
	// Maintainer bound to one connection ignores it), and logs name it.
	Endpoint string
	// HistoryBytes is the history budget: when the database in use has grown by more
	// than this since the lowest size seen after the last hurry, the Compactor is
	// hurried. 0: never.
	HistoryBytes int64
	// DefragFreeBytes is the least free space (file size - size in use) worth a
	// defragmentation, which also needs at least half of the file free. Must be > 0.
	DefragFreeBytes int64
	// Compactor is the Compactor to hurry; nil: compaction is off, the Member only
	// defragments after compactions made by others (etcdctl compact).
	Compactor *Compactor
	// Poll is how often the member's status is read; 1 s when 0.
	Poll time.Duration
	// Logger; slog.Default() when nil.
	Logger *slog.Logger
	// Registerer gets the metrics; nil: none.
	Registerer prometheus.Registerer
}

// Member looks after the space of one etcd member (see the package comment). Run it
// once; Defragment is for before Run.
type Member struct {
	cli  Maintainer
	cfg  MemberConfig
	log  *slog.Logger
	m    *memberMetrics
	poll time.Duration

	// Only the goroutine that runs Run (or Defragment before it) uses these.
	low         int64     // the lowest size in use seen since the last hurry; 0: none yet
	lastRev     int64     // etcd's revision at the previous status read
	defragAfter time.Time // no defragmentation before, after a failed one
}

// NewMember returns a Member of the member at cfg.Endpoint, reached through cli.
func NewMember(cli Maintainer, cfg MemberConfig) (*Member, error) {
	if cfg.DefragFreeBytes <= 0 {
		return nil, fmt.Errorf("compactor: defragmentation threshold %d: want > 0", cfg.DefragFreeBytes)
	}
	if cfg.HistoryBytes < 0 {
		return nil, fmt.Errorf("compactor: history budget %d: want >= 0", cfg.HistoryBytes)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	m, err := newMemberMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	poll := cfg.Poll
	if poll <= 0 {
		poll = defaultPoll
	}
	return &Member{cli: cli, cfg: cfg, log: log.With("component", "compactor", "member", cfg.Endpoint), m: m, poll: poll}, nil
}

// Run reads the member's status every poll, hurries the Compactor when the history
// outgrows its budget and defragments when the file is mostly free, until ctx ends; it
// then returns nil. A failed read is logged at debug: the health check reports an etcd
// that does not answer.
func (m *Member) Run(ctx context.Context) error {
	t := time.NewTicker(m.poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		st, err := m.status(ctx)
		if err != nil {
			if ctx.Err() == nil {
				m.log.Debug("etcd member status", "err", err)
			}
			continue
		}
		m.hurry(st)
		if m.fragmented(st) && time.Now().After(m.defragAfter) {
			if err := m.defrag(ctx, st); err != nil && ctx.Err() == nil {
				m.log.Warn("etcd defragmentation failed; trying again later", "err", err, "after", defragRetry)
			}
		}
	}
}

// Defragment defragments the member if at least half of its file, and at least
// DefragFreeBytes, is free, and reports whether it did. Call it before Run (at start,
// before the member serves allocd, when the pause harms nobody), not while Run runs.
func (m *Member) Defragment(ctx context.Context) (bool, error) {
	st, err := m.status(ctx)
	if err != nil {
		return false, err
	}
	if !m.fragmented(st) {
		return false, nil
	}
	return true, m.defrag(ctx, st)
}

// status reads the member's status and exports its sizes.
func (m *Member) status(ctx context.Context) (*clientv3.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	st, err := m.cli.Status(ctx, m.cfg.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("status of etcd member %s: %w", m.cfg.Endpoint, err)
	}
	if st.Header == nil {
		return nil, errors.New("status of etcd member " + m.cfg.Endpoint + ": no header")
	}
	m.m.size.Set(float64(st.DbSize))
	m.m.inUse.Set(float64(st.DbSizeInUse))
	m.m.quota.Set(float64(st.DbSizeQuota))
	return st, nil
}

// hurry hurries the Compactor, to compact the revision of the previous read (a poll
// ago), when the size in use has grown by more than the budget since the lowest size
// seen after the last hurry: what the history has added since it was last compacted.
func (m *Member) hurry(st *clientv3.StatusResponse) {
	defer func() { m.lastRev = st.Header.Revision }()
	if m.cfg.Compactor == nil || m.cfg.HistoryBytes == 0 {
		return
	}
	if m.low == 0 || st.DbSizeInUse < m.low {
		m.low = st.DbSizeInUse
	}
	if st.DbSizeInUse-m.low > m.cfg.HistoryBytes && m.lastRev > 0 {
		m.log.Debug("etcd history over its budget: compacting now", "in_use", st.DbSizeInUse, "grown", st.DbSizeInUse-m.low,
			"budget", m.cfg.HistoryBytes, "revision", m.lastRev)
		m.cfg.Compactor.Hurry(m.lastRev)
		m.low = 0 // measured anew from the next read, after the compaction
	}
}

// fragmented reports whether defragmenting st's member is worth its pause.
func (m *Member) fragmented(st *clientv3.StatusResponse) bool {
	free := st.DbSize - st.DbSizeInUse
	return free >= m.cfg.DefragFreeBytes && free >= st.DbSizeInUse
}

// defrag defragments the member (which serves nothing meanwhile) and logs the sizes
// before and after.
func (m *Member) defrag(ctx context.Context, before *clientv3.StatusResponse) error {
	dctx, cancel := context.WithTimeout(ctx, defragTimeout)
	defer cancel()
	start := time.Now()
	_, err := m.cli.Defragment(dctx, m.cfg.Endpoint)
	took := time.Since(start)
	if err != nil {
		m.m.defrags.WithLabelValues("failed").Inc()
		m.defragAfter = time.Now().Add(defragRetry)
		return fmt.Errorf("defragment etcd member %s: %w", m.cfg.Endpoint, err)
	}
	m.m.defrags.WithLabelValues("done").Inc()
	m.m.defragSeconds.Observe(took.Seconds())
	attrs := []any{"size_before", before.DbSize, "in_use_before", before.DbSizeInUse, "took", took.Round(time.Millisecond)}
	if after, err := m.status(ctx); err == nil {
		attrs = append(attrs, "size_after", after.DbSize)
	}
	m.log.Info("etcd member defragmented", attrs...)
	return nil
}
