package kube

import (
	"context"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// webhookManifest is the webhook's deployment manifest, from the repository: the test
// registers its MutatingWebhookConfiguration and grants its ClusterRole.
const webhookManifest = "../../deploy/kube/allocd-webhook.yaml"

// webhookConfig says how to run the webhook for a cluster.
type webhookConfig struct {
	// replicas is how many webhook processes serve (2 when 0).
	replicas int
	// failurePolicy of the registration (the manifest's when empty).
	failurePolicy admissionregistrationv1.FailurePolicyType
	// timeoutSeconds of the registration (the manifest's when 0).
	timeoutSeconds int32
	// extra are more arguments of every replica.
	extra []string
}

// webhookSide is the admission webhook of one cluster: its replicas as processes
// (allocd-bridge webhook), each on its own port, behind a balancer on loopback that
// stands in for the webhook's Service (a new connection goes to the next replica that
// accepts it), and the MutatingWebhookConfiguration that sends kube-apiserver there
// over TLS, its CA bundle the test PKI's.
type webhookSide struct {
	t        testing.TB
	Replicas []*proc
	// Health are the replicas' /healthz, /readyz and /metrics addresses.
	Health []string
	// URL is what kube-apiserver calls.
	URL string
	// Config is the registration as created.
	Config *admissionregistrationv1.MutatingWebhookConfiguration
	lb     *balancer
	c      *cluster
}

// startWebhooks starts cfg.replicas webhook replicas for cluster c against allocd (s),
// waits until every one is ready, and registers them with c's kube-apiserver. The
// replicas use a kubeconfig of a user bound to the manifest's ClusterRole.
func startWebhooks(t testing.TB, c *cluster, s *allocdSide, cfg webhookConfig) *webhookSide {
	t.Helper()
	if cfg.replicas == 0 {
		cfg.replicas = 2
	}
	role, reg := webhookObjects(t)
	grant(t, c.Admin, role, "webhook-user")
	kubeconfig := c.pki.kubeconfig(t, "webhook", c.URL, pkix.Name{CommonName: "webhook-user"})
	cert, key := c.pki.issue(t, "webhook-serving", pkix.Name{CommonName: "allocd-webhook"}, true)
	w := &webhookSide{t: t, c: c}
	var backends []string
	for i := range cfg.replicas {
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		health := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		args := append([]string{"webhook",
			"--kubeconfig=" + kubeconfig,
			"--allocd-address=" + s.target(),
			"--webhook-address=" + addr,
			"--tls-cert-file=" + cert,
			"--tls-private-key-file=" + key,
			"--health-address=" + health,
		}, cfg.extra...)
		p := startProc(t, fmt.Sprintf("allocd-webhook-%d", i), binary(t, "allocd-bridge"), args...)
		w.Replicas, w.Health = append(w.Replicas, p), append(w.Health, health)
		backends = append(backends, addr)
	}
	for i, p := range w.Replicas {
		waitHTTP(t, p, "http://"+w.Health[i]+"/readyz", "", 2*time.Minute)
	}
	w.lb = startBalancer(t, backends)
	w.URL = "https://" + w.lb.Addr + "/mutate"
	w.register(t, reg, cfg)
	return w
}

// webhookObjects reads the manifest's ClusterRole and MutatingWebhookConfiguration.
func webhookObjects(t testing.TB) (*rbacv1.ClusterRole,
	*admissionregistrationv1.MutatingWebhookConfiguration) {
	t.Helper()
	b, err := os.ReadFile(filepath.FromSlash(webhookManifest))
	if err != nil {
		t.Fatal(err)
	}
	var role *rbacv1.ClusterRole
	var reg *admissionregistrationv1.MutatingWebhookConfiguration
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s: %v", webhookManifest, err)
		}
		switch meta.Kind {
		case "ClusterRole":
			role = &rbacv1.ClusterRole{}
			err = yaml.UnmarshalStrict([]byte(doc), role)
		case "MutatingWebhookConfiguration":
			reg = &admissionregistrationv1.MutatingWebhookConfiguration{}
			err = yaml.UnmarshalStrict([]byte(doc), reg)
		}
		if err != nil {
			t.Fatalf("%s: %s: %v", webhookManifest, meta.Kind, err)
		}
	}
	if role == nil || reg == nil || len(reg.Webhooks) != 1 {
		t.Fatalf("%s: want a ClusterRole and a MutatingWebhookConfiguration of one webhook", webhookManifest)
	}
	return role, reg
}

