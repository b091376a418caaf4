package kube

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestDeployCertificates checks that the certificates `mkcerts -kube kube-system`
// writes, put in the Secrets it prints the commands of, are the ones deploy/kube's
// manifests need, read from the manifests themselves (the flags, the volumes they
// mount, the names they dial):
//
//   - allocd's serving certificate names every replica's --advertise-address (as each
//     replica resolves $(POD_NAME)), the host its exec probes dial, and the host of every
//     client's --allocd-address, verified against the CA each of them trusts; it is also
//     a client certificate (a replica forwarding to the leader) of the replicas' client CA;
//   - every client's certificate (the bridge's, the webhook's) verifies against allocd's
//     --client-ca-file, and carries an identity the policy lets Allocate, Transfer and
//     ListAllocations;
//   - etcd's members name every URL of allocd's --etcd-servers and of their own
//     --initial-cluster, for allocd's --etcd-cafile and for one another;
//   - allocd's etcd client certificate verifies against etcd's --trusted-ca-file, and
//     no client certificate of allocd's does: etcd authorizes nothing by itself;
//   - the webhook's serving certificate names its Service, for the CA bundle (allocd's
//     CA, which signs it).
func TestDeployCertificates(t *testing.T) {
	set := mkcertsKube(t, "kube-system")
	ms := readManifests(t)
	ws := workloads(t, ms)
	var allocds, clients, etcds []podContainer
	for _, w := range ws {
		for _, c := range w.pod.Spec.Containers {
			pc := podContainer{w: w, c: c}
			switch program(c) {
			case "allocd":
				allocds = append(allocds, pc)
			case "etcd":
				etcds = append(etcds, pc)
			case "allocd-bridge":
				if flagValue(c.Args, "allocd-address") != "" {
					clients = append(clients, pc)
				}
			}
		}
	}
	if len(allocds) == 0 || len(etcds) == 0 || len(clients) == 0 {
		t.Fatalf("manifests: %d allocd, %d etcd and %d client containers; want each",
			len(allocds), len(etcds), len(clients))
	}
	policy := manifestPolicy(t)
	for _, a := range allocds {
		checkReplicaCert(t, set, a)
		for _, cl := range clients {
			checkClientCert(t, set, a, cl, policy)
		}
		for _, e := range etcds {
			checkEtcdClient(t, set, a, e, clients)
		}
	}
	targets, err := webhookTargets(ms, ws)
	if err != nil {
		t.Fatal(err)
	}
	for _, wt := range targets {
		// mkcerts signs the webhook's serving certificate with allocd's CA, the caBundle.
		verify(t, wt.pc.String()+" serving webhook "+wt.webhook, set.flagFile(t, wt.pc, "tls-cert-file"),
			set["allocd-tls"]["ca.crt"], wt.host, x509.ExtKeyUsageServerAuth)
	}
	for _, e := range etcds {
		peer, peerCA := set.flagFile(t, e, "peer-cert-file"), set.flagFile(t, e, "peer-trusted-ca-file")
		for _, member := range strings.Split(flagValue(e.c.Args, "initial-cluster"), ",") {
			_, u, _ := strings.Cut(member, "=")
			for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
				verify(t, e.String()+" --initial-cluster", peer, peerCA, urlHost(t, u), usage)
			}
		}
	}
}

// checkReplicaCert checks allocd's certificate for the replicas' names, as the other
// replicas verify it (with --client-ca-file), and for its exec probes.
func checkReplicaCert(t *testing.T, set certSet, a podContainer) {
	t.Helper()
	cert, clientCA := set.flagFile(t, a, "tls-cert-file"), set.flagFile(t, a, "client-ca-file")
	for i := range a.w.replicas {
		host := hostPort(t, a.w.expand(flagValue(a.c.Args, "advertise-address"), i))
		verify(t, a.String()+" --advertise-address", cert, clientCA, host, x509.ExtKeyUsageServerAuth)
	}
	verify(t, a.String()+" forwarding to the leader", cert, clientCA, "", x509.ExtKeyUsageClientAuth)
	for _, p := range []*corev1.Probe{a.c.ReadinessProbe, a.c.LivenessProbe, a.c.StartupProbe} {
		if p == nil || p.Exec == nil {
			continue
		}
		cmd := p.Exec.Command
		verify(t, a.String()+" exec probe", cert, set.file(t, a, flagValue(cmd, "tls-ca-file")),
			hostPort(t, flagValue(cmd, "server")), x509.ExtKeyUsageServerAuth)
	}
}

