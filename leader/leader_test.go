package leader_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/testing/etcdtest"
	"github.com/allocd/allocd/leader"
)

const prefix = "/allocd/repair/leader"

// replica is one Elector running two controllers' Lead functions that record their
// terms.
type replica struct {
	el    *leader.Elector
	stop  func()
	mu    sync.Mutex
	terms []leader.Fence // fences of the terms both controllers ran
	fail  chan struct{}  // the second controller fails its term when this is sent to
}

func start(t *testing.T, e *etcdtest.Server, id string) *replica {
	t.Helper()
	return startWith(t, e.Client, id, time.Second)
}

// startWith starts a replica on cli with an election lease of ttl.
func startWith(t *testing.T, cli *clientv3.Client, id string, ttl time.Duration) *replica {
	t.Helper()
	el, err := leader.New(cli, leader.Config{Prefix: prefix, Identity: id, SessionTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{el: el, fail: make(chan struct{})}
	first := func(ctx context.Context, f leader.Fence) error {
		r.mu.Lock()
		r.terms = append(r.terms, f)
		r.mu.Unlock()
		<-ctx.Done()
		return nil
	}
	second := func(ctx context.Context, f leader.Fence) error {
		select {
		case <-ctx.Done():
			return nil
		case <-r.fail:
			return errors.New("planted failure")
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- el.Run(ctx, first, second) }()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run() = %v; want nil when ctx ends", err)
			}
		})
	}
	t.Cleanup(r.stop)
	return r
}

func (r *replica) fences() []leader.Fence {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]leader.Fence(nil), r.terms...)
}

// TestElection: one of two replicas leads and runs every controller's term; both name
// it; when it stops, the other leads with a new fence, and the old fence no longer
// holds in a transaction; a controller that fails ends the term for all, and the
// replica campaigns again.
func TestElection(t *testing.T) {
	e := etcdtest.New(t)
	a := start(t, e, "10.0.0.1:8080")
	etcdtest.WaitFor(t, 10*time.Second, "a to lead", a.el.IsLeader)
	b := start(t, e, "10.0.0.2:8080")
	ctx := etcdtest.Context(t)
	for _, r := range []*replica{a, b} {
		id, self, err := r.el.Leader(ctx)
		if err != nil || id != "10.0.0.1:8080" || self != (r == a) {
			t.Errorf("%s Leader() = %q, %v, %v; want 10.0.0.1:8080, %v, nil", r.el.Identity(), id, self, err,
				r == a)
		}
	}
	if b.el.IsLeader() || len(b.fences()) != 0 {
		t.Fatalf("b leads while a does")
	}
	old := a.fences()[0]
	if !old.Valid() || !fenceHolds(t, e.Client, old) {
		t.Fatalf("fence %v of the running term does not hold", old)
	}

	a.stop() // resigns
	etcdtest.WaitFor(t, 10*time.Second, "b to lead", b.el.IsLeader)
	if fenceHolds(t, e.Client, old) {
		t.Errorf("the fence %v of a's ended term still holds", old)
	}
	cur := b.fences()[0]
	if cur == old || !fenceHolds(t, e.Client, cur) {
		t.Errorf("b's fence %v: want a new one that holds (a's was %v)", cur, old)
	}

	b.fail <- struct{}{}
	etcdtest.WaitFor(t, 10*time.Second, "b to lead a second term after its controller failed", func() bool {
		return len(b.fences()) == 2 && b.el.IsLeader()
	})
	if fs := b.fences(); fenceHolds(t, e.Client, fs[0]) || !fenceHolds(t, e.Client, fs[1]) {
		t.Errorf("after the failed term, fences %v: want only the last to hold", fs)
	}
}

// fenceHolds runs a transaction fenced by f and reports whether it succeeded; when it
// did not, Held must agree.
func fenceHolds(t *testing.T, cli *clientv3.Client, f leader.Fence) bool {
	t.Helper()
	resp, err := cli.Txn(etcdtest.Context(t)).If(f.Cmp()).Then(clientv3.OpPut("/fenced", f.String())).
		Else(f.Get()).Commit()
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Succeeded && f.Held(resp, 0) {
		t.Errorf("Held(%v) = true for a transaction its fence failed", f)
	}
	return resp.Succeeded
}

func TestNewRefusesBadConfig(t *testing.T) {
	e := etcdtest.New(t)
	for _, cfg := range []leader.Config{
		{Identity: "x"},
		{Prefix: prefix},
		{Prefix: prefix, Identity: "x", SessionTTL: -time.Second},
	} {
		if _, err := leader.New(e.Client, cfg); err == nil {
			t.Errorf("New(%+v) = nil error; want one", cfg)
		}
	}
	if _, err := leader.New(nil, leader.Config{Prefix: prefix, Identity: "x"}); err == nil {
		t.Error("New(nil client) = nil error; want one")
	}
}