// grant creates role (renamed for the test) and binds it to user.
func grant(t testing.TB, cs kubernetes.Interface, role *rbacv1.ClusterRole, user string) {
	t.Helper()
	ctx := context.Background()
	role = role.DeepCopy()
	role.Name += "-e2e"
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// register creates reg with the balancer's URL and the test CA, and waits until
// kube-apiserver calls the webhook (its configuration reaches admission through an
// informer: a create right after the registration may pass unadmitted).
func (w *webhookSide) register(t testing.TB, reg *admissionregistrationv1.MutatingWebhookConfiguration,
	cfg webhookConfig) {
	t.Helper()
	ca, err := os.ReadFile(w.c.pki.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	wh := &reg.Webhooks[0]
	wh.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &w.URL, CABundle: ca}
	if cfg.failurePolicy != "" {
		wh.FailurePolicy = &cfg.failurePolicy
	}
	if cfg.timeoutSeconds != 0 {
		wh.TimeoutSeconds = &cfg.timeoutSeconds
	}
	ctx := context.Background()
	regs := w.c.Admin.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if w.Config, err = regs.Create(ctx, reg, metav1.CreateOptions{}); err != nil {
		t.Fatalf("register the webhook: %v", err)
	}
	before := w.admitted()
	probe := svcSpec{name: "webhook-probe", app: "probe"}.object()
	probe.Namespace = "default"
	etcdtest.WaitFor(t, time.Minute, "kube-apiserver calling the webhook", func() bool {
		_, err := w.c.Admin.CoreV1().Services("default").Create(ctx, probe,
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && w.admitted() > before
	})
}

// admitted is the number of admission requests the replicas answered, from their
// metrics (allocd_webhook_requests_total, every operation and result).
func (w *webhookSide) admitted() float64 {
	var n float64
	for _, h := range w.Health {
		n += metricSum("http://"+h+"/metrics", "allocd_webhook_requests_total")
	}
	return n
}

// metricSum sums the series of metric (any labels) that url serves; 0 when
// unreachable.
func metricSum(url, metric string) float64 {
	var n float64
	for series, v := range scrape(url) {
		if series == metric || strings.HasPrefix(series, metric+"{") {
			n += v
		}
	}
	return n
}

// Unregister deletes the registration: kube-apiserver allocates by itself again.
func (w *webhookSide) Unregister() {
	w.t.Helper()
	err := w.c.Admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(),
		w.Config.Name, metav1.DeleteOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
}

// balancer forwards every TCP connection it accepts to the first of its backends, in
// turn, that accepts one: a Service in front of the webhook's replicas, on loopback.
type balancer struct {
	Addr     string
	ln       net.Listener
	backends []string
	mu       sync.Mutex
	next     int
	wg       sync.WaitGroup
	conns    map[net.Conn]bool
}

func startBalancer(t testing.TB, backends []string) *balancer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &balancer{Addr: ln.Addr().String(), ln: ln, backends: backends, conns: map[net.Conn]bool{}}
	b.wg.Go(b.accept)
	t.Cleanup(b.close)
	return b
}

func (b *balancer) accept() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.wg.Go(func() { b.forward(c) })
	}
}

// forward pipes c to a backend until either side closes.
func (b *balancer) forward(c net.Conn) {
	defer c.Close()
	var up net.Conn
	b.mu.Lock()
	start := b.next
	b.next = (b.next + 1) % len(b.backends)
	b.mu.Unlock()
	for i := range b.backends {
		var err error
		if up, err = net.DialTimeout("tcp", b.backends[(start+i)%len(b.backends)], time.Second); err == nil {
			break
		}
	}
	if up == nil || !b.track(c, up) {
		return
	}
	defer b.untrack(c, up)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	<-done
}

func (b *balancer) track(cs ...net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conns == nil {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		b.conns[c] = true
	}
	return true
}

func (b *balancer) untrack(cs ...net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range cs {
		delete(b.conns, c)
	}
}

// close stops accepting, closes the connections in flight and waits for them.
func (b *balancer) close() {
	_ = b.ln.Close()
	b.mu.Lock()
	for c := range b.conns {
		c.Close()
	}
	b.conns = nil
	b.mu.Unlock()
	b.wg.Wait()
}

// deciding is a cluster where allocd decides: kube-apiserver, allocd, the bridge and the
// webhook's replicas registered with kube-apiserver.
type deciding struct {
	etcd    *etcdtest.Server
	c       *cluster
	allocd  *allocdSide
	webhook *webhookSide
}

// decidingConfig says how to run a deciding cluster.
type decidingConfig struct {
	// allocdReplicas (1 when 0).
	allocdReplicas int
	// bridge are more arguments of the bridge (a short --pending-grace, say).
	bridge  []string
	webhook webhookConfig
}

// startDeciding starts a cluster where allocd decides: one kube-apiserver on a test
// etcd (dual-stack ranges, IPv4 first), allocd on the same etcd, the bridge, then the
// webhook registered with kube-apiserver.
func startDeciding(t testing.TB, cfg decidingConfig) *deciding {
	t.Helper()
	d := &deciding{etcd: etcdtest.New(t)}
	d.c = startCluster(t, clusterConfig{name: "decide", etcd: d.etcd.Endpoint, reconciler: "lease",
		advertise: advertise})
	d.allocd = startAllocd(t, d.etcd.Endpoint, max(cfg.allocdReplicas, 1))
	applyBridgeRBAC(t, d.c.Admin, "bridge-user")
	kubeconfig := d.c.pki.kubeconfig(t, "bridge", d.c.URL, pkix.Name{CommonName: "bridge-user"})
	d.allocd.startBridge(t, d.c, kubeconfig, cfg.bridge...)
	d.webhook = startWebhooks(t, d.c, d.allocd, cfg.webhook)
	return d
}
