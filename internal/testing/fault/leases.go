package fault

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// leaseTTL is the TTL of the master leases the suite renews.
const leaseTTL = 3 * time.Second

// leases renews master leases as API servers do (every TTL/3, through any replica),
// leaves one unrenewed after its first renewal, and lists them every 250 ms.
type leases struct {
	renewed   []string // renewed until the end
	abandoned string   // renewed once, then never
	mu        sync.Mutex
	renews    []op
	lists     []leaseList
}

type leaseList struct {
	start, end time.Duration
	ips        []string
}

func (l *leases) run(ctx context.Context, h *history, clients []*client.Client) {
	var wg sync.WaitGroup
	renew := func(ip string, once bool) {
		defer wg.Done()
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
	for _, ip := range l.renewed {
		wg.Add(1)
		go renew(ip, false)
	}
	wg.Add(1)
	go renew(l.abandoned, true)
	wg.Add(1)
	go func() {
		defer wg.Done()
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
	}()
	wg.Wait()
}

// check: a lease renewed by a Renew that completed before a list began is in that
// list when the list ended less than TTL - 1 s after the Renew started (1 s for etcd's
// whole-second TTLs); the abandoned lease is in no list that began TTL + 2 s after its
// last acknowledged renewal.
//
// etcd's new leader extends every lease by its TTL (lessor.Promote), so the abandoned
// lease's deadline counts from the end of the last fault that may have changed the
// etcd leader (a kill or pause of a member) while the lease was alive.
func (l *leases) check(faults []window) (out []violation, lists int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lastOK := map[string]time.Duration{}
	for _, ls := range l.lists {
		for _, ip := range l.renewed {
			for _, r := range l.renews {
				if r.owner == ip && r.outcome == ok && r.end < ls.start &&
					ls.end < r.start+leaseTTL-time.Second && !slices.Contains(ls.ips, ip) {
					out = append(out, violation(fmt.Sprintf(
						"master lease %s missing from a list at %v-%v, renewed at %v-%v with TTL %v",
						ip, ls.start, ls.end, r.start, r.end, leaseTTL)))
					break
				}
			}
		}
	}
	for _, r := range l.renews {
		if r.outcome == ok && r.end > lastOK[r.owner] {
			lastOK[r.owner] = r.end
		}
	}
	if last, ok := lastOK[l.abandoned]; ok {
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
	}
	return out, len(l.lists)
}
