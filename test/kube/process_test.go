package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// binDir holds the binaries make kube-e2e builds: kube-apiserver, kube-controller-manager
// (from the Go module proxy, pinned in test/kube/k8s), allocd and allocd-bridge.
func binDir(t testing.TB) string {
	d := os.Getenv("KUBE_E2E_BIN")
	if d == "" {
		t.Fatal("KUBE_E2E_BIN is not set: run make kube-e2e, which builds the binaries into .bin and sets it")
	}
	return d
}

func binary(t testing.TB, name string) string {
	p := filepath.Join(binDir(t), name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s: %v (make kube-e2e builds it)", name, err)
	}
	return p
}

// logDir keeps the processes' logs: KUBE_E2E_LOGS when set (make kube-e2e sets it, so
// that a failure can be read after the run), else a temporary directory.
func logDir(t testing.TB) string {
	if d := os.Getenv("KUBE_E2E_LOGS"); d != "" {
		d = filepath.Join(d, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// proc is one process of the test (a kube-apiserver, allocd, the bridge...), stopped
// by t.Cleanup; Kill and Start restart it with the same arguments.
type proc struct {
	t    testing.TB
	name string
	path string
	args []string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	runs int
}

func startProc(t testing.TB, name, path string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, path: path, args: args, log: filepath.Join(logDir(t), name+".log")}
	p.Start()
	t.Cleanup(p.Stop)
	return p
}

// Start starts the process (again).
func (p *proc) Start() {
	p.t.Helper()
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	p.runs++
	fmt.Fprintf(f, "\n==== start %d: %s %s\n", p.runs, p.path, strings.Join(p.args, " "))
	p.cmd = exec.Command(p.path, p.args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		p.t.Fatalf("start %s: %v", p.name, err)
	}
	p.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		f.Close()
		close(done)
	}(p.cmd, p.done)
}

// Running reports whether the process has not exited.
func (p *proc) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Kill kills the process (SIGKILL) and waits for it.
func (p *proc) Kill() { p.signal(syscall.SIGKILL, 0) }

// Stop stops the process with SIGTERM, then SIGKILL after 15 s.
func (p *proc) Stop() { p.signal(syscall.SIGTERM, 15*time.Second) }

func (p *proc) signal(sig syscall.Signal, grace time.Duration) {
	if p.cmd == nil || !p.Running() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	if grace > 0 {
		select {
		case <-p.done:
			return
		case <-time.After(grace):
			_ = p.cmd.Process.Kill()
		}
	}
	<-p.done
}

// Tail is the end of the process's log, for failure messages.
func (p *proc) Tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return fmt.Sprintf("---- %s (%s), last lines:\n%s", p.name, p.log, bytes.TrimSpace(b))
}

// freePort returns a free TCP port on 127.0.0.1.
func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// waitHTTP waits until url answers 200 (trusting ca when given), or fails the test
// with the process's log.
func waitHTTP(t testing.TB, p *proc, url, caFile string, limit time.Duration) {
	t.Helper()
	tr := &http.Transport{}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	hc := &http.Client{Transport: tr, Timeout: 2 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if !p.Running() {
			t.Fatalf("%s exited before %s answered\n%s", p.name, url, p.Tail())
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s did not answer %s within %v (last: %v)\n%s", p.name, url, limit, err, p.Tail())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
