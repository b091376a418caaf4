package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allocd/allocd/cmd/allocd/daemon"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

type options struct {
	cycles, every     int64
	clients, conns    int
	interval          time.Duration
	quota             int64
	logLevel, dataDir string
}

func main() {
	var o options
	flag.Int64Var(&o.cycles, "cycles", 1_000_000, "Allocate+Release cycles")
	flag.Int64Var(&o.every, "every", 100_000, "print a row every this many cycles")
	flag.IntVar(&o.clients, "clients", 64, "concurrent client goroutines")
	flag.IntVar(&o.conns, "conns", 4, "gRPC connections the goroutines share")
	flag.DurationVar(&o.interval, "etcd-compaction-interval", 5*time.Minute,
		"allocd's --etcd-compaction-interval (0: no compaction)")
	flag.Int64Var(&o.quota, "quota-backend-bytes", daemon.DefaultQuotaBackendBytes,
		"allocd's --quota-backend-bytes")
	flag.StringVar(&o.logLevel, "log-level", "warn", "allocd's --log-level (its logs go to stderr)")
	flag.StringVar(&o.dataDir, "data-dir", "",
		"the embedded etcd's data directory (default: a new temporary directory, removed at the end)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	dir := o.dataDir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "allocd-soak-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	// As deployed (fsync on, etcd's raft timing), on free loopback ports.
	cfg := daemon.DefaultConfig()
	cfg.DataDir = dir
	for _, a := range []*string{&cfg.EmbeddedEtcdClientAddress, &cfg.EmbeddedEtcdPeerAddress,
		&cfg.GRPCAddress, &cfg.MetricsAddress} {
		var err error
		if *a, err = daemon.FreeAddr(); err != nil {
			return err
		}
	}
	cfg.ServiceClusterIPRange = "10.0.0.0/16"
	cfg.EtcdCompactionInterval = o.interval
	cfg.QuotaBackendBytes = o.quota
	cfg.LogLevel, cfg.LogOutput = o.logLevel, os.Stderr
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	d, err := daemon.Start(ctx, cfg)
	cancel()
	if err != nil {
		return err
	}
	defer d.Close()
	s := &soak{o: o, d: d, endpoint: "http://" + cfg.EmbeddedEtcdClientAddress,
		metrics: "http://" + d.MetricsAddr() + "/metrics"}
	return s.run()
}

// soak is one run.
type soak struct {
	o        options
	d        *daemon.Daemon
	endpoint string
	metrics  string

	next, done, errs atomic.Int64
	peak             atomic.Int64 // largest database file size seen
	firstErr         atomic.Value
}

func (s *soak) run() error {
	var clients []allocdv1.AllocatorServiceClient
	for range s.o.conns {
		c, err := grpc.NewClient(s.d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer c.Close()
		clients = append(clients, allocdv1.NewAllocatorServiceClient(c))
	}
	fmt.Printf("allocd soak: %d Allocate+Release cycles, %d clients over %d connections, embedded etcd "+
		"with fsync on, --etcd-compaction-interval %v, --quota-backend-bytes %d\n",
		s.o.cycles, s.o.clients, s.o.conns, s.o.interval, s.o.quota)
	fmt.Printf("%10s %9s %9s %12s %12s %12s %12s %8s\n", "cycles", "elapsed", "cycles/s", "db size MiB",
		"in use MiB", "peak MiB", "compactions", "defrags")
	start := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { s.sample(stop, start) })
	var workers sync.WaitGroup
	for g := range s.o.clients {
		workers.Go(func() { s.work(clients[g%len(clients)]) })
	}
	workers.Wait()
	close(stop)
	wg.Wait()
	s.row(start, s.o.cycles, start)
	fmt.Printf("done: %d cycles in %v (%.0f/s), %d errors; largest database file %.1f MiB; "+
		"defragmentations took %s\n",
		s.done.Load(), time.Since(start).Round(time.Second),
		float64(s.done.Load())/time.Since(start).Seconds(), s.errs.Load(),
		mib(s.peak.Load()), s.defragTimes())
	if e := s.firstErr.Load(); e != nil {
		fmt.Printf("first error: %v\n", e)
	}
	return nil
}

// work runs cycles until there are none left.
func (s *soak) work(c allocdv1.AllocatorServiceClient) {
	ctx := context.Background()
	for {
		n := s.next.Add(1)
		if n > s.o.cycles {
			return
		}
		uid := "soak-" + strconv.FormatInt(n, 10)
		owner := &allocdv1.Owner{Namespace: "soak", Name: uid, Uid: uid}
		_, err := c.Allocate(ctx, &allocdv1.AllocateRequest{Owner: owner})
		if err == nil {
			_, err = c.Release(ctx, &allocdv1.ReleaseRequest{Owner: owner})
		}
		if err != nil {
			s.errs.Add(1)
			s.firstErr.CompareAndSwap(nil, err)
		}
		s.done.Add(1)
	}
}

// sample reads the database size every second (for the peak) and prints a row every
// s.o.every cycles, until stop is closed.
func (s *soak) sample(stop <-chan struct{}, start time.Time) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	next, last := s.o.every, time.Time{}
	lastRow := start
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if time.Since(last) >= time.Second {
			s.status()
			last = time.Now()
		}
		if done := s.done.Load(); done >= next && next < s.o.cycles {
			s.row(start, next, lastRow)
			lastRow = time.Now()
			next += s.o.every
		}
	}
}

// row prints one line of the table.
func (s *soak) row(start time.Time, cycles int64, since time.Time) {
	size, inUse := s.status()
	m := s.scrape()
	rate := float64(s.o.every) / time.Since(since).Seconds()
	if since == start {
		rate = float64(cycles) / time.Since(start).Seconds()
	}
	fmt.Printf("%10d %9s %9.0f %12.1f %12.1f %12.1f %12.0f %8.0f\n", cycles,
		time.Since(start).Round(time.Second), rate,
		mib(size), mib(inUse), mib(s.peak.Load()),
		m[`allocd_etcd_compaction_steps_total{result="compacted"}`],
		m[`allocd_etcd_defrags_total{result="done"}`])
}

// status reads the member's database sizes and records the peak.
func (s *soak) status() (size, inUse int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := s.d.Client().Status(ctx, s.endpoint)
	if err != nil {
		return 0, 0
	}
	for p := s.peak.Load(); st.DbSize > p && !s.peak.CompareAndSwap(p, st.DbSize); p = s.peak.Load() {
	}
	return st.DbSize, st.DbSizeInUse
}

// scrape reads allocd's /metrics: series name (with labels, as exposed) to value.
func (s *soak) scrape() map[string]float64 {
	out := map[string]float64{}
	resp, err := http.Get(s.metrics)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				out[line[:i]] = v
			}
		}
	}
	return out
}

// defragTimes describes the defragmentations allocd made.
func (s *soak) defragTimes() string {
	m := s.scrape()
	n, sum := m["allocd_etcd_defrag_duration_seconds_count"], m["allocd_etcd_defrag_duration_seconds_sum"]
	if n == 0 {
		return "none made"
	}
	return fmt.Sprintf("%.0f made, %.0f ms on average", n, 1000*sum/n)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
