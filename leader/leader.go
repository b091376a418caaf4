package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// DefaultSessionTTL is the TTL of the election lease when Config.SessionTTL is 0: how
// long a leader that died keeps leadership.
const DefaultSessionTTL = 10 * time.Second

// Config configures an Elector.
type Config struct {
	// Prefix is the election's key prefix, e.g. "/allocd/repair/leader" (allocd keeps
	// the key repair's election has always used, so that replicas of older versions
	// and newer ones elect one leader during a rolling upgrade).
	Prefix string
	// Identity is this replica's gRPC address as other replicas dial it: the election
	// value, so that a replica that does not lead can forward calls to the leader.
	Identity string
	// SessionTTL is the TTL of the election lease; 0 means DefaultSessionTTL. Values
	// under a second are raised to a second (etcd's leases count in seconds).
	SessionTTL time.Duration
	// Logger receives the changes of leadership; nil discards.
	Logger *slog.Logger
}

// Lead is what a controller runs for one term of leadership: until ctx ends (the term
// is over), fencing its writes with f. It returns nil when ctx ended; an error it
// returns while the term lasts ends the term for every controller.
type Lead func(ctx context.Context, f Fence) error

// Elector takes part in allocd's one election and runs the controllers' terms. While
// Run runs, it also follows the election through a watch, so that Leader names the
// leader without a read of etcd.
type Elector struct {
	cli     *clientv3.Client
	cfg     Config
	log     *slog.Logger
	leading atomic.Bool
	view    candidates
	// reads counts the reads of the leader from etcd, lists the listings of the
	// election's watch (for tests).
	reads, lists atomic.Int64
}

// New returns an Elector; Run campaigns.
func New(cli *clientv3.Client, cfg Config) (*Elector, error) {
	switch {
	case cli == nil:
		return nil, errors.New("leader: nil etcd client")
	case cfg.Prefix == "":
		return nil, errors.New("leader: Prefix (the election key prefix) is required")
	case cfg.Identity == "":
		return nil, errors.New("leader: Identity (this replica's gRPC address) is required")
	case cfg.SessionTTL < 0:
		return nil, fmt.Errorf("leader: negative session TTL %v", cfg.SessionTTL)
	case cfg.SessionTTL == 0:
		cfg.SessionTTL = DefaultSessionTTL
	}
	cfg.SessionTTL = max(cfg.SessionTTL, time.Second)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Elector{cli: cli, cfg: cfg, log: log.With("component", "leader")}, nil
}

// retryDelay is the pause between two campaigns after a term ended or an etcd failure.
const retryDelay = time.Second

// resignTimeout bounds Resign and the lease revoke at the end of a term.
const resignTimeout = 2 * time.Second

// errSessionLost ends a term whose election lease expired or could not be kept alive.
var errSessionLost = errors.New("leader: election session lost")

// Run campaigns until ctx ends. For every term it wins it runs every lead at once and
// waits for all of them before the term ends. Meanwhile it watches the election, for
// Leader (follow). It returns nil when ctx ends, once the watch has stopped too.
func (e *Elector) Run(ctx context.Context, leads ...Lead) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { e.follow(ctx) })
	for {
		err := e.term(ctx, leads)
		if ctx.Err() != nil {
			return nil
		}
		e.log.WarnContext(ctx, "leadership ended; campaigning again", "error", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(retryDelay):
		}
	}
}

