package watch

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

func TestProgressWait(t *testing.T) {
	ctx := context.Background()
	var p Progress
	var be *BehindError
	if err := p.Wait(ctx, 5, time.Second); !errors.As(err, &be) || be.Running || !errors.Is(err, ErrBehind) {
		t.Fatalf("Wait while not running = %v; want a BehindError with Running false, at once", err)
	}
	if !p.Advance(5) || p.Advance(4) || p.Rev() != 5 {
		t.Fatalf("Advance(5), Advance(4): Rev = %d; want 5, the second not moving it", p.Rev())
	}
	if err := p.Wait(ctx, 5, time.Second); err != nil {
		t.Fatalf("Wait(5) at revision 5 = %v; want nil", err)
	}
	p.SetRunning(true)
	start := time.Now()
	if err := p.Wait(ctx, 6, 100*time.Millisecond); !errors.As(err, &be) || !be.Running || be.Rev != 5 ||
		be.Target != 6 {
		t.Fatalf("Wait(6) with nothing advancing = %v; want a BehindError at 5 of 6 with Running true", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("Wait gave up after %v; want the whole 100 ms", d)
	}
	// A waiter asks for progress, and an Advance wakes it.
	done := make(chan error, 1)
	go func() { done <- p.Wait(ctx, 7, 5*time.Second) }()
	select {
	case <-p.Asked():
	case <-time.After(time.Second):
		t.Fatal("a waiting Wait did not ask for progress")
	}
	p.Advance(7)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Wait(7) after Advance(7) = %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("Advance did not wake the waiter")
	}
	// SetRunning(false) ends a waiter at once.
	select {
	case <-p.Asked(): // an ask left by the waiter before
	default:
	}
	go func() { done <- p.Wait(ctx, 8, 5*time.Second) }()
	select {
	case <-p.Asked(): // it waits
	case <-time.After(time.Second):
		t.Fatal("a waiting Wait did not ask for progress")
	}
	p.SetRunning(false)
	select {
	case err := <-done:
		if !errors.As(err, &be) || be.Running {
			t.Fatalf("Wait after SetRunning(false) = %v; want a BehindError with Running false", err)
		}
	case <-time.After(time.Second):
		t.Fatal("SetRunning(false) did not end the waiter")
	}
}

func TestLoop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int32
	done := make(chan struct{})
	go func() {
		Loop(ctx, slog.New(slog.DiscardHandler), "test watch", time.Second, func(ctx context.Context) error {
			if n.Add(1) == 3 {
				cancel()
			}
			return errors.New("broken")
		})
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Loop did not return after its context ended")
	}
	// Sessions after 0, 100 and 200 ms of pause: the third ends the context.
	if got := n.Load(); got != 3 {
		t.Errorf("sessions = %d; want 3", got)
	}
}

// TestLagging: a watch is lagging once it stays behind a revision it was expected to
// reach, without moving, for longer than the bound; moving restarts the count, and
// reaching the revision ends it.
func TestLagging(t *testing.T) {
	clock := clockwork.NewFakeClock()
	p := Progress{clock: clock}
	p.Advance(10)
	p.Expect(9) // reached already
	if p.Lagging(0) {
		t.Fatal("Lagging after Expect of a reached revision; want false")
	}
	p.Expect(12)
	p.Expect(15)
	clock.Advance(20 * time.Millisecond)
	if p.Lagging(20 * time.Millisecond) {
		t.Fatal("Lagging(20ms) 20 ms behind revision 15; want false")
	}
	clock.Advance(time.Millisecond)
	if !p.Lagging(20 * time.Millisecond) {
		t.Fatal("Lagging(20ms) 21 ms behind revision 15; want true")
	}
	p.Advance(13) // moved, still behind
	if p.Lagging(20 * time.Millisecond) {
		t.Fatal("Lagging(20ms) right after the watch moved; want false")
	}
	clock.Advance(21 * time.Millisecond)
	if !p.Lagging(20 * time.Millisecond) {
		t.Fatal("Lagging(20ms) 21 ms after the watch last moved, behind 15; want true")
	}
	p.Advance(15)
	if p.Lagging(0) {
		t.Fatal("Lagging after reaching every expected revision; want false")
	}
}

// A Fire of the context's Restarts ends a watch session, and the next starts at once,
// without the backoff that follows a session that failed.
func TestLoopRestarts(t *testing.T) {
	r := NewRestarts()
	ctx, cancel := context.WithCancel(WithRestarts(context.Background(), r))
	defer cancel()
	started := make(chan time.Time, 10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Loop(ctx, slog.New(slog.DiscardHandler), "test watch", time.Minute, func(ctx context.Context) error {
			started <- time.Now()
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	<-started
	// Without the restarts, the three sessions would follow backoffs of 100, 200 and
	// 400 ms.
	begin := time.Now()
	for i := range 3 {
		r.Fire()
		select {
		case <-started:
		case <-time.After(5 * time.Second):
			t.Fatalf("restart %d: no new session 5 s after the Fire", i)
		}
	}
	if d := time.Since(begin); d > 300*time.Millisecond {
		t.Errorf("three restarts took %v; want them at once, without backoff", d)
	}
	cancel()
	<-done
}
