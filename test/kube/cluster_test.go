package kube

import (
	"crypto/x509/pkix"
	"fmt"
	"os"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Ranges of the test clusters: dual-stack Service CIDRs, as kube-apiserver's flags.
const (
	serviceCIDRs  = "10.96.0.0/16,fd00:10:96::/112"
	nodePortRange = "30000-32767"
)

// cluster is one real Kubernetes control plane on loopback: a kube-apiserver on the
// shared test etcd (under its own prefix) and, when asked, a kube-controller-manager.
type cluster struct {
	t         testing.TB
	name      string
	pki       *pki
	URL       string
	APIServer *proc
	KCM       *proc
	// Admin is a client with system:masters rights, QPS unlimited (the test's own).
	Admin *kubernetes.Clientset
	// AdminConfig is the path of the admin kubeconfig.
	AdminConfig string
	// AdvertiseAddress is the address kube-apiserver publishes (never dialled: a
	// documentation address, since Endpoints refuse loopback addresses).
	AdvertiseAddress string
}

// clusterConfig says how to run one cluster.
type clusterConfig struct {
	name string
	// etcd is the client URL of the shared etcd.
	etcd string
	// reconciler is kube-apiserver's --endpoint-reconciler-type: lease, or none when
	// allocd's master leases stand in.
	reconciler string
	// controllers is kube-controller-manager's --controllers; empty: none runs.
	controllers string
	// advertise is the API server's --advertise-address.
	advertise string
}

func startCluster(t testing.TB, cfg clusterConfig) *cluster {
	t.Helper()
	c := &cluster{t: t, name: cfg.name, pki: newPKI(t), AdvertiseAddress: cfg.advertise}
	port := freePort(t)
	c.URL = fmt.Sprintf("https://127.0.0.1:%d", port)
	args := []string{
		"--etcd-servers=" + cfg.etcd,
		"--etcd-prefix=/" + cfg.name,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port),
		"--advertise-address=" + cfg.advertise,
		"--tls-cert-file=" + c.pki.ServerCert,
		"--tls-private-key-file=" + c.pki.ServerKey,
		"--client-ca-file=" + c.pki.CAFile,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + c.pki.SAPub,
		"--service-account-signing-key-file=" + c.pki.SAKey,
		"--service-cluster-ip-range=" + serviceCIDRs,
		"--service-node-port-range=" + nodePortRange,
		"--authorization-mode=RBAC",
		// Pods are created by the test without service accounts (no controller makes them).
		"--disable-admission-plugins=ServiceAccount",
		"--endpoint-reconciler-type=" + cfg.reconciler,
		"--enable-priority-and-fairness=false",
		fmt.Sprintf("--profiling=%v", os.Getenv("KUBE_E2E_PROFILE") != ""),
		"--max-requests-inflight=2000",
		"--max-mutating-requests-inflight=1000",
		"--v=1",
	}
	c.APIServer = startProc(t, cfg.name+"-kube-apiserver", binary(t, "kube-apiserver"), args...)
	waitHTTP(t, c.APIServer, c.URL+"/readyz", c.pki.CAFile, 3*time.Minute)
	c.AdminConfig = c.pki.kubeconfig(t, "admin", c.URL, pkix.Name{CommonName: "e2e-admin",
		Organization: []string{"system:masters"}})
	c.Admin = c.clientset(c.AdminConfig, 0)
	if cfg.controllers != "" {
		c.KCM = startProc(t, cfg.name+"-kube-controller-manager", binary(t, "kube-controller-manager"),
			"--kubeconfig="+c.AdminConfig,
			"--controllers="+cfg.controllers,
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", freePort(t)),
			"--use-service-account-credentials=false",
			"--v=1",
		)
	}
	return c
}

// clientset returns a client from kubeconfig; qps 0 means no client-side limit.
func (c *cluster) clientset(kubeconfig string, qps float32) *kubernetes.Clientset {
	c.t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		c.t.Fatal(err)
	}
	// Protobuf, as kube-controller-manager talks to the API server: JSON would cost
	// the API server more CPU for the test's own requests than for the controllers'.
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	// The test reads and writes Endpoints on purpose: no deprecation warning per call.
	rc.WarningHandler = rest.NoWarnings{}
	if qps == 0 {
		rc.QPS, rc.Burst = -1, 0
	} else {
		rc.QPS, rc.Burst = qps, int(qps)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		c.t.Fatal(err)
	}
	return cs
}

// RestartAPIServer kills kube-apiserver and starts it again on the same port and etcd.
func (c *cluster) RestartAPIServer() {
	c.t.Helper()
	c.APIServer.Kill()
	c.APIServer.Start()
	waitHTTP(c.t, c.APIServer, c.URL+"/readyz", c.pki.CAFile, 3*time.Minute)
}
