package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// share is Allocate's CPU at a point against its two controls, measured in the same
// run (goal: alloc / (held + floor) at most 1.10): the CPU of the whole allocd process
// per Allocate under f.clients callers; the CPU of a bare gRPC server process (no
// interceptors, no allocd code) per call when each call is held as long as
// Allocate's p50 (what a call costs for taking that long: the transport batches less, a
// timer and a wake-up more); and etcd's floor, the CPU of allocd's process (its
// embedded etcd) per allocation for the transactions alone, sent from outside with no
// allocd code (an item key and an owner record each under a CreateRevision compare, as
// many allocations per transaction as Allocate's group commit made).
type share struct {
	alloc, held, floor time.Duration
	p50                time.Duration // Allocate's
	batch              float64       // allocations per group-commit transaction
}

func (sh share) ratio() float64 {
	if sh.held+sh.floor == 0 {
		return 0
	}
	return float64(sh.alloc) / float64(sh.held+sh.floor)
}

// shareRun measures a point's share: Allocates of new owners for -share-duration, the
// floor, the held call, then it releases the owners and deletes the floor's keys.
func (s *stack) shareRun(ctx context.Context, f *filler) (share, error) {
	var sh share
	if err := f.dial(s.grpcAddr); err != nil {
		return sh, err
	}
	pid := s.allocd.Process.Pid
	sum0, count0 := s.metric("allocd_allocator_commit_batch_requests_sum", ""),
		s.metric("allocd_allocator_commit_batch_requests_count", "")
	run := time.Now().UnixNano()
	var mu sync.Mutex
	var uids []string
	calls, cpu, p50 := drive(ctx, f.clients, s.o.shareDuration, pid, func(g, i int) error {
		uid := fmt.Sprintf("share-%d-%d-%d", run, g, i)
		mu.Lock()
		uids = append(uids, uid)
		mu.Unlock()
		_, err := f.alloc(g).Allocate(ctx, &allocdv1.AllocateRequest{
			Owner: &allocdv1.Owner{Namespace: "scale", Name: uid, Uid: uid}})
		return err
	})
	if calls == 0 {
		return sh, fmt.Errorf("no Allocate succeeded in the share run")
	}
	sh.alloc, sh.p50 = cpu/time.Duration(calls), p50
	if c := s.metric("allocd_allocator_commit_batch_requests_count", "") - count0; c > 0 {
		sh.batch = (s.metric("allocd_allocator_commit_batch_requests_sum", "") - sum0) / c
	}
	var err error
	if sh.floor, err = s.floorRun(ctx, max(1, int(sh.batch+0.5))); err != nil {
		return sh, err
	}
	if sh.held, err = s.heldRun(ctx, f.clients, p50); err != nil {
		return sh, err
	}
	return sh, f.release(ctx, uids)
}

// drive calls call from clients goroutines for d and returns the calls that succeeded,
// the CPU pid spent meanwhile and their p50 latency.
func drive(ctx context.Context, clients int, d time.Duration, pid int,
	call func(g, i int) error) (int, time.Duration, time.Duration) {
	var mu sync.Mutex
	var lats []time.Duration
	cpu0 := procCPU(pid)
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for g := range clients {
		wg.Go(func() {
			var mine []time.Duration
			for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				t0 := time.Now()
				if call(g, i) == nil {
					mine = append(mine, time.Since(t0))
				}
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	cpu := procCPU(pid) - cpu0
	if len(lats) == 0 {
		return 0, cpu, 0
	}
	slices.Sort(lats)
	return len(lats), cpu, lats[len(lats)/2]
}

// floorRun sends etcd's floor transactions of batch allocations to the embedded etcd
// (as many in flight as the group commit has: 8) for half the share duration, and
// returns allocd's CPU per allocation; then it deletes the keys.
func (s *stack) floorRun(ctx context.Context, batch int) (time.Duration, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + s.etcdClient},
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	var seq atomic.Int64
	item := `{"namespace":"scale","name":"svc","uid":"floor-0000000","time":"2026-11-25T03:04:05.123456789Z"}`
	txns, cpu, _ := drive(ctx, 8, s.o.shareDuration/2, s.allocd.Process.Pid, func(g, i int) error {
		cmps := make([]clientv3.Cmp, 0, 2*batch)
		puts := make([]clientv3.Op, 0, 2*batch)
		for range batch {
			n := strconv.FormatInt(seq.Add(1), 10)
			ik, ok := "/floor/clusterips/"+n, "/floor/owners/floor-"+n
			rec := `{"namespace":"scale","name":"svc","uid":"floor-` + n + `","clusterIPs":["10.1.2.3"],` +
				`"last":{"hash":"0123456789abcdef","clusterIPs":["10.1.2.3"]}}`
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(ik), "=", 0),
				clientv3.Compare(clientv3.CreateRevision(ok), "=", 0))
			puts = append(puts, clientv3.OpPut(ik, item), clientv3.OpPut(ok, rec))
		}
		_, err := cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
		return err
	})
	if err := deletePrefix(ctx, cli, "/floor/"); err != nil {
		return 0, err
	}
	if txns == 0 {
		return 0, fmt.Errorf("no floor transaction succeeded")
	}
	return cpu / time.Duration(txns*batch), nil
}

