package fault

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// leaseTTL is the TTL of the master leases the suite renews.
const leaseTTL = 3 * time.Second

// leasePrefix is where the replicas (default flags) keep the master leases.
const leasePrefix = "/allocd/masterleases/"

// leases renews master leases as API servers do (every TTL/3, through any replica),
// leaves one unrenewed after its first renewal, and lists them every 250 ms. It also
// records what etcd does to their keys and every state of the kubernetes Service's
// stored Endpoints, each through three watches at once (one per etcd member, one per
// replica), each event at the first time one of them brought it: a fault stalls one
// watch at a time.
type leases struct {
	renewed   []string // renewed until the end
	abandoned string   // renewed once, then never
	mu        sync.Mutex
	renews    []op
	lists     []leaseList
	keys      map[keyRev]keyEvent // the lease keys' writes and deletes
	eps       map[int64]epsState  // default/kubernetes's stored Endpoints, by revision
}

type keyRev struct {
	key string
	rev int64
}

type leaseList struct {
	start, end time.Duration
	ips        []string
}

// keyEvent is a write or delete of a lease key.
type keyEvent struct {
	at  time.Duration
	rev int64
	ip  string
	del bool
}

// epsState is a state of default/kubernetes's Endpoints: the addresses, from at until
// the next state.
type epsState struct {
	at  time.Duration
	rev int64
	ips []string
}

// run renews, lists and watches until ctx ends; members are the etcd members' client
// URLs.
func (l *leases) run(ctx context.Context, h *history, clients []*client.Client, members []string) {
	l.mu.Lock()
	l.keys, l.eps = map[keyRev]keyEvent{}, map[int64]epsState{}
	l.mu.Unlock()
	var wg sync.WaitGroup
	for _, ip := range l.renewed {
		wg.Go(func() { l.renew(ctx, h, clients, ip, false) })
	}
	wg.Go(func() { l.renew(ctx, h, clients, l.abandoned, true) })
	wg.Go(func() { l.list(ctx, h, clients) })
	for _, m := range members {
		wg.Go(func() { l.watchKeys(ctx, h, m) })
	}
	for _, c := range clients {
		wg.Go(func() { l.watchEndpoints(ctx, h, c) })
	}
	wg.Wait()
}

// renew renews ip every TTL/3 through a replica picked at random, until ctx ends or,
// with once, until a renewal succeeded.
func (l *leases) renew(ctx context.Context, h *history, clients []*client.Client, ip string, once bool) {
	r := rand.New(rand.NewPCG(uint64(len(ip)), uint64(time.Now().UnixNano())))
	for {
		rep := r.IntN(len(clients))
		cctx, cancel := context.WithTimeout(ctx, leaseTTL/3)
		o := h.record(op{kind: opRenew, owner: ip, replica: rep}, func() ([]string, error) {
			_, err := clients[rep].Renew(cctx,
				&allocdv1.RenewRequest{Ip: ip, TtlSeconds: int64(leaseTTL / time.Second)})
			return nil, err
		})
		cancel()
		l.mu.Lock()
		l.renews = append(l.renews, o)
		l.mu.Unlock()
		if once && o.outcome == ok || ctx.Err() != nil {
			return
		}
		wait := leaseTTL/3 - (o.end - o.start)
		if once {
			wait = 100 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(wait, 0)):
		}
	}
}

