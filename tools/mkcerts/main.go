package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/allocd/allocd/internal/testing/devpki"
)

func main() {
	out := flag.String("out", "deploy/certs",
		"directory to write the certificates and keys to (created if missing)")
	hosts := flag.String("hosts", "", "more DNS names or IPs of the server certificate, comma separated")
	kube := flag.String("kube", "",
		"write instead the set of deploy/kube's manifests for this namespace, and print the kubectl "+
			"commands that make their Secrets")
	flag.Parse()
	var err error
	if *kube != "" {
		err = writeKube(*out, *kube, os.Stdout)
	} else {
		err = write(*out, *hosts)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "mkcerts: %v\n", err)
		os.Exit(1)
	}
}

func write(dir, hosts string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ca, err := devpki.NewCA("allocd development CA")
	if err != nil {
		return err
	}
	caKey, err := ca.KeyPEM()
	if err != nil {
		return err
	}
	// The CA's key stays private: only mkcerts needs it, to issue more later.
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca.PEM, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.key"), caKey, 0o600); err != nil {
		return err
	}
	server := devpki.Leaf{CommonName: "allocd", DNS: []string{"localhost", "allocd-1", "allocd-2"},
		IPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, URIs: []string{devpki.ReplicaIdentity},
		Server: true, Client: true}
	for _, h := range strings.Split(hosts, ",") {
		if h = strings.TrimSpace(h); h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			server.IPs = append(server.IPs, ip)
		} else {
			server.DNS = append(server.DNS, h)
		}
	}
	leaves := map[string]devpki.Leaf{
		"server": server,
		"shim": {CommonName: "apiserver-1", URIs: []string{devpki.ShimIdentity + "apiserver-1"},
			Client: true},
		"operator": {CommonName: "operator", URIs: []string{devpki.OperatorIdentity + "alice"}, Client: true},
		"admin":    {CommonName: "admin", URIs: []string{devpki.AdminIdentity + "bob"}, Client: true},
	}
	for name, l := range leaves {
		crt, key, err := ca.Issue(l)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		_, keyFile, err := devpki.WriteFiles(dir, name, crt, key)
		if err != nil {
			return err
		}
		// Only the server's key is read by the containers' non-root user.
		if name != "server" {
			if err := os.Chmod(keyFile, 0o600); err != nil {
				return err
			}
		}
	}
	fmt.Printf("wrote ca, server, shim, operator and admin certificates and keys to %s\n",
		filepath.Clean(dir))
	return nil
}
