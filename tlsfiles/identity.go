package tlsfiles

import (
	"context"
	"crypto/x509"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// PeerCertificate is the verified client certificate of a gRPC call (nil: none, or a
// plaintext connection).
func PeerCertificate(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return nil
	}
	return info.State.PeerCertificates[0]
}

// Identity is what an authorization policy's principals are matched against, as
// grpc-go's RBAC engine does (internal/xds/rbac authenticatedMatcher): the URI SANs if
// the certificate has any, else its DNS SANs, else its subject (RFC 2253 string).
// With several SANs of the kind, they are joined by commas.
func Identity(cert *x509.Certificate) string {
	switch {
	case len(cert.URIs) > 0:
		ids := make([]string, len(cert.URIs))
		for i, u := range cert.URIs {
			ids[i] = u.String()
		}
		return strings.Join(ids, ",")
	case len(cert.DNSNames) > 0:
		return strings.Join(cert.DNSNames, ",")
	}
	return cert.Subject.String()
}

// PeerIdentity is the Identity of the call's client certificate, "" without one.
func PeerIdentity(ctx context.Context) string {
	if cert := PeerCertificate(ctx); cert != nil {
		return Identity(cert)
	}
	return ""
}