// deletePrefix deletes the keys under prefix 10,000 at a time (one delete of a
// hundred thousand keys outlasts etcd's request timeout on a store of a million).
func deletePrefix(ctx context.Context, cli *clientv3.Client, prefix string) error {
	for {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithLimit(10_000))
		if err != nil {
			return err
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		last := string(resp.Kvs[len(resp.Kvs)-1].Key)
		if _, err := cli.Delete(ctx, string(resp.Kvs[0].Key), clientv3.WithRange(last+"\x00")); err != nil {
			return err
		}
	}
}

// compactNow compacts the embedded etcd's whole history (physically: it returns once
// etcd has deleted the old revisions) and returns allocd's CPU meanwhile, nearly all of
// it the compaction's: a rate run then starts from the same state, whatever ran before,
// and counts only the compactions its own history causes.
func (s *stack) compactNow(ctx context.Context) (time.Duration, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + s.etcdClient},
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	resp, err := cli.Get(ctx, "/allocd/health", clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	pid := s.allocd.Process.Pid
	cpu0 := procCPU(pid)
	_, err = cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical())
	if errors.Is(err, rpctypes.ErrCompacted) {
		err = nil // allocd compacted it meanwhile
	}
	return procCPU(pid) - cpu0, err
}

// heldRun starts `scale held` (a bare gRPC Health server that answers each Check after
// hold), calls it from clients goroutines over 4 connections for half the share
// duration, and returns that process's CPU per call.
func (s *stack) heldRun(ctx context.Context, clients int, hold time.Duration) (time.Duration, error) {
	cmd := exec.Command(s.self, "held", "-hold", hold.String())
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		return 0, fmt.Errorf("scale held: no address")
	}
	addr := sc.Text()
	var conns []healthpb.HealthClient
	for range 4 {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return 0, err
		}
		defer c.Close()
		conns = append(conns, healthpb.NewHealthClient(c))
	}
	calls, cpu, _ := drive(ctx, clients, s.o.shareDuration/2, cmd.Process.Pid, func(g, i int) error {
		_, err := conns[g%len(conns)].Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	})
	if calls == 0 {
		return 0, fmt.Errorf("no held call succeeded")
	}
	return cpu / time.Duration(calls), nil
}

// heldMain is `scale held -hold D`: a bare gRPC server (no interceptors) whose Health
// Check answers after D, on a free loopback port it prints, until killed.
func heldMain(args []string) int {
	fs := flag.NewFlagSet("scale held", flag.ExitOnError)
	hold := fs.Duration("hold", 0, "how long each Check waits before it answers")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale held:", err)
		return 1
	}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, heldHealth{hold: *hold})
	fmt.Println(l.Addr().String())
	if err := gs.Serve(l); err != nil {
		fmt.Fprintln(os.Stderr, "scale held:", err)
		return 1
	}
	return 0
}

// heldHealth answers Check after hold.
type heldHealth struct {
	healthpb.UnimplementedHealthServer
	hold time.Duration
}

func (h heldHealth) Check(context.Context,
	*healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	time.Sleep(h.hold)
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// metric reads allocd's /metrics and returns the sum of the samples of name whose
// labels contain labels (all of them when empty); 0 when it cannot read it.
func (s *stack) metric(name, labels string) float64 {
	resp, err := http.Get("http://" + s.metricsAddr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		if labels != "" && !strings.Contains(rest, labels) {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) > 0 {
			v, _ := strconv.ParseFloat(f[0], 64)
			sum += v
		}
	}
	return sum
}
