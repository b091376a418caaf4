package compactor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jonboulle/clockwork"
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
	// hurryFloor is the least age of the revision a hurry compacts: the history of the
	// last hurryFloor is always kept. The target is the newest revision a status read saw
	// at least this long ago, not the previous read's: a loop pass that runs long (a slow
	// Status, a defragmentation) makes the ticker deliver its late tick at once, and two
	// reads then land milliseconds apart. Two polls: a client that resumes a watch or
	// turns a page a second old still finds its revision, and at allocd's full speed
	// (some 1,300 Allocate+Release cycles/s, 600 bytes of history each) the kept history
	// is under 2 MiB, small beside the 16 MiB budget.
	hurryFloor = 2 * time.Second
	// DefragMaxInUseBytes caps automatic defragmentation: a defragmentation blocks the
	// member (it serves nothing, to allocd nor to any other client, such as the other
	// replicas of `make cluster`) for a time that grows with the size in use, some
	// seconds per GiB. Above it a Member logs, once, that an operator should run
	// `etcdctl defrag` at a quiet time.
	DefragMaxInUseBytes = 256 << 20
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
	// hurried. 0: never. With HistoryShare, the least budget.
	HistoryBytes int64
	// HistoryShare makes the budget grow with the store: at least this share of the
	// lowest size in use seen after the last hurry (what the last compaction left),
	// and never more than a quarter of the room left under the member's quota. A
	// compaction walks every key of etcd's index, so its cost grows with the store;
	// with a budget that grows as fast, the compactions of a store twice as large come
	// half as often, and their cost per write stays the same. 0: the budget is
	// HistoryBytes whatever the size.
	HistoryShare float64
	// DefragFreeBytes is the least free space (file size - size in use) worth a
	// defragmentation, which also needs at least half of the file free, and at most
	// DefragMaxInUseBytes in use. Must be > 0.
	DefragFreeBytes int64
	// Compactor is the Compactor to hurry; nil: compaction is off, the Member only
	// defragments after compactions made by others (etcdctl compact).
	Compactor *Compactor
	// Poll is how often the member's status is read; 1 s when 0.
	Poll time.Duration
	// HistoryFloor is the least age of the revision a hurry compacts; 2 s when 0 (tests
	// that poll faster shorten it too).
	HistoryFloor time.Duration
	// Logger; slog.Default() when nil.
	Logger *slog.Logger
	// Registerer gets the metrics; nil: none.
	Registerer prometheus.Registerer
	// Clock times the polls, the history floor and the pause after a failed
	// defragmentation; nil: the real clock. Tests advance a fake one.
	Clock clockwork.Clock
}

// Member looks after the space of one etcd member (see the package comment). Run it
// once; Defragment is for before Run.
type Member struct {
	cli   Maintainer
	cfg   MemberConfig
	log   *slog.Logger
	m     *memberMetrics
	poll  time.Duration
	clock clockwork.Clock

	floor          time.Duration // HistoryFloor
	maxDefragInUse int64         // DefragMaxInUseBytes; tests lower it

	// Only the goroutine that runs Run (or Defragment before it) uses these.
	low         int64         // the lowest size in use seen since the last hurry; 0: none yet
	lowBefore   int64         // low when the last hurry was asked for
	failures    int64         // the Compactor's HurryFailures as last seen
	seen        []observation // status reads: the newest one at least floor old, then the younger ones
	hurried     int64         // the revision the last hurry asked for
	defragAfter time.Time     // no defragmentation before, after a failed one
	advised     bool          // the recommendation to defragment by hand is logged for the current state
}

// observation is etcd's revision at a status read.
type observation struct {
	at  time.Time
	rev int64
}

// NewMember returns a Member of the member at cfg.Endpoint, reached through cli.
func NewMember(cli Maintainer, cfg MemberConfig) (*Member, error) {
	if cfg.DefragFreeBytes <= 0 {
		return nil, fmt.Errorf("compactor: defragmentation threshold %d: want > 0", cfg.DefragFreeBytes)
	}
	if cfg.HistoryBytes < 0 {
		return nil, fmt.Errorf("compactor: history budget %d: want >= 0", cfg.HistoryBytes)
	}
	if cfg.HistoryShare < 0 || cfg.HistoryShare > 1 {
		return nil, fmt.Errorf("compactor: history share %v: want 0 to 1", cfg.HistoryShare)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	m, err := newMemberMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	poll, floor := cfg.Poll, cfg.HistoryFloor
	if poll <= 0 {
		poll = defaultPoll
	}
	if floor <= 0 {
		floor = hurryFloor
	}
	clock := cfg.Clock
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	return &Member{cli: cli, cfg: cfg, log: log.With("component", "compactor", "member", cfg.Endpoint), m: m,
		poll:  poll,
		clock: clock, floor: floor, maxDefragInUse: DefragMaxInUseBytes}, nil
}

// Run reads the member's status every poll, hurries the Compactor when the history
// outgrows its budget and defragments when the file is mostly free, until ctx ends; it
// then returns nil. A failed read is logged at debug: the health check reports an etcd
// that does not answer.
func (m *Member) Run(ctx context.Context) error {
	t := m.clock.NewTicker(m.poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.Chan():
		}
		st, err := m.status(ctx)
		if err != nil {
			if ctx.Err() == nil {
				m.log.Debug("etcd member status", "err", err)
			}
			continue
		}
		m.hurry(st)
		if m.defragWanted(st) && m.clock.Now().After(m.defragAfter) {
			if err := m.defrag(ctx, st); err != nil && ctx.Err() == nil {
				m.log.Warn("etcd defragmentation failed; trying again later",
					"err", err, "after", defragRetry)
			}
		}
	}
}

