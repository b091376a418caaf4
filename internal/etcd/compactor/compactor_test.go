package compactor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

const testKey = "/allocd" + KeyName

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newCompactor(t *testing.T, cli *clientv3.Client, interval time.Duration) *Compactor {
	t.Helper()
	c, err := New(cli,
		Config{Key: testKey, Interval: interval, Logger: quiet, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// put writes a key and returns the revision.
func put(t *testing.T, cli *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := cli.Put(etcdtest.Context(t), key, "v")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// compacted reports whether rev is compacted away.
func compacted(t *testing.T, cli *clientv3.Client, rev int64) bool {
	t.Helper()
	_, err := cli.Get(etcdtest.Context(t), "k", clientv3.WithRev(rev))
	if err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("Get at %d: %v", rev, err)
	}
	return err != nil
}

// TestRunOnceTakesTurns walks kube-apiserver's algorithm step by step with three
// replicas: the first step of each only records; one replica wins each round and
// compacts the revision of its previous step, the others stand by; when the winner
// stops, a standby takes over and compacts what it recorded.
func TestRunOnceTakesTurns(t *testing.T) {
	e := etcdtest.New(t)
	cs := []*Compactor{newCompactor(t, e.Client, time.Hour), newCompactor(t, e.NewClient(), time.Hour),
		newCompactor(t, e.NewClient(), time.Hour)}
	ctx := etcdtest.Context(t)
	steps := []struct {
		replica   int
		compacts  bool // compacts the revision recorded at its previous step
		standsBy  bool
		firstStep bool
	}{
		{replica: 0, firstStep: true},
		{replica: 1, standsBy: true},
		{replica: 2, standsBy: true},
		{replica: 0, compacts: true},
		{replica: 1, standsBy: true}, // it saw version 1; the key is at 2
		{replica: 2, standsBy: true},
		// replica 0 stops: replica 1 saw version 2, which the key still has.
		{replica: 1, compacts: true},
		{replica: 2, standsBy: true},
		{replica: 1, compacts: true},
	}
	for i, s := range steps {
		put(t, e.Client, "k") // something to compact
		c := cs[s.replica]
		recorded := c.rev
		got, err := c.RunOnce(ctx)
		if err != nil {
			t.Fatalf("step %d: replica %d RunOnce: %v", i, s.replica, err)
		}
		switch {
		case s.compacts:
			if got != recorded || got == 0 || !compacted(t, e.Client, got-1) || compacted(t, e.Client, got) {
				t.Errorf("step %d: replica %d RunOnce = %d; want it to compact %d, its "+
					"previous step's revision", i, s.replica, got, recorded)
			}
		case got != 0:
			t.Errorf("step %d: replica %d RunOnce = %d; want nothing compacted (first "+
				"step %v, standing by %v)", i, s.replica, got, s.firstStep, s.standsBy)
		}
		if c.rev == 0 {
			t.Errorf("step %d: replica %d recorded no revision", i, s.replica)
		}
	}
	resp, err := e.Client.Get(ctx, testKey)
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Version != 4 {
		t.Fatalf("compaction key = %v, %v; want version 4 (one record, three compactions)", resp, err)
	}
	if v, _ := strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64); !compacted(t, e.Client, v-1) {
		t.Errorf("compaction key value %d: want the revision compacted last", v)
	}
}

// TestRunCompactsOncePerInterval runs three replicas' compactors for ten intervals of a
// fake clock while keys are written: the first interval only records, then exactly one
// replica compacts per interval (not three), the revision it read an interval before:
// history older than one interval is compacted, younger history is kept.
func TestRunCompactsOncePerInterval(t *testing.T) {
	const interval = time.Minute
	clock := clockwork.NewFakeClock()
	e := etcdtest.New(t)
	ctx, cancel := context.WithCancel(etcdtest.Context(t))
	var cs []*Compactor
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for i := range 3 {
		cli := e.Client
		if i > 0 {
			cli = e.NewClient()
		}
		c, err := New(cli, Config{Key: testKey, Interval: interval, Logger: quiet,
			Registerer: prometheus.NewRegistry(), Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
		wg.Go(func() { c.Run(ctx) })
	}
	sum := func(results ...string) (n float64) {
		for _, c := range cs {
			for _, r := range results {
				n += counter(t, c.m.steps.WithLabelValues(r))
			}
		}
		return n
	}
	var revs []int64 // a revision written in each interval
	for i := 1; i <= 10; i++ {
		if err := clock.BlockUntilContext(ctx, 3); err != nil { // the three timers
			t.Fatal(err)
		}
		revs = append(revs, put(t, e.Client, "k"))
		clock.Advance(interval)
		etcdtest.WaitFor(t, 10*time.Second, fmt.Sprintf("interval %d's three steps", i), func() bool {
			return sum("recorded", "other_replica", "compacted", "failed") == float64(3*i)
		})
		if got := sum("compacted"); got != float64(i-1) {
			t.Fatalf("%.0f compactions by 3 replicas after %d intervals; want %d, one per interval after "+
				"the first", got, i, i-1)
		}
	}
	if old := revs[len(revs)-2]; !compacted(t, e.Client, old) {
		t.Errorf("revision %d, written an interval before the last step, is not compacted", old)
	}
	if recent := revs[len(revs)-1]; compacted(t, e.Client, recent) {
		t.Errorf("revision %d, written in the last interval, is compacted; want one interval kept", recent)
	}
}

// TestHurry: a hurried step compacts the revision asked for, still through the
// compaction key, even as the replica's first step; a step of another replica in
// between does not stop it.
func TestHurry(t *testing.T) {
	e := etcdtest.New(t)
	c := newCompactor(t, e.Client, time.Hour)
	ctx, cancel := context.WithCancel(etcdtest.Context(t))
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()

	for i, other := range []bool{false, true} {
		if other {
			// Another replica steps twice: the key's version is not the one c saw.
			o := newCompactor(t, e.NewClient(), time.Hour)
			for range 2 {
				if _, err := o.RunOnce(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		put(t, e.Client, "k")
		rev := put(t, e.Client, "k")
		put(t, e.Client, "k")
		c.Hurry(rev)
		etcdtest.WaitFor(t, 5*time.Second, "a hurried compaction", func() bool {
			return counter(t, c.m.steps.WithLabelValues("compacted")) == float64(i+1)
		})
		if !compacted(t, e.Client, rev-1) || compacted(t, e.Client, rev) {
			t.Errorf("after Hurry(%d) (another replica stepped: %v): want revisions before %d "+
				"compacted and %d kept", rev, other, rev, rev)
		}
	}
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// TestCompactedRevisionOnlyRises: the gauge of the compacted revision learns another
// replica's compaction from the compaction key; a hurried step to an older revision,
// which etcd answers ErrCompacted, does not take it back.
func TestCompactedRevisionOnlyRises(t *testing.T) {
	e := etcdtest.New(t)
	c := newCompactor(t, e.Client, time.Hour)
	o := newCompactor(t, e.NewClient(), time.Hour)
	ctx := etcdtest.Context(t)
	old := put(t, e.Client, "k")
	var byOther int64
	for range 2 { // o records, then compacts what it recorded
		put(t, e.Client, "k")
		var err error
		if byOther, err = o.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if byOther <= old {
		t.Fatalf("the other replica compacted %d; want past %d", byOther, old)
	}
	if got, err := c.step(ctx, old); err != nil || got != old {
		t.Fatalf("hurried step to %d = %d, %v; want it done (ErrCompacted)", old, got, err)
	}
	if got := gaugeValue(t, c.m.compacted); got != float64(byOther) {
		t.Errorf("allocd_etcd_compacted_revision = %v; want %d, the other replica's, not the older %d", got,
			byOther, old)
	}
}
