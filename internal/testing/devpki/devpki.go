package devpki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// The identities of the example authorization policies, URI SANs: a replica's (every
// allocd's server certificate, which it also presents when it forwards a call to
// another replica), and the prefixes of the shims', operators' and admins'.
const (
	// ReplicaIdentity is every replica's identity.
	ReplicaIdentity = "spiffe://allocd.local/replica"
	// ShimIdentity is the prefix of the shims' identities.
	ShimIdentity = "spiffe://allocd.local/shim/"
	// OperatorIdentity is the prefix of the operators' identities.
	OperatorIdentity = "spiffe://allocd.local/operator/"
	// AdminIdentity is the prefix of the admins' identities.
	AdminIdentity = "spiffe://allocd.local/admin/"
)

// CA is a certificate authority.
type CA struct {
	Cert *x509.Certificate
	key  crypto.Signer
	// PEM is Cert in PEM, the content of a CA file.
	PEM []byte
}

// NewCA returns a new self-signed CA valid for ten years.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, key: key,
		PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// KeyPEM returns the CA's private key in PEM (to issue more certificates later).
func (ca *CA) KeyPEM() ([]byte, error) { return keyPEM(ca.key) }

// Leaf describes a certificate to issue.
type Leaf struct {
	// CommonName is the subject's CN.
	CommonName string
	// DNS, IPs and URIs are the subject alternative names. The authorization
	// policies match the first URI SAN kind present: URIs, else DNS names, else the
	// subject.
	DNS  []string
	IPs  []net.IP
	URIs []string
	// Server and Client set the extended key usages (both for a replica's
	// certificate, which serves and also dials other replicas).
	Server, Client bool
	// NotBefore and NotAfter default to an hour ago and a year from now.
	NotBefore, NotAfter time.Time
}

// Issue returns a certificate for l signed by ca, and its new key, both in PEM.
func (ca *CA) Issue(l Leaf) (certPEM, keyPEMBytes []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: l.CommonName},
		NotBefore:    l.NotBefore,
		NotAfter:     l.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		DNSNames:     l.DNS,
		IPAddresses:  l.IPs,
	}
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore = time.Now().Add(-time.Hour)
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = time.Now().Add(365 * 24 * time.Hour)
	}
	for _, u := range l.URIs {
		pu, err := url.Parse(u)
		if err != nil {
			return nil, nil, fmt.Errorf("URI SAN %q: %w", u, err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	if l.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if l.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.key)
	if err != nil {
		return nil, nil, err
	}
	kp, err := keyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), kp, nil
}

func keyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

// WriteFiles writes certPEM and keyPEM to dir/name.crt and dir/name.key, each
// replaced whole (written beside and renamed), and returns their paths. The key is
// readable by anyone: these are throwaway keys (see the package doc).
func WriteFiles(dir, name string, certPEM, keyPEM []byte) (certFile, keyFile string, err error) {
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := writeFile(certFile, certPEM); err != nil {
		return "", "", err
	}
	if err := writeFile(keyFile, keyPEM); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// writeFile replaces path with data by a rename, so that a reader sees the old file
// or the new one, never half of one.
func writeFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
