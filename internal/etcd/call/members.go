package call

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// How often each member is probed, and how long a probe may take before the member
// counts as stalled. A stalled member (a paused process, a blackholed network) keeps its
// connections open: the client's keepalive would notice it only after 10 s + 5 s.
const (
	probeInterval = 250 * time.Millisecond
	probeTimeout  = 400 * time.Millisecond
)

// Members keeps an etcd client's endpoints to the members that answer. Every 250 ms
// it reads one key from each member through a client of that member alone (a
// serializable read, which the member answers by itself), takes a member that does not
// answer within 400 ms out of the client's endpoints, so that new calls go to the
// others at once, and puts it back once it answers again. It never takes out the last
// one: when no member answers, all stay.
type Members struct {
	// OnLeftOut, when set before Run, is called when a member has missed three probes
	// in a row (about a second): the watches it serves stay silent and are better
	// opened anew (watch.Restarts).
	OnLeftOut func()

	cli    *clientv3.Client
	key    string
	all    []string
	probes []*clientv3.Client // by the index of all
	log    *slog.Logger
}

// NewMembers returns a Members for cli over endpoints; dial makes the client of one
// member (with cli's TLS settings). key is read by the probes (its value is not used).
func NewMembers(cli *clientv3.Client, endpoints []string, key string, log *slog.Logger,
	dial func(endpoint string) (*clientv3.Client, error)) (*Members, error) {
	m := &Members{cli: cli, key: key, all: slices.Clone(endpoints), log: log}
	for _, ep := range endpoints {
		c, err := dial(ep)
		if err != nil {
			m.Close()
			return nil, err
		}
		m.probes = append(m.probes, c)
	}
	return m, nil
}

// restartAfter is how many probes in a row a member must miss before OnLeftOut is
// called: leaving a member out of the endpoints is cheap, opening every watch anew
// (a list of what it watches) is not, and one slow probe on a busy machine should not
// cost it.
const restartAfter = 3

// Run probes the members until ctx ends.
func (m *Members) Run(ctx context.Context) {
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	current := m.all
	missed := make([]int, len(m.all)) // probes missed in a row, by the index of all
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		answered := m.probe(ctx)
		if ctx.Err() != nil {
			return
		}
		var want, stalled []string
		restart := false
		for i, ep := range m.all {
			if answered[i] {
				missed[i] = 0
				want = append(want, ep)
				continue
			}
			missed[i]++
			restart = restart || missed[i] == restartAfter
			stalled = append(stalled, ep)
		}
		if len(want) == 0 {
			want, restart = m.all, false
		}
		if !slices.Equal(want, current) {
			m.log.Warn("etcd endpoints changed: members that do not answer are left out", "endpoints", want,
				"stalled", stalled)
			m.cli.SetEndpoints(want...)
			current = want
		}
		if restart && m.OnLeftOut != nil {
			m.OnLeftOut()
		}
	}
}

// probe reads the key from every member at once and reports, by the index of m.all,
// which answered.
func (m *Members) probe(ctx context.Context) []bool {
	answered := make([]bool, len(m.all))
	var wg sync.WaitGroup
	for i, c := range m.probes {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, probeTimeout)
			defer cancel()
			_, err := c.Get(pctx, m.key, clientv3.WithSerializable(), clientv3.WithCountOnly())
			answered[i] = err == nil
		})
	}
	wg.Wait()
	return answered
}

// Close closes the members' clients.
func (m *Members) Close() {
	for _, c := range m.probes {
		c.Close()
	}
}
