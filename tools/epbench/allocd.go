package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// buildAllocd builds ./cmd/allocd of the module the bench runs in into dir.
func buildAllocd(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "allocd")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/allocd/allocd/cmd/allocd")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build ./cmd/allocd: %w", err)
	}
	return bin, nil
}

// process is one allocd process: its own embedded etcd (fsync on) in a temporary data
// directory, default flags except the listeners (free loopback ports) and
// --repair-interval 1h, its logs in a file.
type process struct {
	cmd       *exec.Cmd
	dir       string
	grpc      string
	metrics   string
	pprof     string // "" unless profiles were asked for
	exited    chan struct{}
	exitErr   error
	logPath   string
	logFile   *os.File
	heapLog   *os.File // heap.tsv: seconds since the start, go_memstats_alloc_bytes
	startedAt time.Time
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startAllocd starts bin and waits until it answers on gRPC; pprof adds
// --pprof-address.
func startAllocd(ctx context.Context, bin, dir string, pprof bool) (*process, error) {
	p := &process{dir: dir, exited: make(chan struct{}), logPath: filepath.Join(dir, "allocd.log")}
	addrs := make([]string, 5)
	for i := range addrs {
		a, err := freeAddr()
		if err != nil {
			return nil, err
		}
		addrs[i] = a
	}
	p.grpc, p.metrics = addrs[0], addrs[1]
	args := []string{"--data-dir", filepath.Join(dir, "data"), "--grpc-address", p.grpc,
		"--metrics-address", p.metrics, "--embedded-etcd-client-address", addrs[2],
		"--embedded-etcd-peer-address", addrs[3], "--repair-interval", "1h"}
	if pprof {
		p.pprof = addrs[4]
		args = append(args, "--pprof-address", p.pprof)
	}
	f, err := os.Create(p.logPath)
	if err != nil {
		return nil, err
	}
	p.logFile = f
	hf, err := os.Create(filepath.Join(dir, "heap.tsv"))
	if err != nil {
		f.Close()
		return nil, err
	}
	p.heapLog = hf
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p.startedAt = time.Now()
	go func() { p.exitErr = p.cmd.Wait(); close(p.exited) }()
	if err := p.waitServing(ctx); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// waitServing waits until allocd answers a listing of Endpoints (it serves the
// Endpoints API once etcd is up and the controller's state is loaded).
func (p *process) waitServing(ctx context.Context) error {
	c, err := client.New(p.grpc)
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.ListServiceEndpoints(cctx, &allocdv1.ListServiceEndpointsRequest{PageSize: 1})
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("allocd exited at start (%v); its log: %s", p.exitErr, p.logTail())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("allocd not serving after a minute: %w; its log: %s", err, p.logTail())
		}
	}
}

// logTail is the end of allocd's log, for an error.
func (p *process) logTail() string {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// stop ends allocd with SIGTERM (SIGKILL after 20 s) and waits for it.
func (p *process) stop() {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.exited
		}
	}
	p.logFile.Close()
	p.heapLog.Close()
}

// scrape reads the samples of the named metrics from allocd's /metrics: a sample with
// labels under its whole name (`x_bucket{le="0.5"}`).
func (p *process) scrape(ctx context.Context, names ...string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.metrics+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	found := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := cutSample(sc.Text())
		base, _, _ := strings.Cut(name, "{")
		if !ok || !want[base] && !want[strings.TrimSuffix(base, "_bucket")] {
			continue
		}
		if v, err := strconv.ParseFloat(val, 64); err == nil {
			out[name] = v
			found[base], found[strings.TrimSuffix(base, "_bucket")] = true, true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, n := range names {
		if !found[n] {
			return nil, fmt.Errorf("allocd's /metrics has no %s", n)
		}
	}
	return out, nil
}

// cutSample splits a sample line into its name (with labels) and value.
func cutSample(line string) (name, val string, ok bool) {
	if line == "" || line[0] == '#' {
		return "", "", false
	}
	i := strings.LastIndexByte(line, ' ')
	if i < 0 {
		return "", "", false
	}
	return line[:i], line[i+1:], true
}

// quantile is the q-quantile of the observations a histogram gained between two
// scrapes (a and b, of its _bucket samples), interpolated in its bucket as Prometheus'
// histogram_quantile does.
func quantile(name string, a, b map[string]float64, q float64) float64 {
	type bucket struct{ le, n float64 }
	var bs []bucket
	prefix := name + `_bucket{le="`
	for k, v := range b {
		if le, ok := strings.CutPrefix(k, prefix); ok {
			x, err := strconv.ParseFloat(strings.TrimSuffix(le, `"}`), 64)
			if err == nil {
				bs = append(bs, bucket{x, v - a[k]})
			}
		}
	}
	slices.SortFunc(bs, func(x, y bucket) int { return cmp.Compare(x.le, y.le) })
	if len(bs) == 0 || bs[len(bs)-1].n == 0 {
		return 0
	}
	rank := q * bs[len(bs)-1].n
	lo, below := 0.0, 0.0
	for _, bk := range bs {
		if bk.n >= rank {
			if math.IsInf(bk.le, 1) {
				return lo
			}
			return lo + (bk.le-lo)*(rank-below)/max(bk.n-below, 1)
		}
		lo, below = bk.le, bk.n
	}
	return lo
}

// profile saves allocd's pprof profile kind (with the query q) to path.
func (p *process) profile(ctx context.Context, kind, q, path string) error {
	if p.pprof == "" || path == "" {
		return nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.pprof+"/debug/pprof/"+kind+"?"+q,
		nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile %s: %w", kind, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile %s: %s", kind, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, resp.Body)
	return errors.Join(err, f.Close())
}
