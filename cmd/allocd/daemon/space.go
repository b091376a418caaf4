package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/allocd/allocd/internal/etcd/compactor"
)

// etcd's space: compaction of its history (every replica), defragmentation of the
// embedded member, and the NOSPACE alarm in the health status (docs/operators/etcd.md: "Running for
// months").

// DefaultQuotaBackendBytes is etcd's default quota, 2 GiB: --quota-backend-bytes.
const DefaultQuotaBackendBytes = 2 << 30

const (
	// minQuotaBackendBytes is the least --quota-backend-bytes allocd takes (but 0):
	// below it the history budget, an eighth, is under 2 MiB (a few thousand Allocate
	// and Release cycles), and an etcd of a few MiB refuses allocd's own writes at its
	// first start (a quota under 8 bytes would even make the budget 0).
	minQuotaBackendBytes = 16 << 20
	// maxRecommendedQuotaBackendBytes is etcd's recommended largest quota, 8 GiB: above
	// it, allocd starts with a warning.
	maxRecommendedQuotaBackendBytes = 8 << 30
)

// historyBudget is how much the embedded etcd's database in use may grow between two
// compactions before the compactor compacts sooner than --etcd-compaction-interval
// (all but the last 2 s or so of history: compactor.Member), at least: 16 MiB (some
// 25,000 Allocate and Release cycles: seconds at full speed, hours at a Kubernetes
// cluster's pace), at most an eighth of the quota. Defragmentation waits for twice that
// much free space. The budget grows with the store (historyShare).
func historyBudget(quota int64) int64 {
	if quota == 0 {
		quota = DefaultQuotaBackendBytes
	}
	return min(16<<20, quota/8)
}

// historyShare is the share of the database in use that its history may reach before
// a compaction, once that is more than historyBudget: a compaction walks every key of
// etcd's index (about 4.6 s of CPU at a million allocations, two million keys), so a
// budget that grows with the store keeps compaction's cost per write the same at every
// size. With a fixed 16 MiB, at a million allocations and full speed, compactions came
// every 10 s or so and took a third of the CPU (docs/contributors/scale.md).
const historyShare = 0.25

// validateEtcdSpace checks --etcd-compaction-interval and --quota-backend-bytes.
func (c *Config) validateEtcdSpace() []error {
	var errs []error
	if c.EtcdCompactionInterval < 0 {
		errs = append(errs, badValue("--etcd-compaction-interval",
			"--etcd-compaction-interval %v: want >= 0 (0: never compact)", c.EtcdCompactionInterval))
	}
	switch {
	case c.QuotaBackendBytes < 0:
		errs = append(errs, badValue("--quota-backend-bytes",
			"--quota-backend-bytes %d: want >= 0 (0: etcd's default, 2 GiB)", c.QuotaBackendBytes))
	case c.QuotaBackendBytes > 0 && c.QuotaBackendBytes < minQuotaBackendBytes:
		errs = append(errs, badValue("--quota-backend-bytes",
			"--quota-backend-bytes %d: want at least 16 MiB (%d), or 0 for etcd's default, 2 GiB",
			c.QuotaBackendBytes, minQuotaBackendBytes))
	case len(c.EtcdServers) > 0 && c.QuotaBackendBytes != 0 &&
		c.QuotaBackendBytes != DefaultQuotaBackendBytes:
		errs = append(errs, flagError(ErrFlagConflict, []string{"--quota-backend-bytes", "--etcd-servers"},
			"--quota-backend-bytes %d: applies to the embedded etcd only; with --etcd-servers set "+
				"--quota-backend-bytes on the etcd members", c.QuotaBackendBytes))
	}
	return errs
}

// exportedAlarms are the etcd alarms allocd_etcd_alarm exports.
var exportedAlarms = []etcdserverpb.AlarmType{etcdserverpb.AlarmType_NOSPACE, etcdserverpb.AlarmType_CORRUPT}

