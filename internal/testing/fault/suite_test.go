package fault

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// suiteDuration is how long operations run: ALLOCD_FAULT_DURATION (make fault: 5m), or
// 15 s.
func suiteDuration(t *testing.T) time.Duration {
	if v := os.Getenv("ALLOCD_FAULT_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("ALLOCD_FAULT_DURATION=%q: %v", v, err)
		}
		return d
	}
	return 15 * time.Second
}

// faultNames are the kinds of fault, in injectFaults' order.
var faultNames = []string{"leader-kill", "allocd-kill", "pause", "partition", "delay"}

// faultKinds are the kinds of fault to inject: ALLOCD_FAULT_KINDS, a comma-separated
// list of faultNames (to measure one kind), or all of them.
func faultKinds(t *testing.T) []int {
	v := os.Getenv("ALLOCD_FAULT_KINDS")
	if v == "" {
		return []int{0, 1, 2, 3, 4}
	}
	var out []int
	for _, name := range strings.Split(v, ",") {
		i := slices.Index(faultNames, strings.TrimSpace(name))
		if i < 0 {
			t.Fatalf("ALLOCD_FAULT_KINDS: unknown kind %q; kinds are %s", name,
				strings.Join(faultNames, ", "))
		}
		out = append(out, i)
	}
	return out
}

// pauseFor is how long a member stays stopped: ALLOCD_FAULT_PAUSE (make fault: 5s), or
// 2 s.
func pauseFor() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("ALLOCD_FAULT_PAUSE")); err == nil && d > 0 {
		return d
	}
	return 2 * time.Second
}

