package kube

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// pki is a throwaway CA with the certificates and keys one test cluster needs, as files
// in dir: the API server's serving certificate (127.0.0.1), client certificates, and the
// service-account signing key.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	CAFile string
	// ServerCert and ServerKey serve the API server on 127.0.0.1.
	ServerCert, ServerKey string
	// SAKey and SAPub sign and verify service-account tokens.
	SAKey, SAPub string
}

func newPKI(t testing.TB) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "allocd-e2e-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("CA: %v", err)
	}
	p.caCert, _ = x509.ParseCertificate(der)
	p.caKey = key
	p.CAFile = p.writePEM(t, "ca.crt", "CERTIFICATE", der)
	p.ServerCert, p.ServerKey = p.issue(t, "server", pkix.Name{CommonName: "kube-apiserver"}, true)
	sa := newKey(t)
	skey, _ := x509.MarshalPKCS8PrivateKey(sa)
	spub, _ := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	p.SAKey = p.writePEM(t, "sa.key", "PRIVATE KEY", skey)
	p.SAPub = p.writePEM(t, "sa.pub", "PUBLIC KEY", spub)
	return p
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("key: %v", err)
	}
	return key
}

var serial int64 = 1

// issue writes a certificate and key signed by the CA: a serving one for 127.0.0.1 and
// localhost, or a client one for subject (the user is its CN, the groups its O).
func (p *pki) issue(t testing.TB, name string, subject pkix.Name, server bool) (certFile, keyFile string) {
	t.Helper()
	key := newKey(t)
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      subject,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatalf("certificate %s: %v", name, err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	return p.writePEM(t, name+".crt", "CERTIFICATE", der), p.writePEM(t, name+".key", "PRIVATE KEY", kder)
}

func (p *pki) writePEM(t testing.TB, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// kubeconfig writes a kubeconfig for the API server at url as the user of a client
// certificate with subject, and returns its path.
func (p *pki) kubeconfig(t testing.TB, name, url string, subject pkix.Name) string {
	t.Helper()
	cert, key := p.issue(t, name, subject, false)
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: e2e
  context: {cluster: e2e, user: %s}
current-context: e2e
`, url, p.CAFile, name, cert, key, name)
	path := filepath.Join(p.dir, name+".kubeconfig")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