// startSpace runs the compactor (with --etcd-compaction-interval) and, for the
// embedded etcd, the Member that hurries it and defragments. Before, it frees the
// embedded etcd's space if it is out of space (startOutOfSpace), and defragments it
// when compaction has left most of its file free (and little enough in use for a short
// pause, compactor.DefragMaxInUseBytes): this allocd does not serve yet, but other
// clients of the embedded etcd (the other replicas of `make cluster`, which use it
// through --etcd-servers; an operator's etcdctl) wait for the pause. The loops run in
// d.group under runCtx.
func (d *Daemon) startSpace(ctx, runCtx context.Context) error {
	d.alarms = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "allocd_etcd_alarm",
		Help: "1 while etcd has raised the alarm (NOSPACE: out of space, every write " +
			"refused; CORRUPT), else 0.",
	}, []string{"alarm"})
	for _, a := range exportedAlarms {
		d.alarms.WithLabelValues(a.String())
	}
	if err := d.registry.Register(d.alarms); err != nil {
		return err
	}
	var c *compactor.Compactor
	if d.cfg.EtcdCompactionInterval > 0 {
		var err error
		c, err = compactor.New(d.cli, compactor.Config{Key: d.cfg.EtcdPrefix + compactor.KeyName,
			Interval: d.cfg.EtcdCompactionInterval, Logger: d.log, Registerer: d.registry})
		if err != nil {
			return err
		}
		d.group.Go(func() error { return c.Run(runCtx) })
	}
	if d.etcd == nil {
		return nil // an external etcd's defragmentation is its operator's (docs/operators/etcd.md)
	}
	if q := d.cfg.QuotaBackendBytes; q > maxRecommendedQuotaBackendBytes {
		d.log.Warn("--quota-backend-bytes is above etcd's recommended maximum, 8 GiB: a larger database "+
			"makes the embedded etcd slower to start, to snapshot and to defragment", "quota_backend_bytes",
			q)
	}
	budget := historyBudget(d.cfg.QuotaBackendBytes)
	// The maintenance calls on d.cli's connection to the member (d.cli's Status and
	// Defragment would dial a connection per call).
	mt := clientv3.NewMaintenanceFromMaintenanceClient(
		etcdserverpb.NewMaintenanceClient(d.cli.ActiveConnection()), d.cli)
	if err := d.startOutOfSpace(ctx, mt, budget); err != nil {
		return err
	}
	// Tests that poll faster keep two polls of history too (2 s at the default 1 s).
	m, err := compactor.NewMember(mt,
		compactor.MemberConfig{Endpoint: "http://" + d.cfg.EmbeddedEtcdClientAddress,
			HistoryBytes: budget, HistoryShare: historyShare, DefragFreeBytes: 2 * budget, Compactor: c,
			Poll:         d.cfg.etcdSpacePoll,
			HistoryFloor: 2 * d.cfg.etcdSpacePoll, Logger: d.log, Registerer: d.registry})
	if err != nil {
		return err
	}
	if _, err := m.Defragment(ctx); err != nil {
		d.log.Warn("defragmentation of the embedded etcd at start failed; trying again later", "err", err)
	}
	d.group.Go(func() error { return m.Run(runCtx) })
	return nil
}

// startOutOfSpace makes the embedded etcd writable again when it is out of space at
// start: etcd keeps its NOSPACE alarm across restarts, and allocd writes to etcd as it
// starts, so it would not start, and with it would go the embedded etcd. An etcd out of
// space serves no writes to anyone, and this allocd serves nothing yet, so it does what
// docs/operators/etcd.md tells an operator: compact all history (unless --etcd-compaction-interval
// is 0), defragment, and disarm the alarm if the database then leaves twice the
// history budget under the quota; else it says what to do. Other clients of the
// embedded etcd (the other replicas of `make cluster`; anything else pointed at its
// client address) lose the history they might still have watched from, as after any
// compaction, and wait for the defragmentation.
func (d *Daemon) startOutOfSpace(ctx context.Context, mt compactor.Maintainer, budget int64) error {
	alarms, err := d.cli.AlarmList(ctx)
	if err != nil {
		return fmt.Errorf("alarms of the embedded etcd: %w", err)
	}
	var nospace []*etcdserverpb.AlarmMember
	for _, a := range alarms.Alarms {
		if a.Alarm == etcdserverpb.AlarmType_NOSPACE {
			nospace = append(nospace, a)
		}
	}
	if len(nospace) == 0 {
		return nil
	}
	endpoint := "http://" + d.cfg.EmbeddedEtcdClientAddress
	if d.cfg.EtcdCompactionInterval > 0 {
		resp, err := d.cli.Get(ctx, d.cfg.EtcdPrefix+"/health", clientv3.WithCountOnly())
		if err == nil {
			_, err = d.cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical())
		}
		if err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
			return fmt.Errorf("compact the embedded etcd, out of space: %w", err)
		}
	}
	if _, err := mt.Defragment(ctx, endpoint); err != nil {
		return fmt.Errorf("defragment the embedded etcd, out of space: %w", err)
	}
	st, err := mt.Status(ctx, endpoint)
	if err != nil {
		return fmt.Errorf("status of the embedded etcd: %w", err)
	}
	if st.DbSize > st.DbSizeQuota-2*budget {
		hint, flags := "raise --quota-backend-bytes", []string{"--quota-backend-bytes"}
		if d.cfg.EtcdCompactionInterval == 0 {
			hint += ", or start once with --etcd-compaction-interval above 0 to compact its history"
			flags = append(flags, "--etcd-compaction-interval")
		}
		return flagError(ErrFlagValue, flags, "the embedded etcd in %s is out of space (alarm NOSPACE): "+
			"its database takes %d bytes of --quota-backend-bytes %d after defragmentation: %s",
			d.cfg.DataDir, st.DbSize, st.DbSizeQuota, hint)
	}
	for _, a := range nospace {
		if _, err := d.cli.AlarmDisarm(ctx, (*clientv3.AlarmMember)(a)); err != nil {
			return fmt.Errorf("disarm the NOSPACE alarm of the embedded etcd: %w", err)
		}
	}
	d.log.Warn("the embedded etcd was out of space at start: history compacted, defragmented, NOSPACE "+
		"alarm disarmed",
		"compacted", d.cfg.EtcdCompactionInterval > 0, "db_size", st.DbSize, "in_use", st.DbSizeInUse,
		"quota_backend_bytes", st.DbSizeQuota)
	return nil
}

