package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allocd/allocd/cmd/allocd/daemon"
	"github.com/allocd/allocd/internal/testing/devpki"
)

// TestTLSAsAUser drives an allocd with TLS, client certificates and the example policy
// the way docs/operators/security.md does: grpcurl with -cacert, -cert and -key, and
// `allocd health --tls-ca-file`. Without a client certificate health answers and
// Allocate is refused; a shim allocates but cannot force a release; an admin can.
func TestTLSAsAUser(t *testing.T) {
	grpcurl := findGrpcurl(t)
	d, caFile, issue := startTLSDaemon(t)
	cert := func(name, identity string) []string {
		crt, key := issue(name, identity)
		return []string{"-cert", crt, "-key", key}
	}
	shim := cert("shim", devpki.ShimIdentity+"apiserver-1")
	admin := cert("admin", devpki.AdminIdentity+"bob")
	call := func(cert []string, body, method string) string {
		args := append([]string{"-cacert", caFile}, cert...)
		if body != "" {
			args = append(args, "-d", body)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, _ := exec.CommandContext(ctx, grpcurl, append(args, d.GRPCAddr(), method)...).CombinedOutput()
		return string(out)
	}
	const owner = `{"owner":{"namespace":"default","name":"web","uid":"uid-web"},"cluster_ips":["10.0.0.20"]}`
	for _, step := range []struct {
		who          string
		cert         []string
		body, method string
		want         string
	}{
		{"no certificate", nil, "", "grpc.health.v1.Health/Check", `"status": "SERVING"`},
		{"no certificate", nil, owner, "allocd.v1.AllocatorService/Allocate", "Code: Unauthenticated"},
		{"shim", shim, owner, "allocd.v1.AllocatorService/Allocate", `"10.0.0.20"`},
		{"shim", shim, `{"cluster_ips":["10.0.0.20"],"force":true}`,
			"allocd.v1.AllocatorService/Release", "FORCE_RELEASE_REQUIRED"},
		{"shim", shim, `{"cluster_ips":["10.0.0.20"]}`,
			"allocd.v1.AllocatorService/ForceRelease", "Code: PermissionDenied"},
		{"admin", admin, `{"cluster_ips":["10.0.0.20"]}`,
			"allocd.v1.AllocatorService/ForceRelease", `"releasedClusterIps"`},
	} {
		if out := call(step.cert, step.body, step.method); !strings.Contains(out, step.want) {
			t.Errorf("grpcurl as %s %s %s:\n%s\nwant %q in it", step.who, step.method, step.body, out,
				step.want)
		}
	}
	var stdout, stderr bytes.Buffer
	if rc := run([]string{"health", "--server", d.GRPCAddr(), "--tls-ca-file", caFile}, &stdout,
		&stderr); rc != 0 {
		t.Errorf("allocd health --tls-ca-file = %d (%s); want 0", rc, stderr.String())
	}
	if rc := run([]string{"health", "--server", d.GRPCAddr(), "--timeout", "1s"}, &stdout, &stderr); rc == 0 {
		t.Errorf("allocd health in plaintext against TLS = 0; want a failure")
	}
}

// startTLSDaemon starts an allocd with TLS, client certificates of a test CA (caFile)
// and the example policy; issue writes a client certificate of that CA for identity and
// returns its files.
func startTLSDaemon(t *testing.T) (d *daemon.Daemon, caFile string,
	issue func(name, identity string) (crtFile, keyFile string)) {
	t.Helper()
	dir := t.TempDir()
	ca, err := devpki.NewCA("allocd test CA")
	if err != nil {
		t.Fatal(err)
	}
	caFile = filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	write := func(name string, l devpki.Leaf) (string, string) {
		crt, key, err := ca.Issue(l)
		if err != nil {
			t.Fatal(err)
		}
		crtFile, keyFile, err := devpki.WriteFiles(dir, name, crt, key)
		if err != nil {
			t.Fatal(err)
		}
		return crtFile, keyFile
	}
	d = daemon.StartForTest(t, func(c *daemon.Config) {
		host, _, _ := net.SplitHostPort(c.GRPCAddress)
		c.TLSCertFile, c.TLSPrivateKeyFile = write("server", devpki.Leaf{IPs: []net.IP{net.ParseIP(host)},
			URIs: []string{devpki.ReplicaIdentity}, Server: true, Client: true})
		c.ClientCAFile = caFile
		c.AuthorizationPolicyFile = "../../deploy/authz/policy.json"
	})
	return d, caFile, func(name, identity string) (string, string) {
		return write(name, devpki.Leaf{URIs: []string{identity}, Client: true})
	}
}

// findGrpcurl returns grpcurl's path, skipping the test without it (outside CI).
func findGrpcurl(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("grpcurl"); err == nil {
		return p
	}
	if p, err := filepath.Abs("../../.bin/grpcurl"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("grpcurl not found: `make tools` installs it into .bin")
	}
	t.Skip("grpcurl not found: run `make tools` (CI runs this test)")
	return ""
}
