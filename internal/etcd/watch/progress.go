package watch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// progressEvery is how often a waiting reader asks the watch for a progress
// notification again (etcd drops the request while the watch is catching up).
const progressEvery = 50 * time.Millisecond

// ErrBehind is the sentinel of *BehindError.
var ErrBehind = errors.New("watch behind etcd")

// BehindError is a Wait that did not see the watch reach its target: the watch is not
// running (Running false) or stayed behind for the whole timeout.
type BehindError struct {
	Rev, Target int64
	Running     bool
	Timeout     time.Duration
}

// Error names both revisions, and how long the watch was waited for.
func (e *BehindError) Error() string {
	if !e.Running {
		return fmt.Sprintf("watch at revision %d, etcd at %d, and the watch is not running", e.Rev, e.Target)
	}
	return fmt.Sprintf("watch at revision %d, etcd at %d after %v", e.Rev, e.Target, e.Timeout)
}

// Unwrap lets errors.Is(err, ErrBehind) match.
func (e *BehindError) Unwrap() error { return ErrBehind }

// Progress is the revision up to which a watcher has applied etcd's changes to what it
// serves, and the wait of readers for it. The watcher calls Advance for every response
// (events and progress notifications) and answers Asked with a progress request on its
// watch's stream (see OwnStream); a reader calls Sync to see every write etcd committed
// before the call. The zero value is ready to use, at revision 0, not running.
type Progress struct {
	mu      sync.Mutex
	rev     int64
	revc    chan struct{} // closed and replaced when rev moves
	running bool
	askc    chan struct{}
	// expect is the newest revision passed to Expect that rev has not reached, and
	// expectAt when the watch last moved (or was first expected to) while behind it.
	expect   int64
	expectAt time.Time
	clock    clockwork.Clock // of expectAt; nil: the real clock (tests set a fake one)
}

// now is the time on p's clock.
func (p *Progress) now() time.Time {
	if p.clock == nil {
		return time.Now()
	}
	return p.clock.Now()
}

func (p *Progress) init() {
	if p.revc == nil {
		p.revc = make(chan struct{})
		p.askc = make(chan struct{}, 1)
	}
}

// Rev returns the revision reached.
func (p *Progress) Rev() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rev
}

// Advance records that rev is reached; it reports whether that moved the revision.
func (p *Progress) Advance(rev int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	if rev <= p.rev {
		return false
	}
	p.rev = rev
	close(p.revc)
	p.revc = make(chan struct{})
	if rev >= p.expect {
		p.expect = 0
	} else {
		p.expectAt = p.now()
	}
	return true
}

// Expect records that the watch should reach rev, a revision this process saw
// committed: Lagging reports a watch that does not get there.
func (p *Progress) Expect(rev int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rev <= p.rev {
		return
	}
	if p.expect == 0 {
		p.expectAt = p.now()
	}
	p.expect = max(p.expect, rev)
}

// Lagging reports whether the watch is behind a revision passed to Expect and has
// not moved for longer than d: a watch served by a stalled member (a paused process,
// a cut network) sends nothing and fails nothing, and its session is better opened
// anew, on the next member the client picks.
func (p *Progress) Lagging(d time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.expect > p.rev && p.now().Sub(p.expectAt) > d
}

// SetRunning records whether the watcher runs: a Wait fails at once, rather than
// waiting, while it does not.
func (p *Progress) SetRunning(v bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	p.running = v
	close(p.revc) // wake the waiters
	p.revc = make(chan struct{})
}

// Asked delivers the readers' requests for a progress notification.
func (p *Progress) Asked() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	return p.askc
}

// Sync reads etcd's current revision (a linearizable read of key, counted only) and
// waits until it is reached, at most timeout: what the watcher serves next is then at
// least as new as any write acknowledged before the call. It returns etcd's and ctx's
// errors, or a *BehindError.
func (p *Progress) Sync(ctx context.Context, cli *clientv3.Client, key string, timeout time.Duration) error {
	resp, err := cli.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("read etcd revision: %w", err)
	}
	return p.Wait(ctx, resp.Header.Revision, timeout)
}

// Wait waits until target is reached, asking the watcher for progress notifications
// meanwhile, for at most timeout.
func (p *Progress) Wait(ctx context.Context, target int64, timeout time.Duration) error {
	var tick, expired <-chan time.Time
	for {
		p.mu.Lock()
		p.init()
		rev, revc, running, askc := p.rev, p.revc, p.running, p.askc
		p.mu.Unlock()
		if rev >= target {
			return nil
		}
		if !running {
			return &BehindError{Rev: rev, Target: target}
		}
		if tick == nil {
			t := time.NewTicker(progressEvery)
			defer t.Stop()
			tm := time.NewTimer(timeout)
			defer tm.Stop()
			tick, expired = t.C, tm.C
		}
		select {
		case askc <- struct{}{}:
		default:
		}
		select {
		case <-revc:
		case <-tick:
		case <-expired:
			return &BehindError{Rev: rev, Target: target, Running: true, Timeout: timeout}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Loop runs one list-and-watch session after another until ctx ends, then returns.
// A session that ends while ctx lives is logged (what names it) and followed by the
// next after a pause that doubles from 100 ms up to maxBackoff, and starts again from
// 100 ms after a session that lasted longer than maxBackoff. When ctx carries
// Restarts (WithRestarts), a Fire ends the session and the next starts at once.
func Loop(ctx context.Context, log *slog.Logger, what string, maxBackoff time.Duration,
	session func(ctx context.Context) error) {
	const first = 100 * time.Millisecond
	backoff := first
	restarts, _ := ctx.Value(restartsKey{}).(*Restarts)
	for {
		start := time.Now()
		restarted, err := runSession(ctx, restarts, session)
		if ctx.Err() != nil {
			return
		}
		if restarted {
			log.Info(what+" opened anew: an etcd member was left out", "err", err)
			continue
		}
		if time.Since(start) > maxBackoff {
			backoff = first
		}
		log.Warn(what+" ended; listing again", "err", err, "after", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// runSession runs session with a context that a Fire of restarts (if any) cancels,
// and reports whether one did.
func runSession(ctx context.Context, restarts *Restarts,
	session func(ctx context.Context) error) (bool, error) {
	if restarts == nil {
		return false, session(ctx)
	}
	fired := restarts.C()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var restarted atomic.Bool
	go func() {
		select {
		case <-fired:
			restarted.Store(true)
			cancel()
		case <-sctx.Done():
		}
	}()
	err := session(sctx)
	cancel()
	return restarted.Load(), err
}

// Restarts tells every Loop whose context carries it to open its session anew: an
// etcd member was left out of the client's endpoints (a member that stalls, a paused
// process or a cut network, keeps its connections, and a watch it serves would stay
// silent until the client's keepalive gives up on it, after 15 s).
type Restarts struct {
	mu sync.Mutex
	ch chan struct{}
}

// NewRestarts returns a Restarts.
func NewRestarts() *Restarts { return &Restarts{ch: make(chan struct{})} }

// Fire ends the current session of every Loop that carries r.
func (r *Restarts) Fire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	close(r.ch)
	r.ch = make(chan struct{})
}

// C is closed by the next Fire.
func (r *Restarts) C() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ch
}

type restartsKey struct{}

// WithRestarts returns ctx carrying r, for the Loops run with it.
func WithRestarts(ctx context.Context, r *Restarts) context.Context {
	return context.WithValue(ctx, restartsKey{}, r)
}