// list lists the leases every 250 ms through a replica picked at random.
func (l *leases) list(ctx context.Context, h *history, clients []*client.Client) {
	for ctx.Err() == nil {
		c := clients[rand.IntN(len(clients))]
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		start := h.now()
		resp, err := c.ListLeases(cctx)
		end := h.now()
		cancel()
		if err == nil {
			var ips []string
			for _, ls := range resp.GetLeases() {
				ips = append(ips, ls.GetIp())
			}
			l.mu.Lock()
			l.lists = append(l.lists, leaseList{start, end, ips})
			l.mu.Unlock()
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// watchKeys records the writes and deletes of the lease keys through the etcd member
// at url (its own client) until ctx ends; an event that another watch brought first
// keeps that one's time.
func (l *leases) watchKeys(ctx context.Context, h *history, url string) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second,
		Logger: zap.NewNop()})
	if err != nil {
		return
	}
	defer cli.Close()
	var rev int64
	for ctx.Err() == nil {
		opts := []clientv3.OpOption{clientv3.WithPrefix()}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev+1))
		}
		for resp := range cli.Watch(clientv3.WithRequireLeader(ctx), leasePrefix, opts...) {
			at := h.now()
			l.mu.Lock()
			for _, ev := range resp.Events {
				k := keyRev{string(ev.Kv.Key), ev.Kv.ModRevision}
				if _, seen := l.keys[k]; !seen {
					l.keys[k] = keyEvent{at: at, rev: ev.Kv.ModRevision,
						ip: strings.TrimPrefix(k.key, leasePrefix), del: ev.Type == mvccpb.DELETE}
				}
				rev = ev.Kv.ModRevision
			}
			l.mu.Unlock()
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// watchEndpoints records every state of default/kubernetes's stored Endpoints through
// c until ctx ends; a state that another watch brought first keeps that one's time.
func (l *leases) watchEndpoints(ctx context.Context, h *history, c *client.Client) {
	var rev int64
	for ctx.Err() == nil {
		req := &allocdv1.WatchServiceEndpointsRequest{Namespace: "default", StartRevision: rev}
		err := c.WatchServiceEndpoints(ctx, req, func(ev *allocdv1.WatchServiceEndpointsResponse) error {
			at := h.now()
			rev = ev.GetRevision()
			e := ev.GetEndpoints()
			if e.GetName() != "kubernetes" {
				return nil
			}
			var ips []string
			if ev.GetType() != allocdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED {
				for _, s := range e.GetSubsets() {
					for _, a := range s.GetAddresses() {
						ips = append(ips, a.GetIp())
					}
				}
			}
			l.mu.Lock()
			if _, seen := l.eps[rev]; !seen {
				l.eps[rev] = epsState{at: at, rev: rev, ips: ips}
			}
			l.mu.Unlock()
			return nil
		})
		if errors.Is(err, client.ErrCompacted) {
			rev = 0 // resumed too late: start over from the current state
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Checks of the master leases, over what run recorded (times on the history's clock):
//
//   - lists: a lease renewed by a Renew that completed before a list began is in that
//     list when the list ended less than TTL - 1 s after the Renew started (1 s for
//     etcd's whole-second TTLs);
//   - keys: when etcd deletes the key of a lease renewed in time (its last
//     acknowledged renewal started less than TTL - 1 s before: an etcd leader that
//     was stopped revokes by its own clock when it resumes), the key is written again
//     within one renew interval, TTL/3;
//   - endpoints: default/kubernetes's stored Endpoints never lack the address of a
//     lease renewed in time for longer than one renew interval;
//   - the abandoned lease is in no list that began TTL + 2 s after its last
//     acknowledged renewal. etcd's new leader extends every lease by its TTL
//     (lessor.Promote), so that deadline counts from the end of the last fault that
//     may have changed the etcd leader (a kill or pause of a member) while the lease
//     was alive.
//
// check returns the violations and a report: every delete of a renewed lease's key
// and every Endpoints state without a renewed address, with the renewals around them.
func (l *leases) check(faults []window) (out []violation, report []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := slices.SortedFunc(maps.Values(l.keys),
		func(a, b keyEvent) int { return cmp.Compare(a.rev, b.rev) })
	eps := slices.SortedFunc(maps.Values(l.eps),
		func(a, b epsState) int { return cmp.Compare(a.rev, b.rev) })
	out = append(out, l.checkLists()...)
	kv, kr := l.checkKeys(keys, faults)
	ev, er := l.checkEndpoints(eps)
	out = append(append(append(out, kv...), ev...), l.checkAbandoned(faults)...)
	report = append(append(report, kr...), er...)
	report = append(report, fmt.Sprintf("master leases: %d renewed every TTL/3 (TTL %v), 1 abandoned; "+
		"%d lists, %d key events, %d states of default/kubernetes checked; %d violations",
		len(l.renewed), leaseTTL, len(l.lists), len(l.keys), len(l.eps), len(out)))
	return out, report
}

// lastAck returns the last acknowledged renewal of ip that ended before at.
func (l *leases) lastAck(ip string, at time.Duration) (op, bool) {
	var last op
	found := false
	for _, r := range l.renews {
		if r.owner == ip && r.outcome == ok && r.end < at && (!found || r.start > last.start) {
			last, found = r, true
		}
	}
	return last, found
}

// inTime returns the last acknowledged renewal of ip that ended before at, and
// whether at is less than TTL - 1 s after it started.
func (l *leases) inTime(ip string, at time.Duration) (op, bool) {
	r, found := l.lastAck(ip, at)
	return r, found && at < r.start+leaseTTL-time.Second
}

// renewalGap describes how far r started from the acknowledged renewal of ip before
// it.
func (l *leases) renewalGap(ip string, r op) string {
	prev, found := l.lastAck(ip, r.start)
	if !found {
		return "its first acknowledged renewal"
	}
	gap := r.start - prev.start
	verdict := "in time"
	if gap >= leaseTTL {
		verdict = fmt.Sprintf("late by %v", (gap - leaseTTL).Round(time.Millisecond))
	}
	return fmt.Sprintf("the acknowledged renewal before it started %v earlier (%s)",
		gap.Round(time.Millisecond), verdict)
}

func (l *leases) checkLists() (out []violation) {
	for i, ls := range l.lists {
		for _, ip := range l.renewed {
			r, in := l.inTime(ip, ls.start)
			if !in || ls.end >= r.start+leaseTTL-time.Second || slices.Contains(ls.ips, ip) {
				continue
			}
			back := "never listed again"
			for _, next := range l.lists[i+1:] {
				if slices.Contains(next.ips, ip) {
					back = fmt.Sprintf("listed again at %v", next.start)
					break
				}
			}
			out = append(out, violation(fmt.Sprintf(
				"master lease %s missing from a list at %v-%v, renewed at %v-%v with TTL %v; %s; %s",
				ip, ls.start, ls.end, r.start, r.end, leaseTTL, l.renewalGap(ip, r), back)))
		}
	}
	return out
}

// checkKeys: every delete of a renewed lease's key while it was renewed in time is
// followed by a write within TTL/3.
func (l *leases) checkKeys(keys []keyEvent, faults []window) (out []violation, report []string) {
	for i, k := range keys {
		if !k.del || !slices.Contains(l.renewed, k.ip) {
			continue
		}
		back := time.Duration(-1)
		for _, n := range keys[i+1:] {
			if n.ip == k.ip && !n.del {
				back = n.at - k.at
				break
			}
		}
		r, in := l.inTime(k.ip, k.at)
		var fs []string
		for _, f := range faults {
			if f.etcdLeader && f.start < k.at && k.at < f.end+leaseTTL {
				fs = append(fs, fmt.Sprintf("%s at %v-%v", f.name, f.start, f.end))
			}
		}
		renewed := "not renewed in time"
		if in {
			renewed = "renewed in time"
		}
		what := fmt.Sprintf("etcd deleted the key of master lease %s at %v, %s: %v after its last "+
			"acknowledged renewal began (%s); written again after %v; etcd leader faults before it: %v",
			k.ip, k.at, renewed, (k.at - r.start).Round(time.Millisecond), l.renewalGap(k.ip, r),
			back.Round(time.Millisecond), fs)
		report = append(report, what)
		if in && (back < 0 || back > leaseTTL/3) {
			out = append(out, violation(what+fmt.Sprintf("; want written again within %v", leaseTTL/3)))
		}
	}
	return out, report
}

// checkEndpoints: default/kubernetes never lacks a renewed-in-time address for longer
// than TTL/3; every state that lacks one is reported.
func (l *leases) checkEndpoints(eps []epsState) (out []violation, report []string) {
	for i, e := range eps {
		for _, ip := range l.renewed {
			r, in := l.inTime(ip, e.at)
			if !in || slices.Contains(e.ips, ip) {
				continue
			}
			until := time.Duration(-1)
			for _, n := range eps[i+1:] {
				if slices.Contains(n.ips, ip) {
					until = n.at
					break
				}
			}
			what := fmt.Sprintf("default/kubernetes's Endpoints without %s at %v (addresses %v), renewed at "+
				"%v-%v; back at %v", ip, e.at, e.ips, r.start, r.end, until)
			report = append(report, what)
			if until < 0 || until-e.at > leaseTTL/3 {
				out = append(out, violation(what+fmt.Sprintf("; want back within %v", leaseTTL/3)))
			}
		}
	}
	return out, report
}

func (l *leases) checkAbandoned(faults []window) (out []violation) {
	var last time.Duration
	found := false
	for _, r := range l.renews {
		if r.owner == l.abandoned && r.outcome == ok && r.end > last {
			last, found = r.end, true
		}
	}
	if !found {
		return nil
	}
	from := last
	for _, f := range faults {
		if f.etcdLeader && f.start < from+leaseTTL+2*time.Second && f.end > from {
			from = max(from, f.end)
		}
	}
	for _, ls := range l.lists {
		if ls.start > from+leaseTTL+2*time.Second && slices.Contains(ls.ips, l.abandoned) {
			out = append(out, violation(fmt.Sprintf(
				"master lease %s, last renewed at %v, still listed at %v", l.abandoned, last, ls.start)))
		}
	}
	return out
}
