package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
	"github.com/allocd/allocd/server"
)

// filler allocates one ClusterIP per new owner from many goroutines, and remembers
// every owner and address (the Services of the repair snapshots).
type filler struct {
	clients int
	addr    string
	conns   []*grpc.ClientConn
	mu      sync.Mutex
	svcs    []*allocdv1.Service
	seq     atomic.Int64
}

func newFiller(clients int) *filler { return &filler{clients: clients} }

func (f *filler) dial(addr string) error {
	if f.addr == addr && len(f.conns) > 0 {
		return nil
	}
	f.close()
	f.addr = addr
	for range 4 {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(server.MaxRecvMsgSize)))
		if err != nil {
			return err
		}
		f.conns = append(f.conns, c)
	}
	return nil
}

func (f *filler) close() {
	for _, c := range f.conns {
		c.Close()
	}
	f.conns = nil
}

func (f *filler) alloc(g int) allocdv1.AllocatorServiceClient {
	return allocdv1.NewAllocatorServiceClient(f.conns[g%len(f.conns)])
}

// allocate allocates one ClusterIP for owner uid, retrying (the same request: a retry
// replays) until it succeeds or ctx ends.
func (f *filler) allocate(ctx context.Context, g int, uid string) (*allocdv1.AllocateResponse, error) {
	for {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := f.alloc(g).Allocate(cctx, &allocdv1.AllocateRequest{
			Owner: &allocdv1.Owner{Namespace: "scale", Name: uid, Uid: uid}})
		cancel()
		if err == nil || ctx.Err() != nil {
			return resp, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fill allocates until the filler's owners number n.
func (f *filler) fill(ctx context.Context, addr string, n int) error {
	if err := f.dial(addr); err != nil {
		return err
	}
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for g := range f.clients {
		wg.Go(func() {
			for {
				k := f.seq.Add(1)
				if k > int64(n) {
					f.seq.Add(-1)
					return
				}
				uid := fillPrefix + strconv.FormatInt(k, 10)
				resp, err := f.allocate(ctx, g, uid)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				f.mu.Lock()
				f.svcs = append(f.svcs,
					&allocdv1.Service{Namespace: "scale", Name: uid, Uid: uid, ClusterIps: resp.ClusterIps})
				f.mu.Unlock()
			}
		})
	}
	wg.Wait()
	if v := firstErr.Load(); v != nil {
		return v.(error)
	}
	return nil
}

// row is one point's measurements.
type row struct {
	n                    int
	rate                 float64       // Allocate+Release cycles per second
	cpu                  time.Duration // allocd's CPU per cycle in the rate run
	dur                  time.Duration // of the rate run
	compactions          int           // etcd compactions in the rate run
	compactCPU           time.Duration // allocd's CPU for a compaction of the whole history
	budget               int64         // the history budget at the end of the rate run
	share                share         // Allocate's CPU against its controls
	rss, etcdRSS, extRSS int64
	data, db             int64
	passFirst, pass      time.Duration // a term's first repair pass (it lists), the next ones'
	restart, etcdStart   time.Duration
	join, extRestart     time.Duration
}

// measure takes a point's measurements (see the package doc) and leaves allocd
// running on its embedded etcd.
func (s *stack) measure(ctx context.Context, f *filler, n int) (row, error) {
	r := row{n: n, dur: s.o.rateDuration}
	var err error
	if n > 0 && s.o.settle > 0 {
		time.Sleep(s.o.settle)
	}
	// The fill's history is the fill's: the rate run starts from a compacted store,
	// and counts the compactions its own history causes.
	if r.compactCPU, err = s.compactNow(ctx); err != nil {
		return r, err
	}
	if r.rate, r.cpu, r.compactions, err = s.rateRun(ctx, f, n); err != nil {
		return r, err
	}
	r.budget = int64(s.metric("allocd_etcd_history_budget_bytes", ""))
	fmt.Printf("at %d: %.0f Allocate+Release cycles/s over %v, %.1f µs CPU each, %d compactions; "+
		"compacting the history before it took %.2f s of CPU, %.1f µs a cycle at the budget of %s\n", n,
		r.rate, r.dur, us(r.cpu), r.compactions, r.compactCPU.Seconds(), us(r.compactPerCycle()),
		mib(r.budget))
	if s.o.shareDuration > 0 {
		if r.share, err = s.shareRun(ctx, f); err != nil {
			return r, err
		}
	}
	r.rss = rss(s.allocd.Process.Pid)
	r.data, r.db = dirSize(s.data), dbSize(s.data)
	if s.o.repair && n > 0 {
		if r.passFirst, r.pass, err = s.repairPass(ctx, f); err != nil {
			return r, err
		}
	}
	// kill -9 → SERVING, on the embedded etcd.
	s.killAllocd()
	if r.restart, err = s.startAllocd(ctx, ""); err != nil {
		return r, err
	}
	s.killAllocd()
	// etcd alone, then an allocd on it: a replica joining, and its kill -9 → SERVING.
	if r.etcdStart, err = s.startEtcd(); err != nil {
		return r, err
	}
	time.Sleep(time.Second)
	r.etcdRSS = rss(s.etcd.Process.Pid)
	ext := "http://" + s.etcdClient
	if r.join, err = s.startAllocd(ctx, ext); err != nil {
		return r, err
	}
	r.extRSS = rss(s.allocd.Process.Pid)
	s.killAllocd()
	if r.extRestart, err = s.startAllocd(ctx, ext); err != nil {
		return r, err
	}
	s.killAllocd()
	s.stopEtcd()
	_, err = s.startAllocd(ctx, "")
	return r, err
}

// rateRun runs Allocate+Release cycles (one ClusterIP for a new owner, then the
// release of that owner) from f.clients goroutines for the rate duration: the store
// stays at its point however long the run, and every compaction and tombstone
// collection the cycles cause falls in the window. It returns the rate of cycles whose
// two calls succeeded, allocd's CPU per cycle (from /proc: the embedded etcd
// included) and the compactions that etcd made in the window. At the profile point it
// takes a CPU profile of allocd for the whole window, and a heap profile after it.
func (s *stack) rateRun(ctx context.Context, f *filler, n int) (rate float64, cpu time.Duration,
	compactions int, err error) {
	if err := f.dial(s.grpcAddr); err != nil {
		return 0, 0, 0, err
	}
	pid := s.allocd.Process.Pid
	var profErr chan error
	name := strconv.Itoa(n)
	if s.profileName != "" {
		name = s.profileName
	}
	if s.o.profileAt > 0 && n == s.o.profileAt || s.profileName != "" {
		profErr = make(chan error, 1)
		secs := max(1, int(s.o.rateDuration.Seconds())-1)
		go func() {
			err := s.profile("profile", "?seconds="+strconv.Itoa(secs),
				filepath.Join(s.o.profileDir, "cpu-"+name+".pprof"))
			if err == nil {
				err = s.profile("heap", "", filepath.Join(s.o.profileDir, "heap-"+name+".pprof"))
			}
			profErr <- err
		}()
	}
	compacted0 := s.metric("allocd_etcd_compaction_steps_total", `result="compacted"`)
	var ok atomic.Int64
	cpu0 := procCPU(pid)
	start := time.Now()
	run := start.UnixNano() // owners of this run only: none was ever released
	deadline := start.Add(s.o.rateDuration)
	var wg sync.WaitGroup
	for g := range f.clients {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				uid := fmt.Sprintf("rate-%d-%d-%d", run, g, i)
				owner := &allocdv1.Owner{Namespace: "scale", Name: uid, Uid: uid}
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				_, err := f.alloc(g).Allocate(cctx, &allocdv1.AllocateRequest{Owner: owner})
				if err == nil {
					_, err = f.alloc(g).Release(cctx, &allocdv1.ReleaseRequest{Owner: owner})
				}
				cancel()
				if err == nil {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	cpu = procCPU(pid) - cpu0
	compactions = int(s.metric("allocd_etcd_compaction_steps_total", `result="compacted"`) - compacted0)
	if profErr != nil {
		if err := <-profErr; err != nil {
			return 0, 0, 0, err
		}
	}
	k := ok.Load()
	if k == 0 {
		return 0, 0, 0, fmt.Errorf("no Allocate+Release cycle succeeded in the rate run at %d", n)
	}
	return float64(k) / el.Seconds(), cpu / time.Duration(k), compactions, nil
}

// release releases every allocation of the owners uids.
func (f *filler) release(ctx context.Context, uids []string) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for g := range f.clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(uids) {
					return
				}
				for try := 0; ; try++ {
					cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					_, err := f.alloc(g).Release(cctx, &allocdv1.ReleaseRequest{
						Owner: &allocdv1.Owner{Namespace: "scale", Name: uids[i], Uid: uids[i]}})
					cancel()
					if err == nil {
						break
					}
					if try == 10 {
						firstErr.CompareAndSwap(nil, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if v := firstErr.Load(); v != nil {
		return v.(error)
	}
	return nil
}

var snapshotRev atomic.Int64

// repairPass pushes the filler's Services as a snapshot and runs repair passes; it
// returns the first pass's duration (the first of a term lists every allocation) and
// the best of the next two, as allocd reports them.
func (s *stack) repairPass(ctx context.Context, f *filler) (first, next time.Duration, err error) {
	conn := f.conns[0]
	rc := allocdv1.NewRepairServiceClient(conn)
	f.mu.Lock()
	svcs := f.svcs
	f.mu.Unlock()
	rev := snapshotRev.Add(1)
	// The repair leader of the replica killed before holds its election key until its
	// lease runs out: push again until this one leads.
	for try := 0; ; try++ {
		err := pushSnapshot(ctx, rc, rev, svcs)
		if err == nil {
			break
		}
		if status.Code(err) != codes.Unavailable || try == 120 {
			return 0, 0, err
		}
		time.Sleep(500 * time.Millisecond)
	}
	for i := range 3 {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		resp, err := rc.RunRepair(cctx, &allocdv1.RunRepairRequest{})
		cancel()
		rep := resp.GetReport()
		if err != nil {
			return 0, 0, fmt.Errorf("run repair: %w", err)
		}
		if rep.Error != "" {
			return 0, 0, fmt.Errorf("repair pass: %s", rep.Error)
		}
		switch d := rep.Duration.AsDuration(); {
		case i == 0:
			first = d
		case next == 0 || d < next:
			next = d
		}
	}
	return first, next, nil
}

// pushSnapshot pushes svcs as the snapshot of revision rev, in chunks.
func pushSnapshot(ctx context.Context, rc allocdv1.RepairServiceClient, rev int64,
	svcs []*allocdv1.Service) error {
	stream, err := rc.PushServiceSnapshot(ctx)
	if err != nil {
		return err
	}
	const chunk = 50_000
	for i := 0; i == 0 || i < len(svcs); i += chunk {
		part := svcs[i:min(i+chunk, len(svcs))]
		req := &allocdv1.PushServiceSnapshotRequest{Snapshot: &allocdv1.ServiceSnapshot{Revision: rev,
			Services: part}}
		if err := stream.Send(req); err != nil {
			_, err = stream.CloseAndRecv()
			return fmt.Errorf("push snapshot: %w", err)
		}
	}
	_, err = stream.CloseAndRecv()
	return err
}

// procCPU is the user + system CPU time of pid.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ = 100
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

func (r row) print(w io.Writer, _ bool) {
	fmt.Fprintf(w, "at %d: %.0f Allocate+Release cycles/s over %v (%.1f µs CPU each, %d compactions), "+
		"Allocate CPU %s against a held call %s + etcd's floor %s (p50 %v, %.1f a transaction): %.2f; "+
		"RSS %s, data %s (db %s), repair pass %v (first of a term %v), kill -9 → SERVING %s; etcd alone: "+
		"start %s, RSS %s; allocd on it: join %s, kill -9 → SERVING %s, RSS %s\n",
		r.n, r.rate, r.dur, us(r.cpu), r.compactions, usStr(r.share.alloc), usStr(r.share.held),
		usStr(r.share.floor), r.share.p50.Round(10*time.Microsecond), r.share.batch, r.share.ratio(),
		mib(r.rss), mib(r.data), mib(r.db),
		r.pass.Round(time.Millisecond), r.passFirst.Round(time.Millisecond),
		secs(r.restart), secs(r.etcdStart), mib(r.etcdRSS), secs(r.join), secs(r.extRestart), mib(r.extRSS))
}

// historyPerCycle is what an Allocate+Release cycle adds to etcd's history, measured
// by make soak (docs/contributors/benchmarks.md).
const historyPerCycle = 610

// compactPerCycle is a compaction's CPU spread over the cycles whose history the
// budget holds: what compaction costs a cycle at this size, in the long run.
func (r row) compactPerCycle() time.Duration {
	if r.budget <= 0 {
		return 0
	}
	return time.Duration(float64(r.compactCPU) * historyPerCycle / float64(r.budget))
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func usStr(d time.Duration) string { return fmt.Sprintf("%.1f µs", us(d)) }

// printTable prints every point in one table, with the rate against the empty store's.
func printTable(w io.Writer, rows []row) {
	fmt.Fprintln(w,
		"| allocations | cycles/s | vs empty | CPU/cycle | compactions | a compaction's CPU (per cycle) | "+
			"Allocate CPU / (held + floor) | "+
			"repair pass (first of a term) | kill -9 → SERVING | etcd alone: start | "+
			"allocd joining (external etcd) | kill -9 → SERVING (external) | RSS allocd | "+
			"RSS etcd alone | RSS ratio | data dir | per allocation |")
	fmt.Fprintln(w, "|"+strings.Repeat("---:|", 17))
	base := rows[0].rate
	for _, r := range rows {
		per := "-"
		if r.n > 0 {
			per = fmt.Sprintf("%.0f B", float64(r.data)/float64(r.n))
		}
		pass := "-"
		if r.pass > 0 {
			pass = fmt.Sprintf("%s (%s)", secs(r.pass), secs(r.passFirst))
		}
		sh := "-"
		if r.share.alloc > 0 {
			sh = fmt.Sprintf("%.2f (%.0f / %.0f + %.0f µs)", r.share.ratio(), us(r.share.alloc),
				us(r.share.held), us(r.share.floor))
		}
		fmt.Fprintf(w,
			"| %d | %.0f/s | %.2f | %.0f µs | %d | %.2f s (%.1f µs) | %s | %s | %s | %s | %s | %s | "+
				"%s | %s | %.2f | %s | %s |\n",
			r.n, r.rate, r.rate/base, us(r.cpu), r.compactions, r.compactCPU.Seconds(),
			us(r.compactPerCycle()), sh, pass, secs(r.restart),
			secs(r.etcdStart), secs(r.join), secs(r.extRestart), mib(r.rss), mib(r.etcdRSS),
			float64(r.rss)/float64(max(r.etcdRSS, 1)), mib(r.data), per)
	}
}