// outOfSpaceHint adds what to do to a start that failed because etcd is out of space
// (an external one: allocd frees the embedded one's space itself, startOutOfSpace).
func outOfSpaceHint(err error) error {
	if !errors.Is(err, rpctypes.ErrNoSpace) {
		return err
	}
	return fmt.Errorf("etcd is out of space (alarm NOSPACE) and allocd writes to etcd as it starts; "+
		"free space and disarm the alarm (etcdctl compact, etcdctl defrag, etcdctl alarm disarm): %w", err)
}

// etcdState is what the health check last saw of etcd.
type etcdState int

const (
	etcdServing     etcdState = iota
	etcdUnreachable           // a linearizable read failed
	etcdNoSpace               // the NOSPACE alarm is raised: writes are refused, reads work
	etcdUnknown               // reads work, the status could not be read: no change
)

// checkEtcd reads a key (linearizable) and the alarms of etcd, and exports the alarms.
// The alarms come from a member's status (compactor.Alarms), which the member answers
// by itself: AlarmList goes through raft, a log entry and an fsync on every member,
// every second.
func (d *Daemon) checkEtcd(ctx context.Context) (etcdState, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := d.cli.Get(ctx, d.cfg.EtcdPrefix+"/health", clientv3.WithCountOnly()); err != nil {
		return etcdUnreachable, err
	}
	// On d.cli's connection (whichever member it is on), not a new one per call.
	mt := clientv3.NewMaintenanceFromMaintenanceClient(
		etcdserverpb.NewMaintenanceClient(d.cli.ActiveConnection()), d.cli)
	st, err := mt.Status(ctx, "")
	if err != nil {
		return etcdUnknown, err
	}
	raised := map[string]bool{}
	for _, a := range compactor.Alarms(st) {
		raised[a] = true
	}
	for _, a := range exportedAlarms {
		v := 0.0
		if raised[a.String()] {
			v = 1
		}
		d.alarms.WithLabelValues(a.String()).Set(v)
	}
	if raised[etcdserverpb.AlarmType_NOSPACE.String()] {
		return etcdNoSpace, nil
	}
	return etcdServing, nil
}

// etcdStateChanged sets the health status for etcd's new state and logs the change.
func (d *Daemon) etcdStateChanged(from, to etcdState, err error) {
	switch to {
	case etcdServing:
		d.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		if from == etcdNoSpace {
			d.log.Info("etcd NOSPACE alarm disarmed: writes accepted again; SERVING")
			return
		}
		d.log.Info("etcd reachable again: SERVING")
	case etcdUnreachable:
		d.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
		d.log.Warn("etcd unreachable: NOT_SERVING", "err", err)
	case etcdNoSpace:
		d.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
		attrs := []any{"alarm", "NOSPACE", "etcd", d.etcdDescription()}
		if d.etcd != nil {
			attrs = append(attrs, "quota_backend_bytes", d.cfg.QuotaBackendBytes)
		}
		d.log.Error("etcd is out of space (alarm NOSPACE): every write fails with RESOURCE_EXHAUSTED, "+
			"reads still work; free space and disarm: etcdctl compact (allocd compacts every "+
			"--etcd-compaction-interval), etcdctl defrag, etcdctl alarm disarm; NOT_SERVING", attrs...)
	}
}