// checkClientCert checks that client cl verifies allocd a at every address it dials,
// that a verifies cl's client certificate, and that the policy grants its identity what
// the webhook and the bridge call.
func checkClientCert(t *testing.T, set certSet, a, cl podContainer, policy authzPolicy) {
	t.Helper()
	cert, ca := set.flagFile(t, a, "tls-cert-file"), set.flagFile(t, cl, "allocd-ca-file")
	targets := strings.TrimPrefix(flagValue(cl.c.Args, "allocd-address"), "dns:///")
	for _, target := range strings.Split(targets, ",") {
		verify(t, cl.String()+" --allocd-address", cert, ca, hostPort(t, target), x509.ExtKeyUsageServerAuth)
	}
	clientCert := set.flagFile(t, cl, "allocd-cert-file")
	verify(t, cl.String()+" --allocd-cert-file", clientCert, set.flagFile(t, a, "client-ca-file"), "",
		x509.ExtKeyUsageClientAuth)
	for _, method := range []string{"Allocate", "Transfer", "ListAllocations"} {
		if id := identity(t, clientCert); !policy.allows(id, "/allocd.v1.AllocatorService/"+method) {
			t.Errorf("%s: the policy does not let %q (its client certificate) call %s", cl, id, method)
		}
	}
}

// checkEtcdClient checks allocd a against etcd member e: a verifies e at every URL of
// --etcd-servers, e verifies a's client certificate, and no client of allocd's opens e.
func checkEtcdClient(t *testing.T, set certSet, a, e podContainer, clients []podContainer) {
	t.Helper()
	trusted := set.flagFile(t, e, "trusted-ca-file")
	for _, u := range strings.Split(flagValue(a.c.Args, "etcd-servers"), ",") {
		verify(t, a.String()+" --etcd-servers", set.flagFile(t, e, "cert-file"),
			set.flagFile(t, a, "etcd-cafile"), urlHost(t, u), x509.ExtKeyUsageServerAuth)
	}
	verify(t, a.String()+" --etcd-certfile", set.flagFile(t, a, "etcd-certfile"), trusted, "",
		x509.ExtKeyUsageClientAuth)
	for _, cl := range clients {
		err := verifyErr(set.flagFile(t, cl, "allocd-cert-file"), trusted, "", x509.ExtKeyUsageClientAuth)
		if err == nil {
			t.Errorf("%s: its client certificate for allocd also opens etcd (%s's --trusted-ca-file)", cl, e)
		}
	}
}

// podContainer is one container of a workload.
type podContainer struct {
	w workload
	c corev1.Container
}

func (pc podContainer) String() string { return pc.w.m.String() + " container " + pc.c.Name }

// certSet is what mkcerts -kube wrote: Secret → key → file.
type certSet map[string]map[string]string

// mkcertsKube runs mkcerts -kube ns into a temporary directory and reads the kubectl
// commands it prints.
func mkcertsKube(t *testing.T, ns string) certSet {
	t.Helper()
	out, err := exec.Command(binary(t, "mkcerts"), "-kube", ns, "-out", t.TempDir()).Output()
	if err != nil {
		t.Fatalf("mkcerts -kube %s: %v", ns, err)
	}
	set := certSet{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 7 || f[0] != "kubectl" || f[3] != "create" || f[4] != "secret" || f[5] != "generic" {
			continue
		}
		set[f[6]] = map[string]string{}
		for _, arg := range f[7:] {
			kv, _ := strings.CutPrefix(arg, "--from-file=")
			k, v, _ := strings.Cut(kv, "=")
			set[f[6]][k] = v
		}
	}
	if len(set) == 0 {
		t.Fatalf("mkcerts -kube %s printed no kubectl create secret command:\n%s", ns, out)
	}
	return set
}

