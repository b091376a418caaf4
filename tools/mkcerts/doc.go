// Command mkcerts writes a throwaway CA and certificates for allocd with TLS into a
// directory (`make certs`: deploy/certs, which docker compose mounts): ca.crt and
// ca.key; server.crt/.key, the replicas' certificate (server and client auth, the
// replica identity, DNS names localhost, allocd-1 and allocd-2 and those of -hosts,
// IPs 127.0.0.1 and ::1); and one client certificate per role of the example
// authorization policies in deploy/authz: shim, operator and admin. The server's key
// is readable by anyone (the containers' non-root user reads it), the others by their
// owner only: never use them in production.
//
//	go run ./tools/mkcerts -out deploy/certs [-hosts allocd.example.com]
//
// With -kube NAMESPACE it writes instead the set that deploy/kube's manifests mount in
// that namespace (allocd's replicas, etcd's own CA, members and allocd's client
// certificate for it, the bridge's and the webhook's client certificates, the webhook's
// serving certificate, an operator's and an admin's), and prints the kubectl commands
// that make the Secrets from them:
//
//	go run ./tools/mkcerts -kube kube-system -out deploy/certs/kube
package main