// term runs one term: campaign, the leads, resign.
func (e *Elector) term(ctx context.Context, leads []Lead) error {
	s, err := e.session(ctx)
	if err != nil {
		return err
	}
	defer e.endSession(ctx, s)
	el := concurrency.NewElection(s, e.cfg.Prefix)
	if err := el.Campaign(ctx, e.cfg.Identity); err != nil {
		return fmt.Errorf("campaign: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resignTimeout)
		defer cancel()
		if err := el.Resign(rctx); err != nil {
			e.log.WarnContext(ctx, "resign failed; the election lease ends the term", "error", err)
		}
	}()
	// lctx ends with ctx, with the session, or with the first lead that fails; it is
	// canceled before the watcher of the session is waited for, also when every lead
	// returned before lctx ended.
	lctx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel(nil)
	wg.Go(func() {
		select {
		case <-s.Done():
			cancel(errSessionLost)
		case <-lctx.Done():
		}
	})
	f := Fence{Key: el.Key(), Rev: el.Rev()}
	e.leading.Store(true)
	defer e.leading.Store(false)
	e.log.InfoContext(ctx, "elected leader", "identity", e.cfg.Identity, "key", f.Key, "revision", f.Rev)
	var leadWG sync.WaitGroup
	for _, lead := range leads {
		leadWG.Go(func() {
			if err := lead(lctx, f); err != nil && lctx.Err() == nil {
				cancel(fmt.Errorf("a controller ended the term: %w", err))
			}
		})
	}
	leadWG.Wait()
	return context.Cause(lctx)
}

// session grants the election lease and starts its keepalive. The lease is granted
// under ctx, so that a start against an unreachable etcd ends with ctx. The session's
// context outlives ctx so that Resign and the revoke of endSession still reach etcd at
// shutdown (each bounded by a timeout).
func (e *Elector) session(ctx context.Context) (*concurrency.Session, error) {
	ttl := int64(e.cfg.SessionTTL / time.Second)
	lease, err := e.cli.Grant(ctx, ttl)
	if err != nil {
		return nil, fmt.Errorf("election lease: %w", err)
	}
	s, err := concurrency.NewSession(e.cli,
		concurrency.WithTTL(int(ttl)),
		concurrency.WithLease(lease.ID),
		concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return nil, fmt.Errorf("election session: %w", err)
	}
	return s, nil
}

// endSession stops s's keepalive and revokes its lease within resignTimeout; if that
// fails, the lease ends with its TTL. (Not s.Close: it revokes with a timeout of the
// whole session TTL, which holds up a shutdown while etcd is unreachable.)
func (e *Elector) endSession(ctx context.Context, s *concurrency.Session) {
	s.Orphan()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resignTimeout)
	defer cancel()
	if _, err := e.cli.Revoke(rctx, s.Lease()); err != nil {
		e.log.WarnContext(ctx, "election lease revoke failed; it ends with its TTL", "error", err)
	}
}

// IsLeader reports whether a term of this replica runs now.
func (e *Elector) IsLeader() bool { return e.leading.Load() }

// Identity returns the identity this replica campaigns with.
func (e *Elector) Identity() string { return e.cfg.Identity }

// Leader returns the identity of the leader ("" when none is elected) and whether it is
// this replica. self comes from this replica's own term, never from anything read: it
// is true exactly while a term of this replica runs (IsLeader). The identity comes, while
// Run runs, from the watch of the election, without a read of etcd; it is read from etcd
// (ReadLeader) before the watch has listed, after it failed until it lists again, and
// while it sees no candidate.
//
// The watch trails etcd by the time an event takes to reach this replica, and by longer
// while it cannot reach etcd (a cut network, a stalled member: until it reconnects, or a
// member left out starts it anew): Leader may then name a replica that no longer leads,
// or not yet name its successor. That is safe: a replica serves what only the
// leader serves by its own term alone, and refuses the rest with a *NotLeaderError;
// its writes are fenced. A caller that was refused by the replica Leader named asks
// ReadLeader for etcd's answer.
func (e *Elector) Leader(ctx context.Context) (identity string, self bool, err error) {
	if e.leading.Load() {
		return e.cfg.Identity, true, nil
	}
	if id, ok := e.view.leader(); ok {
		return id, false, nil
	}
	return e.ReadLeader(ctx)
}

// ReadLeader is Leader read from etcd now, never from the watch: the key of the election
// with the lowest CreateRevision (concurrency.Election.Leader). The watch's view takes
// what it reads when that is newer, so that Leader follows at once.
func (e *Elector) ReadLeader(ctx context.Context) (identity string, self bool, err error) {
	if e.leading.Load() {
		return e.cfg.Identity, true, nil
	}
	e.reads.Add(1)
	resp, err := e.cli.Get(ctx, e.keyPrefix(), clientv3.WithPrefix())
	if err != nil {
		return "", false, fmt.Errorf("read the leader: %w", err)
	}
	e.view.merge(resp)
	return firstCreated(resp.Kvs), false, nil
}
