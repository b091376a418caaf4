package fault

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/allocd/allocd/internal/loopback"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	"github.com/allocd/allocd/internal/testing/netproxy"
)

// proc is one process of the topology, restartable with the same arguments.
type proc struct {
	name, bin string
	args      []string
	logPath   string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	// Killed with the test, even when the test binary dies before its cleanup runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); f.Close(); close(done) }()
	p.cmd, p.done = cmd, done
	return nil
}

// signal sends sig to the running process; kill waits for it to be gone.
func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil {
		p.cmd.Process.Signal(sig)
	}
}

func (p *proc) kill() {
	p.signal(syscall.SIGCONT) // a paused process dies too
	p.signal(syscall.SIGKILL)
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done != nil {
		<-done
	}
}

// topology is the running cluster.
type topology struct {
	t       testing.TB
	dir     string
	etcd    []*proc
	etcdURL []string // client URLs of the members
	allocd  []*proc
	grpc    []string            // gRPC addresses of the replicas
	proxies [][]*netproxy.Proxy // proxies[i][j]: replica i to member j
	cli     *clientv3.Client    // to every member directly, for the checks and the faults
}

func freeAddr(t testing.TB) string {
	a, err := loopback.FreeAddr()
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	return a
}

// build compiles allocd and etcdmember into dir.
func build(t testing.TB, dir string) (allocd, member string) {
	t.Helper()
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	allocd, member = filepath.Join(dir, "allocd"), filepath.Join(dir, "etcdmember")
	for bin, pkg := range map[string]string{allocd: "./cmd/allocd",
		member: "./internal/testing/fault/etcdmember"} {
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return allocd, member
}

// electionMs is the etcd members' election timeout: ALLOCD_FAULT_ELECTION_MS (make
// fault: 1000, etcd's default), or 200 for make test's short run.
func electionMs() int {
	if v, err := strconv.Atoi(os.Getenv("ALLOCD_FAULT_ELECTION_MS")); err == nil && v > 0 {
		return v
	}
	return 200
}

// logLevel is the replicas' --log-level: debug with ALLOCD_FAULT_VERBOSE, else info.
func logLevel() string {
	if os.Getenv("ALLOCD_FAULT_VERBOSE") != "" {
		return "debug"
	}
	return "info"
}

// startTopology builds and starts everything, and returns once every replica serves.
func startTopology(t testing.TB, ranges, ports string) *topology {
	t.Helper()
	dir := t.TempDir()
	allocdBin, memberBin := build(t, dir)
	tp := &topology{t: t, dir: dir}
	const n = 3
	var peers, initial []string
	for i := range n {
		peers = append(peers, "http://"+freeAddr(t))
		tp.etcdURL = append(tp.etcdURL, "http://"+freeAddr(t))
		initial = append(initial, fmt.Sprintf("m%d=%s", i, peers[i]))
	}
	token := fmt.Sprintf("fault-%d", time.Now().UnixNano())
	for i := range n {
		p := &proc{name: fmt.Sprintf("etcd-m%d", i), bin: memberBin,
			logPath: filepath.Join(dir, fmt.Sprintf("etcd-m%d.log", i)),
			args: []string{"-name", fmt.Sprintf("m%d", i), "-data-dir",
				filepath.Join(dir, fmt.Sprintf("m%d", i)),
				"-client-url", tp.etcdURL[i], "-peer-url", peers[i], "-initial-cluster",
				strings.Join(initial, ","), "-token", token,
				"-tick-ms", strconv.Itoa(max(10, electionMs()/10)), "-election-ms",
				strconv.Itoa(electionMs())}}
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
		tp.etcd = append(tp.etcd, p)
	}
	t.Cleanup(func() {
		for _, p := range append(append([]*proc{}, tp.allocd...), tp.etcd...) {
			p.kill()
		}
		for _, ps := range tp.proxies {
			for _, px := range ps {
				px.Close()
			}
		}
	})
	cli, err := clientv3.New(clientv3.Config{Endpoints: tp.etcdURL, DialTimeout: 5 * time.Second,
		Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	tp.cli = cli
	etcdtest.WaitFor(t, 60*time.Second, "the etcd cluster", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := cli.Get(ctx, "health")
		return err == nil
	})
	for i := range n {
		var urls []string
		var ps []*netproxy.Proxy
		for j := range n {
			px, from := newProxy(t, tp.etcdURL[j])
			ps = append(ps, px)
			urls = append(urls, from)
		}
		tp.proxies = append(tp.proxies, ps)
		addr := freeAddr(t)
		tp.grpc = append(tp.grpc, addr)
		p := &proc{name: fmt.Sprintf("allocd-%d", i), bin: allocdBin,
			logPath: filepath.Join(dir, fmt.Sprintf("allocd-%d.log", i)),
			args: []string{"--etcd-servers", strings.Join(urls, ","), "--grpc-address", addr,
				"--metrics-address", "",
				"--service-cluster-ip-range", ranges, "--service-node-port-range", ports,
				"--master-lease-ttl", "3s", "--shutdown-timeout", "1s", "--log-format", "json", "--log-level",
				logLevel()}}
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
		tp.allocd = append(tp.allocd, p)
	}
	return tp
}

// newProxy starts a netproxy to the member at target on a random loopback host (see
// loopback.FreeAddr) and any free port of it, and returns it and its URL.
func newProxy(t testing.TB, target string) (*netproxy.Proxy, string) {
	to, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	host, _, err := net.SplitHostPort(freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	px, err := netproxy.Listen(net.JoinHostPort(host, "0"), to.Host)
	if err != nil {
		t.Fatalf("proxy to %s: %v", target, err)
	}
	return px, "http://" + px.Addr()
}

// leader returns the index of the etcd leader, -1 when none answers.
func (tp *topology) leader() int {
	for i, u := range tp.etcdURL {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		st, err := tp.cli.Status(ctx, u)
		cancel()
		if err == nil && st.Leader == st.Header.MemberId {
			return i
		}
	}
	return -1
}
