package tlsfiles

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/tls/certprovider"
	"google.golang.org/grpc/credentials/tls/certprovider/pemfile"
	"google.golang.org/grpc/security/advancedtls"
)

// DefaultRefresh is how often the files are read again unless Files.Refresh says
// otherwise: a rotated certificate is served within this long.
const DefaultRefresh = 10 * time.Second

// Files names the PEM files of one side of a connection.
type Files struct {
	// CertFile and KeyFile are this side's certificate (with its chain) and private
	// key. They go together and must be in one directory: grpc-go's pemfile provider
	// reads them as a pair. A server needs them; a client presents them when set.
	CertFile, KeyFile string
	// CAFile holds the CA certificates the peer's certificate is verified against. A
	// server with a CAFile asks for client certificates and verifies those it gets; a
	// server without one does not ask. A client without one verifies the server
	// against the system roots.
	CAFile string
	// Refresh is how often the files are read again; 0 means DefaultRefresh.
	Refresh time.Duration
}

func (f Files) refresh() time.Duration {
	if f.Refresh > 0 {
		return f.Refresh
	}
	return DefaultRefresh
}

// Errors of the files, for errors.Is.
var (
	// ErrPair is the error of a certificate given without its key or a key without its
	// certificate, or of the two in different directories.
	ErrPair = errors.New("certificate and key go together, in one directory")
	// ErrKeyMismatch is the error of a private key that is not the certificate's.
	ErrKeyMismatch = errors.New("private key does not match the certificate")
	// ErrNoCertificate is the error of a CA bundle without a PEM certificate.
	ErrNoCertificate = errors.New("no PEM certificate in it")
)

// CheckKeyPair reads a certificate and its key once and returns the certificate (the
// leaf), or an error that names the file at fault.
func CheckKeyPair(certFile, keyFile string) (*x509.Certificate, error) {
	if (certFile == "") != (keyFile == "") || filepath.Dir(certFile) != filepath.Dir(keyFile) {
		return nil, fmt.Errorf("%s, %s: %w", certFile, keyFile, ErrPair)
	}
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		if mismatched(certPEM, keyPEM) {
			err = ErrKeyMismatch
		}
		return nil, fmt.Errorf("%s, %s: %w", certFile, keyFile, err)
	}
	return pair.Leaf, nil
}

// mismatched reports whether the first certificate of certPEM and the private key of
// keyPEM both parse and the key is not the certificate's: crypto/tls says so only in
// the text of its error.
func mismatched(certPEM, keyPEM []byte) bool {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return false
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return false
	}
	var key any
	switch kb.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(kb.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(kb.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(kb.Bytes)
	}
	signer, ok := key.(crypto.Signer)
	if err != nil || !ok {
		return false
	}
	pub, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	return ok && !pub.Equal(signer.Public())
}

// CheckCA reads a CA bundle once and says whether it holds at least one certificate.
func CheckCA(caFile string) error {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	if !x509.NewCertPool().AppendCertsFromPEM(pem) {
		return fmt.Errorf("%s: %w", caFile, ErrNoCertificate)
	}
	return nil
}

// Server is the TLS side of a listener over Files: its certificate and the client CAs
// are read again every Refresh. Close stops that.
type Server struct {
	identity certprovider.Provider
	roots    certprovider.Provider // nil: client certificates are not asked for
}

// NewServer checks the files (CertFile and KeyFile are required) and starts reading
// them every Refresh.
func NewServer(f Files) (*Server, error) {
	if f.CertFile == "" {
		return nil, fmt.Errorf("tlsfiles: a server needs a certificate: %w", ErrPair)
	}
	if _, err := CheckKeyPair(f.CertFile, f.KeyFile); err != nil {
		return nil, fmt.Errorf("tlsfiles: %w", err)
	}
	if f.CAFile != "" {
		if err := CheckCA(f.CAFile); err != nil {
			return nil, fmt.Errorf("tlsfiles: %w", err)
		}
	}
	id, err := pemfile.NewProvider(pemfile.Options{CertFile: f.CertFile, KeyFile: f.KeyFile,
		RefreshDuration: f.refresh()})
	if err != nil {
		return nil, fmt.Errorf("tlsfiles: %w", err)
	}
	s := &Server{identity: id}
	if f.CAFile != "" {
		if s.roots, err = pemfile.NewProvider(pemfile.Options{RootFile: f.CAFile,
			RefreshDuration: f.refresh()}); err != nil {
			id.Close()
			return nil, fmt.Errorf("tlsfiles: %w", err)
		}
	}
	return s, nil
}