// file is the file mkcerts wrote for path in pc: the Secret of the volume mounted at
// path's directory, and the key path names in it.
func (s certSet) file(t *testing.T, pc podContainer, path string) string {
	t.Helper()
	if path == "" {
		t.Fatalf("%s: a TLS flag the test needs is not set", pc)
	}
	for _, vm := range pc.c.VolumeMounts {
		key, ok := strings.CutPrefix(path, strings.TrimSuffix(vm.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range pc.w.pod.Spec.Volumes {
			if v.Name != vm.Name || v.Secret == nil {
				continue
			}
			for _, item := range v.Secret.Items {
				if item.Path == key {
					key = item.Key
				}
			}
			f, ok := s[v.Secret.SecretName][key]
			if !ok {
				t.Fatalf("%s reads %s: key %s of Secret %s, which mkcerts -kube does not make", pc, path, key,
					v.Secret.SecretName)
			}
			return f
		}
	}
	t.Fatalf("%s reads %s, which no Secret volume of it holds", pc, path)
	return ""
}

// flagFile is the file mkcerts wrote for the path of pc's flag.
func (s certSet) flagFile(t *testing.T, pc podContainer, flag string) string {
	t.Helper()
	return s.file(t, pc, flagValue(pc.c.Args, flag))
}

// verify fails the test unless certFile verifies against caFile for usage (and host,
// when given).
func verify(t *testing.T, what, certFile, caFile, host string, usage x509.ExtKeyUsage) {
	t.Helper()
	if err := verifyErr(certFile, caFile, host, usage); err != nil {
		t.Errorf("%s: %v", what, err)
	}
}

func verifyErr(certFile, caFile, host string, usage x509.ExtKeyUsage) error {
	cert, err := readCert(certFile)
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	opts := x509.VerifyOptions{DNSName: host, Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}
	_, err = cert.Verify(opts)
	return err
}

func readCert(file string) (*x509.Certificate, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, &os.PathError{Op: "read certificate", Path: file, Err: os.ErrInvalid}
	}
	return x509.ParseCertificate(block.Bytes)
}

// identity is the identity allocd's policy sees in a client certificate: its first
// URI SAN (the example certificates all have one).
func identity(t *testing.T, certFile string) string {
	t.Helper()
	cert, err := readCert(certFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(cert.URIs) == 0 {
		t.Fatalf("%s has no URI SAN", certFile)
	}
	return cert.URIs[0].String()
}

func hostPort(t *testing.T, s string) string {
	t.Helper()
	h, _, err := net.SplitHostPort(s)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return h
}

func urlHost(t *testing.T, s string) string {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil || u.Hostname() == "" {
		t.Fatalf("URL %q: %v", s, err)
	}
	return u.Hostname()
}

// authzPolicy is the part of a gRPC authorization policy the test reads: who may call
// which paths (a trailing * matches a prefix, as in grpc-go's authz).
type authzPolicy struct {
	AllowRules []struct {
		Source struct {
			Principals []string `json:"principals"`
		} `json:"source"`
		Request struct {
			Paths []string `json:"paths"`
		} `json:"request"`
	} `json:"allow_rules"`
}

// manifestPolicy is the policy of the ConfigMap of deploy/ that carries policy.json.
func manifestPolicy(t *testing.T) authzPolicy {
	t.Helper()
	for _, m := range readManifests(t) {
		if s, ok, _ := unstructured.NestedString(m.obj.Object, "data", "policy.json"); ok {
			var p authzPolicy
			if err := json.Unmarshal([]byte(s), &p); err != nil {
				t.Fatalf("%s: policy.json: %v", m, err)
			}
			return p
		}
	}
	t.Fatal("no ConfigMap under deploy/ carries policy.json")
	return authzPolicy{}
}

func (p authzPolicy) allows(principal, path string) bool {
	match := func(pattern, s string) bool {
		if pre, ok := strings.CutSuffix(pattern, "*"); ok {
			return strings.HasPrefix(s, pre)
		}
		return pattern == s
	}
	for _, r := range p.AllowRules {
		okPrincipal := len(r.Source.Principals) == 0
		for _, pr := range r.Source.Principals {
			okPrincipal = okPrincipal || match(pr, principal)
		}
		for _, pa := range r.Request.Paths {
			if okPrincipal && match(pa, path) {
				return true
			}
		}
	}
	return false
}
