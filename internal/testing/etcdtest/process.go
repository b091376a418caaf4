package etcdtest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocd/allocd/internal/etcd/embedded"
)

// binaryEnv names the environment variable that runs etcdtest's members as processes of
// the etcd binary it names (an absolute path) instead of embedding go.mod's etcd in the
// test: `make etcd-matrix` builds etcd 3.5 and 3.6 from the Go module proxy and runs
// the tests of every package that uses etcdtest against each. Every New still gets a
// member of its own (its keys, its revisions, its compactions) on free loopback ports,
// and NewCluster a cluster of its own; Stop, Restart, StopMember kill a process (as a
// crash would), Start and StartMember start it again on its data.
const binaryEnv = "ALLOCD_TEST_ETCD_BINARY"

// binary is the etcd binary that binaryEnv names; "" when members are embedded.
func binary() string { return os.Getenv(binaryEnv) }

// logProcess says in the test's log, with binaryEnv, that the etcd at endpoints is a
// process of binary(): make etcd-matrix counts the tests that say it.
func logProcess(t testing.TB, endpoints string) {
	t.Helper()
	if bin := binary(); bin != "" {
		t.Logf("etcdtest: etcd %s is a process of %s", endpoints, bin)
	}
}

// process is an etcd member run as a process of its own.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and its log is closed
	log  string        // its output: etcd's log, and why it failed to start
}

// processArgs are the etcd flags for c, as embedded.Start configures the embedded
// member: the same ports, data dir, raft timing, quota and cluster.
func processArgs(c embedded.Config) []string {
	name := c.Name
	if name == "" {
		name = "allocd"
	}
	initial := name + "=" + c.PeerURL
	if c.InitialCluster != "" {
		initial = c.InitialCluster
	}
	args := []string{"--name", name, "--data-dir", c.Dir,
		"--listen-client-urls", c.ClientURL, "--advertise-client-urls", c.ClientURL,
		"--listen-peer-urls", c.PeerURL, "--initial-advertise-peer-urls", c.PeerURL,
		"--initial-cluster", initial, "--log-level", "warn"}
	if c.ClusterToken != "" {
		args = append(args, "--initial-cluster-token", c.ClusterToken)
	}
	if c.TickMs > 0 {
		args = append(args, "--heartbeat-interval", strconv.FormatUint(uint64(c.TickMs), 10))
	}
	if c.ElectionMs > 0 {
		args = append(args, "--election-timeout", strconv.FormatUint(uint64(c.ElectionMs), 10))
	}
	if c.UnsafeNoFsync {
		args = append(args, "--unsafe-no-fsync")
	}
	if c.QuotaBackendBytes > 0 {
		args = append(args, "--quota-backend-bytes", strconv.FormatInt(c.QuotaBackendBytes, 10))
	}
	return args
}

// startProcess starts a member of binary() with c's configuration and returns once it
// answers /health, or with an error that quotes the end of its log.
func startProcess(ctx context.Context, c embedded.Config) (*process, error) {
	p, err := launchProcess(binary(), c)
	if err != nil {
		return nil, err
	}
	if err := p.waitHealthy(ctx, c.ClientURL); err != nil {
		p.kill()
		return nil, err
	}
	return p, nil
}

// launchProcess starts a member of bin with c's configuration, its output appended to
// c.Dir's sibling file "<dir>.etcd.log", without waiting for it to serve (the members
// of a new cluster serve once enough of them run).
func launchProcess(bin string, c embedded.Config) (*process, error) {
	if !filepath.IsAbs(bin) {
		return nil, fmt.Errorf("%s=%s: want an absolute path (go test runs each package's tests in the "+
			"package's directory)", binaryEnv, bin)
	}
	p := &process{log: strings.TrimSuffix(c.Dir, "/") + ".etcd.log", done: make(chan struct{})}
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	p.cmd = exec.Command(bin, processArgs(c)...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	// Killed with the test, even when the test binary dies before its cleanup runs.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", bin, err)
	}
	go func() { p.cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

// waitHealthy polls the member's /health, which answers true once it has a leader and
// serves a linearizable read, for at most a minute. Its error quotes the member's
// command line and the end of its log.
func (p *process) waitHealthy(ctx context.Context, clientURL string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	hc := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-p.done:
			return fmt.Errorf("%s: exited before it served\n%s", p.cmd, p.logTail())
		case <-ctx.Done():
			return fmt.Errorf("%s: not healthy: %w\n%s", p.cmd, ctx.Err(), p.logTail())
		case <-time.After(10 * time.Millisecond):
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, clientURL+"/health", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
	}
}

// kill ends the process at once, as a crash would, and waits for it to be gone.
func (p *process) kill() {
	p.cmd.Process.Signal(syscall.SIGCONT) // a paused process dies too
	p.cmd.Process.Kill()
	<-p.done
}

// logTail is the end of the process's log, for an error message.
func (p *process) logTail() string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	const limit = 4 << 10
	if len(b) > limit {
		b = b[len(b)-limit:]
	}
	return string(b)
}

// launchProcess starts member i of the cluster as a process of c.bin, without waiting
// for it to be ready.
func (c *Cluster) launchProcess(i int) {
	c.t.Helper()
	m := c.members[i]
	p, err := launchProcess(c.bin, embedded.Config{Name: m.name, Dir: m.dir, ClientURL: m.clientURL,
		PeerURL:        m.peerURL,
		InitialCluster: c.initial, ClusterToken: c.token, UnsafeNoFsync: true, TickMs: c.tickMs,
		ElectionMs: c.elecMs})
	if err != nil {
		c.t.Fatalf("start etcd member %s: %v", m.name, err)
	}
	m.proc = p
}

// processLeader is Leader for members that run as processes: the member whose ID the
// running members' status names as leader, waiting up to 10 s for one.
func (c *Cluster) processLeader() int {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ids := map[uint64]int{}
		var leads []uint64
		for i, m := range c.members {
			if m.proc == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			st, err := c.Client.Status(ctx, m.clientURL)
			cancel()
			if err == nil {
				ids[st.Header.MemberId] = i
				leads = append(leads, st.Leader)
			}
		}
		for _, l := range leads {
			if i, ok := ids[l]; ok {
				return i
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("etcd cluster: no running leader after 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