// Config returns a tls.Config for a listener (gRPC's through Credentials, or a
// net/http server's) that presents the current certificate. With a CAFile it asks
// for a client certificate and verifies one that is given against the current CAs
// (tls.VerifyClientCertIfGiven): a certificate that does not verify (another CA,
// expired, not for client auth) fails the handshake, while a caller without one
// connects, and authorization decides what it may call.
func (s *Server) Config() *tls.Config {
	getCert := func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		km, err := s.identity.KeyMaterial(hello.Context())
		if err != nil {
			return nil, err
		}
		return &km.Certs[0], nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: getCert}
	if s.roots != nil {
		cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			km, err := s.roots.KeyMaterial(hello.Context())
			if err != nil {
				return nil, err
			}
			return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: getCert,
				ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: km.Roots}, nil
		}
	}
	return cfg
}

// Credentials returns gRPC server credentials over Config.
func (s *Server) Credentials() credentials.TransportCredentials {
	return credentials.NewTLS(s.Config())
}

// Close stops reading the files.
func (s *Server) Close() {
	s.identity.Close()
	if s.roots != nil {
		s.roots.Close()
	}
}

// Client is the TLS side of a connection to an allocd over Files: its CA bundle and
// its certificate, if any, are read again every Refresh. Close stops that.
type Client struct {
	creds      credentials.TransportCredentials
	providers  []certprovider.Provider
	handshakes handshakes
}

// NewClient checks the files and starts reading them every Refresh. The server's
// certificate must name the host dialed (a DNS or IP SAN).
func NewClient(f Files) (*Client, error) {
	c := &Client{}
	opts := &advancedtls.Options{VerificationType: advancedtls.CertAndHostVerification}
	if f.CertFile != "" || f.KeyFile != "" {
		if _, err := CheckKeyPair(f.CertFile, f.KeyFile); err != nil {
			return nil, fmt.Errorf("tlsfiles: %w", err)
		}
		p, err := pemfile.NewProvider(pemfile.Options{CertFile: f.CertFile, KeyFile: f.KeyFile,
			RefreshDuration: f.refresh()})
		if err != nil {
			return nil, fmt.Errorf("tlsfiles: %w", err)
		}
		c.providers = append(c.providers, p)
		opts.IdentityOptions.IdentityProvider = p
	}
	if f.CAFile != "" {
		if err := CheckCA(f.CAFile); err != nil {
			c.Close()
			return nil, fmt.Errorf("tlsfiles: %w", err)
		}
		p, err := pemfile.NewProvider(pemfile.Options{RootFile: f.CAFile, RefreshDuration: f.refresh()})
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("tlsfiles: %w", err)
		}
		c.providers = append(c.providers, p)
		opts.RootOptions.RootProvider = p
	}
	creds, err := advancedtls.NewClientCreds(opts)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("tlsfiles: %w", err)
	}
	c.creds = recording{TransportCredentials: creds, h: &c.handshakes}
	return c, nil
}

// Credentials returns the gRPC client credentials.
func (c *Client) Credentials() credentials.TransportCredentials { return c.creds }

// DialOption returns the credentials as a dial option, for grpc.NewClient or
// client.WithDialOptions.
func (c *Client) DialOption() grpc.DialOption { return grpc.WithTransportCredentials(c.creds) }

// Close stops reading the files.
func (c *Client) Close() {
	for _, p := range c.providers {
		p.Close()
	}
}