// TestFaultSuite: 3 etcd members and 3 allocd replicas as processes; clients allocate
// and release on a /25 and 200 node ports against every replica while etcd leaders
// and allocd replicas are killed and restarted, etcd members paused, and the network
// between a replica and etcd partitioned or slowed; then the history and the final
// state are checked. make test runs it for 15 s, make fault for 5 minutes.
func TestFaultSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("the fault suite runs processes for 15 s or more")
	}
	dur := suiteDuration(t)
	tp := startTopology(t, "10.0.0.0/25", "30000-30199")
	clients := make([]*client.Client, len(tp.grpc))
	for i, addr := range tp.grpc {
		c, err := client.New(addr, client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		clients[i] = c
	}
	for i, c := range clients {
		etcdtest.WaitFor(t, 60*time.Second, fmt.Sprintf("allocd-%d to serve", i), func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := c.ListRanges(ctx)
			return err == nil
		})
	}

	h := &history{base: time.Now()}
	ctx, stop := context.WithTimeout(context.Background(), dur)
	defer stop()
	var wg sync.WaitGroup
	var seq atomic.Int64
	const workers = 24
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			worker(ctx, h, clients, w, &seq)
		}()
	}
	var races atomic.Int64
	for w := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			racer(ctx, h, clients, w, &seq, &races)
		}()
	}
	var transferRaces atomic.Int64
	for w := range transferRacers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			transferRacer(ctx, h, clients, w, &seq, &transferRaces)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		lister(ctx, h, clients)
	}()
	ls := &leases{renewed: []string{"192.0.2.1", "192.0.2.2"}, abandoned: "192.0.2.9"}
	wg.Add(1)
	go func() {
		defer wg.Done()
		ls.run(ctx, h, clients, tp.etcdURL)
	}()
	// Pod events through a Feeder on its own client (retrying, as a shim's would).
	feedCli, err := client.New(tp.grpc[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { feedCli.Close() })
	pf := newPods()
	pf.h = h
	var epDeleted atomic.Int64
	podCtx, stopPods := context.WithCancel(context.Background())
	defer stopPods()
	// The events stop with the operations; the Feeder and the watch go on until the
	// check is over.
	go pf.run(ctx, podCtx, feedCli, clients[1], &epDeleted)
	var faults []window
	var recoveries []time.Duration
	wg.Add(1)
	go func() {
		defer wg.Done()
		faults, recoveries = injectFaults(ctx, t, tp, h)
	}()
	wg.Wait()

	// Heal: every process up, every proxy open, then read the final state.
	for _, p := range append(append([]*proc{}, tp.etcd...), tp.allocd...) {
		p.signal(syscall.SIGCONT)
	}
	final := map[string]string{}
	etcdtest.WaitFor(t, 60*time.Second, "the final state", func() bool {
		f, err := listAll(clients[0])
		if err != nil {
			return false
		}
		final = f
		return true
	})
	viol := h.check(final)
	viol = append(viol, checkRecords(t, tp)...)
	c := h.checker()
	_, fullReleases := c.afterFullRelease(final)
	_, pairs := c.atomic()
	t.Logf("full releases checked (nothing held after an acknowledged full release, or a Transfer of "+
		"everything, with no later Allocate): %d owners; named Releases raced against Allocates of the "+
		"same address: %d rounds; Transfers raced against each other, a Release and an Allocate of the "+
		"item: %d rounds", fullReleases, races.Load(), transferRaces.Load())
	t.Logf("transfer atomicity: %d Transfers acknowledged at a revision, %d owner-prefix listings, "+
		"%d (Transfer, listing) pairs checked", c.transfersAt(), len(c.snaps), pairs)
	converged := false
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		converged = pf.converged(cctx, clients[2])
		cancel()
		if converged {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !converged {
		viol = append(viol,
			"shop/web's Endpoints did not converge on the last Pod states within 60 s of the end")
		pf.mu.Lock()
		t.Logf("the Feeder's last errors:\n%s", strings.Join(pf.errs, "\n"))
		pf.mu.Unlock()
		for i, c := range clients {
			cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			st, err := c.GetRepairStatus(cctx)
			cancel()
			t.Logf("allocd-%d (%s): repair status %v, %v", i, tp.grpc[i], st, err)
		}
	}
	if n := epDeleted.Load(); n > 0 {
		viol = append(viol,
			violation(fmt.Sprintf("shop/web's Endpoints were deleted %d times; its Service never was", n)))
	}
	t.Logf("Pod events: %d readiness flips fed; Endpoints converged: %v; deleted: %d", pf.sent.Load(),
		converged, epDeleted.Load())
	lv, lreport := ls.check(faults)
	viol = append(viol, lv...)
	for _, line := range lreport {
		t.Log(line)
	}
	lstart := time.Now()
	illegal, undecided, checked := h.linearizable(final, 2*time.Second, time.Minute)
	for _, it := range illegal {
		viol = append(viol, violation(
			fmt.Sprintf("%s: no linearization of its allocation register explains the history", it)))
	}
	t.Logf("porcupine: %d item registers checked in %v, %d not linearizable, %d undecided "+
		"(2 s each, 1 min in all)",
		checked, time.Since(lstart).Round(time.Millisecond), len(illegal), undecided)
	t.Logf("ran %v: %d faults\n%s", dur, len(faults), h.summary(faults))
	for _, f := range faults {
		t.Logf("fault %-28s %8v - %8v", f.name, f.start.Round(time.Millisecond),
			f.end.Round(time.Millisecond))
	}
	t.Logf("recovery after each fault (first ok operation after it ended): %s", pcts(recoveries))
	t.Logf("etcd election timeout %d ms; %s", electionMs(), h.stalls(faults, len(tp.grpc)))
	t.Logf("violations: %d", len(viol))
	for _, v := range viol {
		t.Error(v)
	}
	if t.Failed() || os.Getenv("ALLOCD_FAULT_VERBOSE") != "" {
		keep := filepath.Join(os.TempDir(), fmt.Sprintf("allocd-fault-%d", time.Now().Unix()))
		if err := os.MkdirAll(keep, 0o755); err == nil {
			for _, p := range append(append([]*proc{}, tp.etcd...), tp.allocd...) {
				if b, err := os.ReadFile(p.logPath); err == nil {
					os.WriteFile(filepath.Join(keep, filepath.Base(p.logPath)), b, 0o644)
				}
			}
			t.Logf("the processes' logs are kept in %s", keep)
		}
	}
}

// held is an owner of a worker: its Allocate request (nil for an owner that only
// received items by Transfer) and the items it was given.
type held struct {
	uid string
	req *allocdv1.AllocateRequest
	got []string // the items of its first acknowledgement, and those transferred to it
}

// worker runs operations until ctx ends: dynamic and specific Allocates with and
// without node ports, retries of its earlier Allocates, Releases of its own owners,
// Transfers between its owners (and their retries) and forced Releases of any address.
func worker(ctx context.Context, h *history, clients []*client.Client, w int, seq *atomic.Int64) {
	r := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
	var mine []held
	for ctx.Err() == nil {
		rep := r.IntN(len(clients))
		c := clients[rep]
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		switch x := r.IntN(100); {
		case x < 45 || len(mine) == 0: // Allocate, a new owner
			uid := "w" + strconv.Itoa(w) + "-" + strconv.FormatInt(seq.Add(1), 10)
			req := &allocdv1.AllocateRequest{Owner: &allocdv1.Owner{Namespace: "fault", Name: uid, Uid: uid}}
			switch r.IntN(4) {
			case 0: // a specific address
				req.ClusterIps = []string{netip.AddrFrom4([4]byte{10, 0, 0, byte(2 + r.IntN(125))}).String()}
			case 1: // with a node port
				req.NodePortCount = 1
			case 2: // a specific node port, no address
				req.NoClusterIp, req.NodePorts = true, []int32{int32(30000 + r.IntN(200))}
			}
			asked := op{kind: opAllocate, owner: uid, replica: rep,
				items: itemsOf(req.ClusterIps, req.NodePorts)}
			o := h.record(asked, func() ([]string, error) {
				resp, err := c.Allocate(cctx, req)
				return itemsOf(resp.GetClusterIps(), resp.GetNodePorts()), err
			})
			if o.outcome != definite {
				mine = append(mine, held{uid: uid, req: req})
			}
			if o.outcome == ok {
				mine[len(mine)-1].got = o.items
			}
		case x < 57: // retry an earlier Allocate, same owner, same request
			hd := mine[r.IntN(len(mine))]
			if hd.req == nil {
				cancel()
				continue
			}
			h.record(op{kind: opRetry, owner: hd.uid, replica: rep}, func() ([]string, error) {
				resp, err := c.Allocate(cctx, hd.req)
				return itemsOf(resp.GetClusterIps(), resp.GetNodePorts()), err
			})
		case x < 70: // release one named item of an owner of this worker
			hd := mine[r.IntN(len(mine))]
			it := hd.got
			if len(it) == 0 {
				cancel()
				continue
			}
			req := &allocdv1.ReleaseRequest{Owner: &allocdv1.Owner{Namespace: "fault", Name: hd.uid,
				Uid: hd.uid}}
			if ip, err := netip.ParseAddr(it[0]); err == nil {
				req.ClusterIps = []string{ip.String()}
			} else {
				p, _ := strconv.Atoi(strings.TrimPrefix(it[0], "port/"))
				req.NodePorts = []int32{int32(p)}
			}
			h.recordRev(op{kind: opRelease, owner: hd.uid, replica: rep, items: it[:1]},
				func() ([]string, int64, error) {
					resp, err := c.Release(cctx, req)
					return nil, resp.GetRevision(), err
				})
		case x < 85: // release an owner of this worker, all of it
			i := r.IntN(len(mine))
			hd := mine[i]
			req := &allocdv1.ReleaseRequest{Owner: &allocdv1.Owner{Namespace: "fault", Name: hd.uid,
				Uid: hd.uid}}
			o := h.recordRev(op{kind: opRelease, owner: hd.uid, replica: rep},
				func() ([]string, int64, error) {
					resp, err := c.Release(cctx, req)
					return nil, resp.GetRevision(), err
				})
			if o.outcome == ok {
				mine = append(mine[:i], mine[i+1:]...)
			}
		case x < 95: // transfer an owner's items to another owner of this worker, or a new one
			mine = transfer(cctx, h, c, rep, r, mine, func() string {
				return "w" + strconv.Itoa(w) + "-" + strconv.FormatInt(seq.Add(1), 10)
			})
		default: // force-release any address
			ip := netip.AddrFrom4([4]byte{10, 0, 0, byte(2 + r.IntN(125))}).String()
			h.recordRev(op{kind: opForce, owner: "", replica: rep, items: []string{ip}},
				func() ([]string, int64, error) {
					req := &allocdv1.ReleaseRequest{ClusterIps: []string{ip}, Force: true}
					resp, err := c.Release(cctx, req)
					return nil, resp.GetRevision(), err
				})
		}
		cancel()
	}
}

// transfer moves what one of mine holds (all of it, or one item named) to another of
// mine or to a new owner, sometimes twice (a retry of the same request), and returns
// mine with the items given to the receiving owner (a new one added).
func transfer(ctx context.Context, h *history, c *client.Client, rep int, r *rand.Rand, mine []held,
	newOwner func() string) []held {
	i, j := r.IntN(len(mine)), len(mine)
	if len(mine) > 1 && r.IntN(2) == 0 {
		if j = r.IntN(len(mine) - 1); j >= i {
			j++
		}
	}
	from := mine[i]
	if j == len(mine) {
		mine = append(mine, held{uid: newOwner()})
	}
	to := &mine[j]
	req := &allocdv1.TransferRequest{From: &allocdv1.Owner{Namespace: "fault", Name: from.uid, Uid: from.uid},
		To: &allocdv1.Owner{Namespace: "fault", Name: to.uid, Uid: to.uid}}
	var named []string
	if len(from.got) > 0 && r.IntN(2) == 0 {
		named = from.got[:1]
		if p, err := strconv.Atoi(strings.TrimPrefix(named[0], "port/")); err == nil {
			req.NodePorts = []int32{int32(p)}
		} else {
			req.ClusterIps = named
		}
	}
	for try := 0; try < 1 || try < 2 && r.IntN(3) == 0; try++ {
		o := h.recordRev(op{kind: opTransfer, owner: from.uid, to: to.uid, replica: rep, items: named},
			transferCall(ctx, c, req))
		switch {
		case o.outcome == ok:
			to.got = append(to.got, o.items...)
		case o.outcome == unknown:
			to.got = append(to.got, named...)
		}
	}
	return mine
}

// transferCall is the call of a Transfer for recordRev.
func transferCall(ctx context.Context, c *client.Client, req *allocdv1.TransferRequest,
) func() ([]string, int64, error) {
	return func() ([]string, int64, error) {
		resp, err := c.Transfer(ctx, req)
		// Not nil: an acknowledged Transfer that moved nothing moved nothing.
		moved := itemsOf(resp.GetTransferredClusterIps(), resp.GetTransferredNodePorts())
		return append([]string{}, moved...), resp.GetRevision(), err
	}
}

// racers is how many goroutines run racer.
const racers = 4

// racer races, until ctx ends, Releases of a named address against Allocates of the
// same address: an owner allocates one of a few hot addresses; then at once, on three
// replicas picked at random, the owner releases it by name twice and a new owner asks
// for it (and releases everything it got). A Release that deleted the address without
// comparing the revision it read could free the new owner's allocation.
func racer(ctx context.Context, h *history, clients []*client.Client, w int, seq, rounds *atomic.Int64) {
	r := rand.New(rand.NewPCG(uint64(100+w), uint64(time.Now().UnixNano())))
	newOwner := func() string { return "r" + strconv.Itoa(w) + "-" + strconv.FormatInt(seq.Add(1), 10) }
	alloc := func(c *client.Client, uid, ip string) op {
		req := &allocdv1.AllocateRequest{Owner: &allocdv1.Owner{Namespace: "fault", Name: uid, Uid: uid},
			ClusterIps: []string{ip}}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return h.record(op{kind: opAllocate, owner: uid, items: []string{ip}}, func() ([]string, error) {
			resp, err := c.Allocate(cctx, req)
			return itemsOf(resp.GetClusterIps(), resp.GetNodePorts()), err
		})
	}
	release := func(c *client.Client, uid string, items []string) op {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return h.recordRev(op{kind: opRelease, owner: uid, items: items}, func() ([]string, int64, error) {
			owner := &allocdv1.Owner{Namespace: "fault", Name: uid, Uid: uid}
			resp, err := c.Release(cctx, &allocdv1.ReleaseRequest{Owner: owner, ClusterIps: items})
			return nil, resp.GetRevision(), err
		})
	}
	for ctx.Err() == nil {
		ip := netip.AddrFrom4([4]byte{10, 0, 0, byte(120 + r.IntN(6))}).String()
		a := newOwner()
		if o := alloc(clients[r.IntN(len(clients))], a, ip); o.outcome != ok {
			continue
		}
		rounds.Add(1)
		b := newOwner()
		pick := func() *client.Client { return clients[r.IntN(len(clients))] }
		c1, c2, c3, c4 := pick(), pick(), pick(), pick()
		var wg sync.WaitGroup
		wg.Go(func() { release(c1, a, []string{ip}) })
		wg.Go(func() { release(c2, a, []string{ip}) })
		wg.Go(func() {
			if o := alloc(c3, b, ip); o.outcome != definite {
				release(c4, b, nil)
			}
		})
		wg.Wait()
	}
}

// transferRacers is how many goroutines run transferRacer.
const transferRacers = 2

// transferRacer races, until ctx ends, Transfers of one item against each other, a
// Release and an Allocate of it: an owner A allocates one of a few hot addresses; then
// at once, on replicas picked at random, A transfers it to B, A transfers it (or
// everything it holds) to C, A releases it, and a new owner D asks for it; then B, C and
// D release everything. A hot address that another owner holds is force-released first.
// A Transfer that wrote the item without comparing the revision it read, or moved it
// apart from the owner records, would give it to two owners.
func transferRacer(ctx context.Context, h *history, clients []*client.Client, w int,
	seq, rounds *atomic.Int64) {
	r := rand.New(rand.NewPCG(uint64(200+w), uint64(time.Now().UnixNano())))
	prefix := "t" + strconv.Itoa(w) + "-"
	newOwner := func() string { return prefix + strconv.FormatInt(seq.Add(1), 10) }
	pick := func() (int, *client.Client) { i := r.IntN(len(clients)); return i, clients[i] }
	owner := func(uid string) *allocdv1.Owner {
		return &allocdv1.Owner{Namespace: "fault", Name: uid, Uid: uid}
	}
	call := func(rep int, o op, f func(ctx context.Context) ([]string, int64, error)) op {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		o.replica = rep
		return h.recordRev(o, func() ([]string, int64, error) { return f(cctx) })
	}
	alloc := func(uid, ip string) op {
		rep, c := pick()
		req := &allocdv1.AllocateRequest{Owner: owner(uid), ClusterIps: []string{ip}}
		return call(rep, op{kind: opAllocate, owner: uid, items: []string{ip}},
			func(ctx context.Context) ([]string, int64, error) {
				resp, err := c.Allocate(ctx, req)
				return itemsOf(resp.GetClusterIps(), resp.GetNodePorts()), resp.GetRevision(), err
			})
	}
	release := func(uid string, items []string) {
		rep, c := pick()
		req := &allocdv1.ReleaseRequest{Owner: owner(uid), ClusterIps: items}
		call(rep, op{kind: opRelease, owner: uid, items: items},
			func(ctx context.Context) ([]string, int64, error) {
				resp, err := c.Release(ctx, req)
				return nil, resp.GetRevision(), err
			})
	}
	force := func(ip string) {
		rep, c := pick()
		req := &allocdv1.ReleaseRequest{ClusterIps: []string{ip}, Force: true}
		call(rep, op{kind: opForce, items: []string{ip}}, func(ctx context.Context) ([]string, int64, error) {
			resp, err := c.Release(ctx, req)
			return nil, resp.GetRevision(), err
		})
	}
	transfer := func(from, to string, items []string) {
		rep, c := pick()
		req := &allocdv1.TransferRequest{From: owner(from), To: owner(to), ClusterIps: items}
		call(rep, op{kind: opTransfer, owner: from, to: to, items: items},
			func(ctx context.Context) ([]string, int64, error) { return transferCall(ctx, c, req)() })
	}
	for ctx.Err() == nil {
		ip := netip.AddrFrom4([4]byte{10, 0, 0, byte(100 + r.IntN(6))}).String()
		a := newOwner()
		if o := alloc(a, ip); o.outcome != ok {
			if o.holder != "" {
				force(ip) // a worker's owner holds it (the /25 fills up): freed, as workers free any
			}
			continue
		}
		rounds.Add(1)
		b, c, d := newOwner(), newOwner(), newOwner()
		toC := []string{ip}
		if r.IntN(2) == 0 {
			toC = nil // everything a holds
		}
		var wg sync.WaitGroup
		wg.Go(func() { transfer(a, b, []string{ip}) })
		wg.Go(func() { transfer(a, c, toC) })
		wg.Go(func() { release(a, []string{ip}) })
		wg.Go(func() { alloc(d, ip) })
		wg.Wait()
		for _, uid := range []string{b, c, d} {
			wg.Go(func() { release(uid, nil) })
		}
		wg.Wait()
	}
}

// lister lists, until ctx ends, the allocations of the owners of one worker or transfer
// racer (a UID prefix), every page at one revision, on a replica picked at random,
// 100 ms after the last listing ended (2 a second in the 3-minute run): the atomicity
// check holds each listing against the Transfers acknowledged.
func lister(ctx context.Context, h *history, clients []*client.Client) {
	r := rand.New(rand.NewPCG(300, uint64(time.Now().UnixNano())))
	for ctx.Err() == nil {
		prefix := "w" + strconv.Itoa(r.IntN(24)) + "-"
		if r.IntN(4) == 0 {
			prefix = "t" + strconv.Itoa(r.IntN(transferRacers)) + "-"
		}
		s := snapshot{prefix: prefix, start: h.now(), held: map[string]string{}}
		if s.listed(ctx, clients[r.IntN(len(clients))]) {
			s.end = h.now()
			h.snap(s)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// listed fills s with the allocations of the owners under s.prefix, and reports whether
// every page was read (at one revision).
func (s *snapshot) listed(ctx context.Context, c *client.Client) bool {
	req := &allocdv1.ListAllocationsRequest{OwnerUidPrefix: s.prefix, PageSize: 5000}
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := c.ListAllocations(cctx, req)
		cancel()
		if err != nil || s.rev != 0 && resp.GetRevision() != s.rev {
			return false
		}
		s.rev = resp.GetRevision()
		for _, a := range resp.GetAllocations() {
			it := a.GetClusterIp()
			if a.GetNodePort() != 0 {
				it = "port/" + strconv.Itoa(int(a.GetNodePort()))
			}
			s.held[it] = a.GetOwner().GetUid()
		}
		if resp.GetNextPageToken() == "" {
			return true
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// checkRecords reads the owner records and the item keys from etcd at one revision and
// returns where they disagree.
func checkRecords(t *testing.T, tp *topology) []violation {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := readOwnerState(ctx, tp.cli, "/allocd")
	if err != nil {
		return []violation{violation(fmt.Sprintf("the owner records and item keys: %v", err))}
	}
	v := st.mismatches()
	t.Logf("owner records vs item keys at revision %d: %d records, %d item keys, %d mismatches", st.rev,
		len(st.records), len(st.keys), len(v))
	return v
}

func itemsOf(ips []string, ports []int32) []string {
	var out []string
	out = append(out, ips...)
	for _, p := range ports {
		out = append(out, "port/"+strconv.Itoa(int(p)))
	}
	return out
}

// listAll reads every allocation: item → owner uid.
func listAll(c *client.Client) (map[string]string, error) {
	out := map[string]string{}
	req := &allocdv1.ListAllocationsRequest{PageSize: 500}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := c.ListAllocations(ctx, req)
		cancel()
		if err != nil {
			return nil, err
		}
		for _, a := range resp.GetAllocations() {
			it := a.GetClusterIp()
			if a.GetNodePort() != 0 {
				it = "port/" + strconv.Itoa(int(a.GetNodePort()))
			}
			out[it] = a.GetOwner().GetUid()
		}
		if resp.GetNextPageToken() == "" {
			return out, nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// injectFaults runs one fault after another until ctx ends, each for about 2 s with
// 1 s of calm between, and returns their windows and the time from each fault's end
// to the first ok operation after it.
func injectFaults(ctx context.Context, t *testing.T, tp *topology, h *history) ([]window, []time.Duration) {
	r := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	var ws []window
	sleep := func(d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	kinds := faultKinds(t)
	sleep(time.Second)
	for ctx.Err() == nil {
		w := window{start: h.now()}
		switch kinds[r.IntN(len(kinds))] {
		case 0:
			l := tp.leader()
			if l < 0 {
				sleep(200 * time.Millisecond)
				continue
			}
			w.name, w.etcdLeader = fmt.Sprintf("kill -9 etcd leader m%d", l), true
			tp.etcd[l].kill()
			time.Sleep(time.Second)
			if err := tp.etcd[l].start(); err != nil {
				t.Errorf("restart etcd m%d: %v", l, err)
			}
		case 1:
			i := r.IntN(len(tp.allocd))
			w.name = fmt.Sprintf("kill -9 allocd-%d", i)
			tp.allocd[i].kill()
			time.Sleep(time.Second)
			if err := tp.allocd[i].start(); err != nil {
				t.Errorf("restart allocd-%d: %v", i, err)
			}
		case 2:
			// A follower stays stopped pauseFor (make fault: 5 s), the leader 2 s, less
			// than the master leases' TTL. A leader that resumes revokes the leases
			// whose renewals it did not see for a TTL, although the next leader took
			// them (etcd 3.7's fix for etcd#15247 checks its leadership only when its
			// raft ticker lagged, and after SIGCONT it ticks at once): after a 2 s pause,
			// the leases whose renewal an allocd kill held back just before. allocd
			// writes such keys again at once (masterlease/restore.go); the lease checks
			// report every delete of a renewed lease's key.
			m := r.IntN(len(tp.etcd))
			role, pause := "follower", pauseFor()
			if m == tp.leader() {
				role, pause = "leader", 2*time.Second
			}
			w.name, w.etcdLeader = fmt.Sprintf("SIGSTOP etcd %s m%d", role, m), true
			tp.etcd[m].signal(syscall.SIGSTOP)
			time.Sleep(pause)
			tp.etcd[m].signal(syscall.SIGCONT)
		case 3:
			i := r.IntN(len(tp.allocd))
			// A partition: bytes held, not dropped. (etcd's pkg/proxy's blackhole drops bytes
			// out of the middle of a TCP stream, which no network does: it corrupts the
			// HTTP/2 framing of the connection for good.)
			w.name = fmt.Sprintf("partition allocd-%d from etcd", i)
			for _, px := range tp.proxies[i] {
				px.PauseTx()
				px.PauseRx()
			}
			time.Sleep(2 * time.Second)
			for _, px := range tp.proxies[i] {
				px.UnpauseTx()
				px.UnpauseRx()
			}
		case 4:
			i := r.IntN(len(tp.allocd))
			w.name = fmt.Sprintf("delay+reset allocd-%d to etcd", i)
			for _, px := range tp.proxies[i] {
				px.DelayTx(300*time.Millisecond, 100*time.Millisecond)
			}
			time.Sleep(time.Second)
			for _, px := range tp.proxies[i] {
				if err := px.ResetListener(); err != nil {
					t.Errorf("reset the proxy at %s: %v", px.Addr(), err)
				}
			}
			time.Sleep(time.Second)
			for _, px := range tp.proxies[i] {
				px.UndelayTx()
			}
		}
		w.end = h.now()
		ws = append(ws, w)
		sleep(time.Second)
	}
	// Recovery: the first ok operation that started after each fault ended.
	h.mu.Lock()
	defer h.mu.Unlock()
	var rec []time.Duration
	for _, w := range ws {
		best := time.Duration(-1)
		for _, o := range h.ops {
			if o.outcome == ok && o.start >= w.end && (best < 0 || o.end < best) {
				best = o.end
			}
		}
		if best >= 0 {
			rec = append(rec, best-w.end)
		}
	}
	return ws, rec
}
