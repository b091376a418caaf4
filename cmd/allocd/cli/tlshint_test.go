package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/allocd/allocd/internal/testing/devpki"
	"github.com/allocd/allocd/tlsfiles"
)

// TestTLSHint: a connection that cannot start TLS says which TLS flag to change, from
// the handshake's own error, against real servers on loopback: one in plaintext, one
// with TLS that asks for client certificates of its CA.
func TestTLSHint(t *testing.T) {
	ca, other := newCA(t, "allocd test CA"), newCA(t, "another CA")
	srvCert, srvKey, err := ca.Issue(devpki.Leaf{CommonName: "allocd", IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		Server: true})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	clients := x509.NewCertPool()
	clients.AddCert(ca.Cert)
	plain := serveHealth(t, nil)
	secure := serveHealth(t, credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clients}))
	refused := plain.Addr().String()
	plain.Close() // nothing listens there any more

	dir := t.TempDir()
	caFile, otherCAFile := writeCA(t, dir, "ca", ca), writeCA(t, dir, "other", other)
	mine, foreign := issueClient(t, dir, "mine", ca), issueClient(t, dir, "foreign", other)
	for _, tc := range []struct {
		name  string
		addr  string
		files tlsfiles.Files
		want  string // in the hint; "" for no hint
	}{
		{"plaintext server", serveHealth(t, nil).Addr().String(), with(caFile, mine), "serves plaintext"},
		{"server certificate of another CA", secure.Addr().String(), with(otherCAFile, mine),
			"--tls-ca-file"},
		{"client certificate of another CA", secure.Addr().String(), with(caFile, foreign),
			"--tls-cert-file"},
		{"no client certificate", secure.Addr().String(), tlsfiles.Files{CAFile: caFile}, "--tls-cert-file"},
		{"nothing listening", refused, with(caFile, mine), ""},
		{"all right", secure.Addr().String(), with(caFile, mine), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tlsfiles.NewClient(tc.files)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			cc, err := grpc.NewClient(tc.addr, c.DialOption())
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
			if (err == nil) != (tc.name == "all right") {
				t.Fatalf("Check() = %v", err)
			}
			got := tlsHint(c.HandshakeError())
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Errorf("tlsHint(%v) = %q; want it to mention %q", c.HandshakeError(), got, tc.want)
			}
		})
	}
}

// serveHealth serves grpc.health.v1 on loopback (creds nil: in plaintext) until the
// test ends.
func serveHealth(t *testing.T, creds credentials.TransportCredentials) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis
}

func newCA(t *testing.T, name string) *devpki.CA {
	t.Helper()
	ca, err := devpki.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func writeCA(t *testing.T, dir, name string, ca *devpki.CA) string {
	t.Helper()
	path := filepath.Join(dir, name+".crt")
	if err := os.WriteFile(path, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issueClient writes a client certificate of ca and its key in dir.
func issueClient(t *testing.T, dir, name string, ca *devpki.CA) tlsfiles.Files {
	t.Helper()
	crt, key, err := ca.Issue(devpki.Leaf{CommonName: name, URIs: []string{devpki.ShimIdentity + name},
		Client: true})
	if err != nil {
		t.Fatal(err)
	}
	crtFile, keyFile, err := devpki.WriteFiles(dir, name, crt, key)
	if err != nil {
		t.Fatal(err)
	}
	return tlsfiles.Files{CertFile: crtFile, KeyFile: keyFile}
}

// with returns the client files f verifying the server against caFile.
func with(caFile string, f tlsfiles.Files) tlsfiles.Files {
	f.CAFile = caFile
	return f
}
