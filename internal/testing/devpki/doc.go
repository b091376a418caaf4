// Package devpki issues throwaway certificates with crypto/x509: a CA, server
// certificates and client certificates with the identities allocd's example
// authorization policies name (deploy/authz). Tests use it to run allocd with TLS on
// loopback; `make certs` (mkcerts) writes a set for docker compose and for trying TLS
// by hand. Never use its keys in production: they are written readable by anyone, so
// that a container's non-root user can read them.
//
//	ca, err := devpki.NewCA("allocd test CA")
//	if err != nil { ... }
//	crt, key, err := ca.Issue(devpki.Leaf{URIs: []string{devpki.ShimIdentity + "apiserver-1"},
//		Client: true})
package devpki
