package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/allocd/allocd/internal/loopback"
)

// stack is the processes of a run: allocd (embedded etcd, or on etcd alone) and etcd
// alone, each started from this program's binary.
type stack struct {
	o                     options
	bin, data, logs       string
	grpcAddr, pprofAddr   string
	metricsAddr           string
	etcdClient, etcdPeer  string
	allocd, etcd          *exec.Cmd
	allocdDone, etcdDone  chan struct{}
	allocdLog, etcdLogOut *os.File
	// startDir: the next allocd start writes its profiles and steps there
	// (restartRun).
	startDir string
	env      []string // added to allocd's environment
	args     []string // added to allocd's command line
	self     string   // this program (`scale held` runs from it, whatever bin is)
	// profileName: rate runs take profiles, named cpu-<profileName>.pprof (abRun).
	profileName string
}

func newStack(dir string, o options) (*stack, error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, err
	}
	data, logs := workDirs(dir)
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, err
	}
	s := &stack{o: o, bin: bin, self: bin, data: data, logs: logs}
	for _, a := range []*string{&s.grpcAddr, &s.pprofAddr, &s.metricsAddr, &s.etcdClient, &s.etcdPeer} {
		if *a, err = loopback.FreeAddr(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *stack) logFile(name string) (*os.File, error) {
	return os.OpenFile(filepath.Join(s.logs, name), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
}

// startAllocd starts allocd (on etcdServers, or with its embedded etcd when empty)
// and returns the time from its start to health SERVING.
func (s *stack) startAllocd(ctx context.Context, etcdServers string) (time.Duration, error) {
	args := []string{"serve", "--grpc-address", s.grpcAddr, "--metrics-address", s.metricsAddr,
		"--pprof-address", s.pprofAddr,
		"--service-cluster-ip-range", s.o.cidr, "--log-level", s.o.logLevel, "--repair-interval", "1000h"}
	if s.startDir != "" {
		args = append(args, "--scale-start-dir", s.startDir)
		if s.o.restartTrace {
			args = append(args, "--scale-start-trace")
		}
	}
	if etcdServers != "" {
		args = append(args, "--etcd-servers", etcdServers)
	} else {
		args = append(args, "--data-dir", s.data, "--embedded-etcd-client-address", s.etcdClient,
			"--embedded-etcd-peer-address", s.etcdPeer)
	}
	f, err := s.logFile("allocd.log")
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(s.bin, append(args, s.args...)...)
	cmd.Env = append(os.Environ(), s.env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		f.Close()
		return 0, err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.allocd, s.allocdDone, s.allocdLog = cmd, done, f
	if err := waitServing(ctx, s.grpcAddr, done, 10*time.Minute); err != nil {
		return 0, fmt.Errorf("allocd (log %s): %w", f.Name(), err)
	}
	return time.Since(start), nil
}

// killAllocd kills allocd with SIGKILL and waits until it is gone.
func (s *stack) killAllocd() {
	if s.allocd == nil {
		return
	}
	s.allocd.Process.Signal(syscall.SIGKILL)
	<-s.allocdDone
	s.allocdLog.Close()
	s.allocd = nil
}

// startEtcd starts etcd alone on the data directory and returns the time from its
// start to ready.
func (s *stack) startEtcd() (time.Duration, error) {
	f, err := s.logFile("etcd.log")
	if err != nil {
		return 0, err
	}
	// etcd's info lines say what its start did (the index restored, a compaction
	// resumed, and when).
	cmd := exec.Command(s.bin, "etcd", "-data-dir", s.data, "-client-url", "http://"+s.etcdClient,
		"-peer-url", "http://"+s.etcdPeer, "-log-level", "info")
	cmd.Stderr = f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		f.Close()
		return 0, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		f.Close()
		return 0, err
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ok := false
		for sc.Scan() {
			if sc.Text() == "ready" && !ok {
				ok = true
				ready <- true
			}
		}
		if !ok {
			ready <- false
		}
		io.Copy(io.Discard, out)
	}()
	done := make(chan struct{})
	if !<-ready {
		cmd.Wait()
		f.Close()
		return 0, fmt.Errorf("etcd alone did not start (log %s)", f.Name())
	}
	took := time.Since(start)
	go func() { cmd.Wait(); close(done) }()
	s.etcd, s.etcdDone, s.etcdLogOut = cmd, done, f
	return took, nil
}

// stopEtcd stops etcd alone with SIGTERM (it closes its database cleanly).
func (s *stack) stopEtcd() {
	if s.etcd == nil {
		return
	}
	s.etcd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.etcdDone:
	case <-time.After(30 * time.Second):
		s.etcd.Process.Signal(syscall.SIGKILL)
		<-s.etcdDone
	}
	s.etcdLogOut.Close()
	s.etcd = nil
}

func (s *stack) stop() {
	if s.allocd != nil {
		s.allocd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.allocdDone:
		case <-time.After(30 * time.Second):
			s.killAllocd()
		}
		if s.allocdLog != nil {
			s.allocdLog.Close()
		}
		s.allocd = nil
	}
	s.stopEtcd()
}

// waitServing polls addr's health until SERVING, every 5 ms; it fails when done
// closes (the process died) or after limit.
func waitServing(ctx context.Context, addr string, done <-chan struct{}, limit time.Duration) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: 100 * time.Millisecond,
			Backoff: backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1,
				MaxDelay: 5 * time.Millisecond}}))
	if err != nil {
		return err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return errors.New("the process exited")
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("not SERVING after %v", limit)
}

// rss returns the resident set size of pid, in bytes.
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// dirSize is the size of the files under dir.
func dirSize(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// dbSize is the size of the etcd database file under the data directory.
func dbSize(data string) int64 {
	fi, err := os.Stat(filepath.Join(data, "member", "snap", "db"))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// profile writes allocd's pprof profile kind (with query q) to path.
func (s *stack) profile(kind, q, path string) error {
	resp, err := http.Get("http://" + s.pprofAddr + "/debug/pprof/" + kind + q)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("pprof %s: %s", kind, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}