// Defragment defragments the member if at least half of its file, and at least
// DefragFreeBytes, is free, and at most DefragMaxInUseBytes in use, and reports
// whether it did. Call it before Run (at start, before the member serves allocd, when
// the pause harms fewest: other clients of the member still wait for it), not while
// Run runs.
func (m *Member) Defragment(ctx context.Context) (bool, error) {
	st, err := m.status(ctx)
	if err != nil {
		return false, err
	}
	if !m.defragWanted(st) {
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

// hurry hurries the Compactor, to compact the newest revision read at least floor ago,
// when the size in use has grown by more than the budget since the lowest size seen
// after the last hurry (what the history has added since it was last compacted), or
// when the member is out of space (NOSPACE: the hurried step compacts without the
// compaction key, which etcd refuses to write). Never twice for one revision. When the
// Compactor reports that a hurried step failed, the lowest size goes back to what it
// was before that hurry, so the next read hurries again.
func (m *Member) hurry(st *clientv3.StatusResponse) {
	target := m.observe(m.clock.Now(), st.Header.Revision)
	if m.cfg.Compactor == nil || m.cfg.HistoryBytes == 0 {
		return
	}
	if f := m.cfg.Compactor.HurryFailures(); f != m.failures {
		// The hurried compaction failed: nothing was freed. Measured from the size
		// after it, the budget would let the store grow by another share of itself
		// (and by more after every failure) before the next hurry; measured from
		// before, it hurries again now.
		m.failures, m.low = f, m.lowBefore
	}
	if m.low == 0 || st.DbSizeInUse < m.low {
		m.low = st.DbSizeInUse
	}
	budget := m.budget(st.DbSizeQuota)
	m.m.budget.Set(float64(budget))
	grown, nospace := st.DbSizeInUse-m.low, slices.Contains(Alarms(st), "NOSPACE")
	if (grown <= budget && !nospace) || target <= m.hurried {
		return
	}
	m.log.Debug("etcd history over its budget, or etcd out of space: compacting now",
		"in_use", st.DbSizeInUse, "grown", grown, "budget", budget, "nospace", nospace,
		"revision", target)
	m.cfg.Compactor.Hurry(target)
	m.hurried = target
	m.lowBefore = m.low
	m.low = 0 // measured anew from the next read, after the compaction (unless it fails)
}

// budget is the history budget now: HistoryBytes, or HistoryShare of the lowest size
// in use since the last hurry if that is more, but no more than a quarter of the room
// left under quota (0: unknown). The room is counted from the size in use, while etcd
// raises NOSPACE on the file's size: the file grows only when the size in use outgrows
// it (compaction frees pages, and etcd reuses them), so the file reaches the quota when
// the size in use does, give or take the pages a defragmentation would give back.
func (m *Member) budget(quota int64) int64 {
	b := m.cfg.HistoryBytes
	if m.cfg.HistoryShare == 0 {
		return b
	}
	b = max(b, int64(float64(m.low)*m.cfg.HistoryShare))
	if room := quota - m.low; quota > 0 && room/4 < b {
		b = max(room/4, 1<<20)
	}
	return b
}

// observe records etcd's revision rev read at now, and returns the newest revision
// read at least floor before now (0: none yet). It keeps that one and the younger
// ones: about floor/poll + 1 observations.
func (m *Member) observe(now time.Time, rev int64) int64 {
	m.seen = append(m.seen, observation{at: now, rev: rev})
	for len(m.seen) > 1 && now.Sub(m.seen[1].at) >= m.floor {
		m.seen = m.seen[1:]
	}
	if now.Sub(m.seen[0].at) < m.floor {
		return 0
	}
	return m.seen[0].rev
}

// defragWanted reports whether to defragment st's member now: it is fragmented, and
// small enough for the pause to be short. A fragmented member too large for that is
// logged once (until it is no longer so), with what an operator should do.
func (m *Member) defragWanted(st *clientv3.StatusResponse) bool {
	if !m.fragmented(st) || st.DbSizeInUse <= m.maxDefragInUse {
		m.advised = false
		return m.fragmented(st)
	}
	if !m.advised {
		m.advised = true
		m.log.Warn("etcd member mostly free, but too large to defragment automatically: etcd serves no "+
			"client while it defragments, for a time that grows with the size in use; run etcdctl defrag "+
			"on it at a quiet time",
			"size", st.DbSize, "in_use", st.DbSizeInUse, "max_in_use_auto_defrag", m.maxDefragInUse)
	}
	return false
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
		m.defragAfter = m.clock.Now().Add(defragRetry)
		return fmt.Errorf("defragment etcd member %s: %w", m.cfg.Endpoint, err)
	}
	m.m.defrags.WithLabelValues("done").Inc()
	m.m.defragSeconds.Observe(took.Seconds())
	attrs := []any{"size_before", before.DbSize, "in_use_before", before.DbSizeInUse, "took",
		took.Round(time.Millisecond)}
	if after, err := m.status(ctx); err == nil {
		attrs = append(attrs, "size_after", after.DbSize)
	}
	m.log.Info("etcd member defragmented", attrs...)
	return nil
}
