package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/allocd/allocd/cmd/allocd/daemon"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	"github.com/allocd/allocd/internal/testing/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.MustTestMain(m) }

// buildAllocd builds the binary once per test run.
func buildAllocd(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "allocd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func free(t *testing.T) string {
	t.Helper()
	a, err := daemon.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestFlagsAndErrors(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		wantCode int
		wantOut  string // in stdout
		wantErr  string // in stderr, one line
	}{
		{[]string{"--help"}, 0, "Ranges:", ""},
		{[]string{"--version"}, 0, "etcd client", ""},
		{[]string{"--no-such-flag"}, 2, "", "-no-such-flag"},
		{[]string{"--service-cluster-ip-range", "10.0.0.0"}, 2, "", "--service-cluster-ip-range"},
		{[]string{"--service-cluster-ip-range", "10.0.0.5/24"}, 2, "", "did you mean 10.0.0.0/24?"},
		{[]string{"--repair-interval", "soon"}, 2, "", "-repair-interval"},
		{[]string{"extra"}, 2, "", "unexpected argument"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		if code != tc.wantCode {
			t.Errorf("run(%q) = %d; want %d (stderr %q)", tc.args, code, tc.wantCode, stderr.String())
		}
		if !strings.Contains(stdout.String(), tc.wantOut) {
			t.Errorf("run(%q) stdout = %q; want it to contain %q", tc.args, stdout.String(), tc.wantOut)
		}
		if tc.wantErr != "" {
			if !strings.Contains(stderr.String(), tc.wantErr) ||
				strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
				t.Errorf("run(%q) stderr = %q; want one line naming %q", tc.args, stderr.String(), tc.wantErr)
			}
		}
	}
	// Help lists every group.
	var stdout bytes.Buffer
	run([]string{"--help"}, &stdout, &stdout)
	for _, g := range []string{"Etcd:", "Ranges:", "Leases:", "Repair:", "Serving:", "Logging:"} {
		if !strings.Contains(stdout.String(), g) {
			t.Errorf("--help has no group %s", g)
		}
	}
}

func TestUnusableDataDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o600)
	var stdout, stderr bytes.Buffer
	code := run([]string{"--data-dir", filepath.Join(file, "sub"), "--grpc-address", free(t),
		"--metrics-address", "",
		"--embedded-etcd-client-address", free(t), "--embedded-etcd-peer-address", free(t), "--log-level",
		"error"}, &stdout, &stderr)
	if code == 0 || !strings.Contains(stderr.String(), "data dir") {
		t.Errorf("run with an unusable data dir = %d, %q; want non-zero and a line naming the data dir", code,
			stderr.String())
	}
}

// TestSignalAndRestart runs the real binary: SIGTERM exits 0 within 10 s, and a restart
// on the same --data-dir comes back SERVING.
func TestSignalAndRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildAllocd(t)
	dir := t.TempDir()
	grpcAddr, c, p := free(t), free(t), free(t)
	for round := 0; round < 2; round++ {
		cmd := exec.Command(bin, "--data-dir", dir, "--grpc-address", grpcAddr, "--metrics-address", free(t),
			"--embedded-etcd-client-address", c, "--embedded-etcd-peer-address", p)
		var logs bytes.Buffer
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitServing(t, grpcAddr, 30*time.Second)
		start := time.Now()
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("round %d: allocd exited with %v after SIGTERM; logs:\n%s", round, err,
					logs.String())
			}
			t.Logf("round %d: exited 0 %s after SIGTERM", round, time.Since(start).Round(time.Millisecond))
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("round %d: allocd still running 10s after SIGTERM; logs:\n%s", round, logs.String())
		}
	}
}

func waitServing(t *testing.T, addr string, d time.Duration) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var resp *healthpb.HealthCheckResponse
	if !etcdtest.Eventually(d, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
	}) {
		t.Fatalf("%s not SERVING after %s: %v %v", addr, d, resp.GetStatus(), err)
	}
}

// TestSignalWhileWaitingForEtcd: SIGTERM while allocd waits for an etcd that does not
// answer exits 0 at once.
func TestSignalWhileWaitingForEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildAllocd(t)
	cmd := exec.Command(bin, "--etcd-servers", "http://"+free(t), "--grpc-address", free(t),
		"--metrics-address", "")
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("allocd exited with %v after SIGTERM while waiting for etcd; want 0; logs:\n%s", err,
				logs.String())
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("allocd still running 10s after SIGTERM; logs:\n%s", logs.String())
	}
}
