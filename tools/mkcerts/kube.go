package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/allocd/allocd/internal/testing/devpki"
)

// kubeCert is one certificate of the set for a cluster: its files' name, what it is
// issued for, and whether etcd's CA signs it (allocd's otherwise).
type kubeCert struct {
	name string
	leaf devpki.Leaf
	etcd bool
}

// kubeCerts is the set deploy/kube's manifests mount, for namespace ns: allocd's CA
// signs the replicas', the shims' (the bridge, the webhook), the webhook's serving and
// the operator's and admin's certificates; etcd has a CA of its own, so that no
// certificate of allocd's CA opens etcd (which authorizes nothing by itself).
func kubeCerts(ns string) []kubeCert {
	local := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	svc := func(name string) string { return name + "." + ns + ".svc" }
	return []kubeCert{
		{name: "allocd", leaf: devpki.Leaf{CommonName: "allocd",
			DNS: []string{svc("allocd"), "*." + svc("allocd-peers"), "localhost"}, IPs: local,
			URIs: []string{devpki.ReplicaIdentity}, Server: true, Client: true}},
		// The bridge and its webhook are one program, allocd-bridge, with one identity:
		// the example policy grants it Transfer (binding what the webhook allocated).
		{name: "bridge", leaf: devpki.Leaf{CommonName: "allocd-bridge",
			URIs: []string{devpki.ShimIdentity + "allocd-bridge"}, Client: true}},
		{name: "webhook", leaf: devpki.Leaf{CommonName: "allocd-bridge webhook",
			URIs: []string{devpki.ShimIdentity + "allocd-bridge"}, Client: true}},
		{name: "webhook-serving", leaf: devpki.Leaf{CommonName: svc("allocd-webhook"),
			DNS: []string{svc("allocd-webhook")}, Server: true}},
		{name: "operator", leaf: devpki.Leaf{CommonName: "operator",
			URIs: []string{devpki.OperatorIdentity + "alice"}, Client: true}},
		{name: "admin", leaf: devpki.Leaf{CommonName: "admin",
			URIs: []string{devpki.AdminIdentity + "bob"}, Client: true}},
		{name: "etcd", etcd: true, leaf: devpki.Leaf{CommonName: "allocd-etcd",
			DNS: []string{"*." + svc("allocd-etcd"), svc("allocd-etcd"), "localhost"}, IPs: local,
			Server: true, Client: true}},
		{name: "etcd-client", etcd: true, leaf: devpki.Leaf{CommonName: "allocd", Client: true}},
	}
}

// kubeSecrets are the Secrets of deploy/kube: their names, and for each the files of
// the set behind ca.crt (none: "") and tls.crt, tls.key. allocd-webhook-tls is the
// webhook's serving certificate, signed by allocd's CA: ca.crt is the caBundle of its
// MutatingWebhookConfiguration.
var kubeSecrets = []struct{ name, ca, cert string }{
	{"allocd-etcd-tls", "etcd-ca", "etcd"},
	{"allocd-etcd-client", "etcd-ca", "etcd-client"},
	{"allocd-tls", "ca", "allocd"},
	{"allocd-bridge-tls", "ca", "bridge"},
	{"allocd-webhook-client", "ca", "webhook"},
	{"allocd-webhook-tls", "", "webhook-serving"},
}

// writeKube writes the set for namespace ns into dir, and to out the kubectl commands
// that make its Secrets.
func writeKube(dir, ns string, out io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cas := map[bool]*devpki.CA{}
	for _, etcd := range []bool{false, true} {
		name, file := "allocd CA", "ca"
		if etcd {
			name, file = "allocd etcd CA", "etcd-ca"
		}
		ca, err := devpki.NewCA(name)
		if err != nil {
			return err
		}
		key, err := ca.KeyPEM()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, file+".crt"), ca.PEM, 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, file+".key"), key, 0o600); err != nil {
			return err
		}
		cas[etcd] = ca
	}
	for _, c := range kubeCerts(ns) {
		crt, key, err := cas[c.etcd].Issue(c.leaf)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		_, keyFile, err := devpki.WriteFiles(dir, c.name, crt, key)
		if err != nil {
			return err
		}
		if err := os.Chmod(keyFile, 0o600); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "# wrote the certificates and keys of deploy/kube for namespace %s to %s; "+
		"its Secrets:\n", ns, filepath.Clean(dir))
	for _, s := range kubeSecrets {
		var from []string
		if s.ca != "" {
			from = append(from, "--from-file=ca.crt="+filepath.Join(dir, s.ca+".crt"))
		}
		from = append(from, "--from-file=tls.crt="+filepath.Join(dir, s.cert+".crt"),
			"--from-file=tls.key="+filepath.Join(dir, s.cert+".key"))
		fmt.Fprintf(out, "kubectl -n %s create secret generic %s %s\n", ns, s.name, strings.Join(from, " "))
	}
	return nil
}
