package daemon

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/authz"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/internal/testing/devpki"
	"github.com/allocd/allocd/internal/testing/etcdtest"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
	"github.com/allocd/allocd/tlsfiles"
)

// examplePolicy is the policy the repository ships: the tests check what it grants.
const examplePolicy = "../../../deploy/authz/policy.json"

// testPKI is a CA of a test, and certificates it issued, in files under dir.
type testPKI struct {
	t      *testing.T
	dir    string
	ca     *devpki.CA
	caFile string
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	ca, err := devpki.NewCA("allocd test CA")
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{t: t, dir: t.TempDir(), ca: ca}
	p.caFile = filepath.Join(p.dir, "ca.crt")
	if err := os.WriteFile(p.caFile, ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// issue writes a certificate for l into a directory of its own (name) and returns
// its certificate and key files; issuing again under a name replaces its files.
func (p *testPKI) issue(name string, l devpki.Leaf) (certFile, keyFile string) {
	p.t.Helper()
	dir := filepath.Join(p.dir, strings.NewReplacer(":", "_", "/", "_").Replace(name))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		p.t.Fatal(err)
	}
	crt, key, err := p.ca.Issue(l)
	if err != nil {
		p.t.Fatal(err)
	}
	certFile, keyFile, err = devpki.WriteFiles(dir, "tls", crt, key)
	if err != nil {
		p.t.Fatal(err)
	}
	return certFile, keyFile
}

// dial connects to addr over TLS with the CA of p, presenting l's certificate (none
// when l is nil).
func (p *testPKI) dial(addr string, l *devpki.Leaf) *grpc.ClientConn {
	p.t.Helper()
	files := tlsfiles.Files{CAFile: p.caFile}
	if l != nil {
		files.CertFile, files.KeyFile = p.issue("client-"+l.CommonName, *l)
	}
	return dialFiles(p.t, addr, files)
}

func dialFiles(t *testing.T, addr string, files tlsfiles.Files) *grpc.ClientConn {
	t.Helper()
	c, err := tlsfiles.NewClient(files)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(c.Credentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// replicaLeaf is the certificate of a replica listening on addrs.
func replicaLeaf(addrs ...string) devpki.Leaf {
	l := devpki.Leaf{CommonName: "allocd", URIs: []string{devpki.ReplicaIdentity}, Server: true, Client: true}
	for _, a := range addrs {
		host, _, _ := net.SplitHostPort(a)
		l.IPs = append(l.IPs, net.ParseIP(host))
	}
	return l
}

var (
	shimLeaf = devpki.Leaf{CommonName: "shim", URIs: []string{devpki.ShimIdentity + "apiserver-1"},
		Client: true}
	bridgeLeaf = devpki.Leaf{CommonName: "allocd-bridge",
		URIs: []string{devpki.ShimIdentity + "allocd-bridge"}, Client: true}
	otherShim = devpki.Leaf{CommonName: "shim2", URIs: []string{devpki.ShimIdentity + "apiserver-2"},
		Client: true}
	operatorLeaf = devpki.Leaf{CommonName: "operator", URIs: []string{devpki.OperatorIdentity + "alice"},
		Client: true}
	adminLeaf = devpki.Leaf{CommonName: "admin", URIs: []string{devpki.AdminIdentity + "bob"},
		Client: true}
)

// startSecure starts allocd with TLS, p's CA as client CA and the example policy,
// its files read again every 100 ms.
func startSecure(t *testing.T, p *testPKI, mutate ...func(*Config)) *Daemon {
	t.Helper()
	return StartForTest(t, append([]func(*Config){func(c *Config) {
		c.TLSCertFile, c.TLSPrivateKeyFile = p.issue("server-"+c.GRPCAddress,
			replicaLeaf(c.GRPCAddress, c.MetricsAddress))
		c.ClientCAFile = p.caFile
		c.AuthorizationPolicyFile = examplePolicy
		c.securityRefresh = 100 * time.Millisecond
	}}, mutate...)...)
}

// copyExamplePolicy copies the example policy into a file of the test: its path and
// the policy.
func copyExamplePolicy(t *testing.T) (path string, policy []byte) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "policy.json")
	policy, err := os.ReadFile(examplePolicy)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, policy, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, policy
}

// grantOperatorAllocate is the example policy with the shims' grant (Allocate among
// them) extended to operators.
func grantOperatorAllocate(t *testing.T, policy []byte) string {
	t.Helper()
	granted := strings.Replace(string(policy), `"spiffe://allocd.local/shim/*"]},`,
		`"spiffe://allocd.local/shim/*", "spiffe://allocd.local/operator/*"]},`, 1)
	if granted == string(policy) {
		t.Fatal("the example policy changed: update this test's edit")
	}
	return granted
}

// secureFollower starts two replicas with startSecure on one etcd, waits for a repair
// leader, and returns the replica that does not lead and the one that does.
func secureFollower(t *testing.T, p *testPKI) (follower, leading *Daemon) {
	t.Helper()
	e := etcdtest.New(t)
	var ds []*Daemon
	for range 2 {
		ds = append(ds, startSecure(t, p, func(c *Config) { c.EtcdServers = []string{e.Endpoint} }))
	}
	probe := p.dial(ds[0].GRPCAddr(), &operatorLeaf)
	var leader string
	etcdtest.WaitFor(t, 20*time.Second, "a repair leader", func() bool {
		st, err := allocdv1.NewRepairServiceClient(probe).GetRepairStatus(callCtx(t),
			&allocdv1.GetRepairStatusRequest{})
		leader = st.GetLeader()
		return err == nil && leader != ""
	})
	follower, leading = ds[0], ds[1]
	if leader == ds[0].GRPCAddr() {
		follower, leading = ds[1], ds[0]
	}
	if leading.GRPCAddr() != leader {
		t.Fatalf("repair leader %s is neither replica (%s, %s)", leader, ds[0].GRPCAddr(), ds[1].GRPCAddr())
	}
	return follower, leading
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// pushServices pushes an empty Service snapshot.
func pushServices(ctx context.Context, conn *grpc.ClientConn) error {
	st, err := allocdv1.NewRepairServiceClient(conn).PushServiceSnapshot(ctx)
	if err != nil {
		return err
	}
	if err := st.Send(&allocdv1.PushServiceSnapshotRequest{
		Snapshot: &allocdv1.ServiceSnapshot{Revision: 1}}); err != nil && err != io.EOF {
		return err
	}
	_, err = st.CloseAndRecv()
	return err
}

// mutations are every RPC that changes state, each with a request that would change
// something if it were allowed.
var mutations = []struct {
	name string
	call func(ctx context.Context, conn *grpc.ClientConn) error
}{
	{"Allocate", func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := allocdv1.NewAllocatorServiceClient(conn).Allocate(ctx, &allocdv1.AllocateRequest{
			Owner: &allocdv1.Owner{Namespace: "default", Name: "x", Uid: "uid-x"}, NodePortCount: 1})
		return err
	}},
	{"Release", func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := allocdv1.NewAllocatorServiceClient(conn).Release(ctx,
			&allocdv1.ReleaseRequest{Owner: &allocdv1.Owner{Uid: "uid-web"}})
		return err
	}},
	{"ForceRelease", func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := allocdv1.NewAllocatorServiceClient(conn).ForceRelease(ctx,
			&allocdv1.ForceReleaseRequest{Owner: &allocdv1.Owner{Uid: "uid-web"}})
		return err
	}},
	{"Transfer", func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := allocdv1.NewAllocatorServiceClient(conn).Transfer(ctx, &allocdv1.TransferRequest{
			From: &allocdv1.Owner{Uid: "uid-web"}, To: &allocdv1.Owner{Namespace: "default", Name: "x",
				Uid: "uid-x"}})
		return err
	}},
	{"CreateServiceCIDR", func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := allocdv1.NewAllocatorServiceClient(conn).CreateServiceCIDR(ctx,
			&allocdv1.CreateServiceCIDRRequest{Name: "more", Cidrs: []string{"10.1.0.0/24"}})
		return err
	}},
	{"DeleteServiceCIDR", func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := allocdv1.NewAllocatorServiceClient(conn).DeleteServiceCIDR(ctx,
			&allocdv1.DeleteServiceCIDRRequest{Name: "kubernetes"})
		return err
	}},
	{"Renew", func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := allocdv1.NewLeaseServiceClient(conn).Renew(ctx, &allocdv1.RenewRequest{Ip: "192.0.2.99"})
		return err
	}},
	{"RemoveLease", func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := allocdv1.NewLeaseServiceClient(conn).RemoveLease(ctx,
			&allocdv1.RemoveLeaseRequest{Ip: "192.0.2.1"})
		return err
	}},
	{"PushServiceSnapshot", pushServices},
	{"RunRepair", func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := allocdv1.NewRepairServiceClient(conn).RunRepair(ctx, &allocdv1.RunRepairRequest{})
		return err
	}},
	{"PushPodSnapshot", func(ctx context.Context, conn *grpc.ClientConn) error {
		st, err := allocdv1.NewEndpointsServiceClient(conn).PushPodSnapshot(ctx)
		if err != nil {
			return err
		}
		if err := st.Send(&allocdv1.PushPodSnapshotRequest{
			Snapshot: &allocdv1.PodSnapshot{Revision: 1}}); err != nil && err != io.EOF {
			return err
		}
		_, err = st.CloseAndRecv()
		return err
	}},
	{"PushEvents", func(ctx context.Context, conn *grpc.ClientConn) error {
		st, err := allocdv1.NewEndpointsServiceClient(conn).PushEvents(ctx)
		if err != nil {
			return err
		}
		if err := st.Send(&allocdv1.PushEventsRequest{Revision: 2}); err != nil && err != io.EOF {
			return err
		}
		_, err = st.CloseAndRecv()
		return err
	}},
}

// state is what the mutations could change, read by an admin.
func state(t *testing.T, admin *grpc.ClientConn) []proto.Message {
	t.Helper()
	ctx := callCtx(t)
	allocs, err := allocdv1.NewAllocatorServiceClient(admin).ListAllocations(ctx,
		&allocdv1.ListAllocationsRequest{})
	if err != nil {
		t.Fatalf("ListAllocations: %v", err)
	}
	cidrs, err := allocdv1.NewAllocatorServiceClient(admin).ListServiceCIDRs(ctx,
		&allocdv1.ListServiceCIDRsRequest{})
	if err != nil {
		t.Fatalf("ListServiceCIDRs: %v", err)
	}
	leases, err := allocdv1.NewLeaseServiceClient(admin).ListLeases(ctx, &allocdv1.ListLeasesRequest{})
	if err != nil {
		t.Fatalf("ListLeases: %v", err)
	}
	repair, err := allocdv1.NewRepairServiceClient(admin).GetRepairStatus(ctx,
		&allocdv1.GetRepairStatusRequest{})
	if err != nil {
		t.Fatalf("GetRepairStatus: %v", err)
	}
	out := []proto.Message{cidrs, &allocdv1.GetRepairStatusResponse{
		SnapshotRevision: repair.GetSnapshotRevision(), LastReport: repair.GetLastReport()}}
	for _, a := range allocs.GetAllocations() {
		out = append(out, a)
	}
	for _, l := range leases.GetLeases() {
		out = append(out, &allocdv1.Lease{Ip: l.GetIp(), LeaseId: l.GetLeaseId()})
	}
	return out
}

func sameState(a, b []proto.Message) bool {
	return slices.EqualFunc(a, b, func(x, y proto.Message) bool { return proto.Equal(x, y) })
}

// TestAuthorizationRoles runs the example policy: without a client certificate only
// health and reflection answer; an operator reads and gets PERMISSION_DENIED on every
// mutating RPC with nothing changed; a shim allocates and releases its own but cannot
// force a release or remove another API server's lease; an admin can.
func TestAuthorizationRoles(t *testing.T) {
	p := newTestPKI(t)
	d := startSecure(t, p)
	ctx := callCtx(t)
	anon, shim, shim2, operator, admin := p.dial(d.GRPCAddr(), nil), p.dial(d.GRPCAddr(), &shimLeaf),
		p.dial(d.GRPCAddr(), &otherShim), p.dial(d.GRPCAddr(), &operatorLeaf), p.dial(d.GRPCAddr(),
			&adminLeaf)

	if got, err := healthStatus(t, anon); err != nil || got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Health.Check without a client certificate = %v, %v; want SERVING", got, err)
	}
	if names := listServices(t, anon); !slices.Contains(names, "allocd.v1.AllocatorService") {
		t.Errorf("reflection without a client certificate lists %v; want the allocd services", names)
	}
	alloc := allocdv1.NewAllocatorServiceClient(shim)
	web, err := alloc.Allocate(ctx, &allocdv1.AllocateRequest{Owner: &allocdv1.Owner{Namespace: "default",
		Name: "web", Uid: "uid-web"}, NodePortCount: 1})
	if err != nil {
		t.Fatalf("shim Allocate: %v", err)
	}
	if _, err := allocdv1.NewLeaseServiceClient(shim2).Renew(ctx,
		&allocdv1.RenewRequest{Ip: "192.0.2.1", TtlSeconds: 600}); err != nil {
		t.Fatalf("second shim Renew: %v", err)
	}
	before := state(t, admin)
	for _, m := range mutations {
		if err := m.call(ctx, anon); status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s without a client certificate = %v; want UNAUTHENTICATED", m.name, err)
		}
		if err := m.call(ctx, operator); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s as operator = %v; want PERMISSION_DENIED", m.name, err)
		}
	}
	if after := state(t, admin); !sameState(before, after) {
		t.Errorf("refused calls changed the state:\nbefore %v\nafter  %v", before, after)
	}
	if _, err := allocdv1.NewAllocatorServiceClient(operator).ListRanges(ctx,
		&allocdv1.ListRangesRequest{}); err != nil {
		t.Errorf("operator ListRanges = %v; want OK", err)
	}

	// Forced releases: refused to the shim by either road, done by the admin.
	port := web.GetNodePorts()[0]
	_, err = alloc.Release(ctx, &allocdv1.ReleaseRequest{NodePorts: []int32{port}, Force: true})
	if st := status.Convert(err); st.Code() != codes.PermissionDenied ||
		reason(st) != "FORCE_RELEASE_REQUIRED" {
		t.Errorf("shim Release with force = %v; want PERMISSION_DENIED, reason FORCE_RELEASE_REQUIRED", err)
	}
	if _, err := alloc.ForceRelease(ctx,
		&allocdv1.ForceReleaseRequest{NodePorts: []int32{port}}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("shim ForceRelease = %v; want PERMISSION_DENIED", err)
	}
	if after := state(t, admin); !sameState(before, after) {
		t.Errorf("refused forced releases changed the state")
	}
	rel, err := allocdv1.NewAllocatorServiceClient(admin).ForceRelease(ctx,
		&allocdv1.ForceReleaseRequest{NodePorts: []int32{port}})
	if err != nil || !slices.Equal(rel.GetReleasedNodePorts(), []int32{port}) {
		t.Errorf("admin ForceRelease(%d) = %v, %v; want it released", port, rel, err)
	}
	// Transfers move anyone's items: refused to a shim, granted to the bridge.
	transfer := &allocdv1.TransferRequest{From: &allocdv1.Owner{Uid: "uid-web"},
		To: &allocdv1.Owner{Namespace: "default", Name: "web", Uid: "uid-web-2"}}
	if _, err := alloc.Transfer(ctx, transfer); status.Code(err) != codes.PermissionDenied {
		t.Errorf("shim Transfer = %v; want PERMISSION_DENIED", err)
	}
	bridge := allocdv1.NewAllocatorServiceClient(p.dial(d.GRPCAddr(), &bridgeLeaf))
	moved, err := bridge.Transfer(ctx, transfer)
	if err != nil || len(moved.GetTransferredClusterIps()) != 1 {
		t.Errorf("bridge Transfer = %v, %v; want web's ClusterIP moved", moved, err)
	}
	if _, err := alloc.Release(ctx,
		&allocdv1.ReleaseRequest{Owner: &allocdv1.Owner{Uid: "uid-web"}}); err != nil {
		t.Errorf("shim Release of its own = %v; want OK", err)
	}
	// ServiceCIDRs follow the cluster's through the bridge: refused to other shims.
	cidr := &allocdv1.CreateServiceCIDRRequest{Name: "extra", Cidrs: []string{"10.97.0.0/24"}}
	if _, err := alloc.CreateServiceCIDR(ctx, cidr); status.Code(err) != codes.PermissionDenied {
		t.Errorf("shim CreateServiceCIDR = %v; want PERMISSION_DENIED", err)
	}
	if _, err := bridge.CreateServiceCIDR(ctx, cidr); err != nil {
		t.Errorf("bridge CreateServiceCIDR = %v; want OK", err)
	}
	if _, err := alloc.DeleteServiceCIDR(ctx,
		&allocdv1.DeleteServiceCIDRRequest{Name: "extra"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("shim DeleteServiceCIDR = %v; want PERMISSION_DENIED", err)
	}
	if _, err := bridge.DeleteServiceCIDR(ctx,
		&allocdv1.DeleteServiceCIDRRequest{Name: "extra"}); err != nil {
		t.Errorf("bridge DeleteServiceCIDR = %v; want OK", err)
	}

	// Master leases: a shim renews its own but cannot remove another API server's.
	if _, err := allocdv1.NewLeaseServiceClient(shim).RemoveLease(ctx,
		&allocdv1.RemoveLeaseRequest{Ip: "192.0.2.1"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("shim RemoveLease of another API server's lease = %v; want PERMISSION_DENIED", err)
	}
	leases, err := allocdv1.NewLeaseServiceClient(operator).ListLeases(ctx, &allocdv1.ListLeasesRequest{})
	if err != nil || len(leases.GetLeases()) != 1 {
		t.Errorf("ListLeases = %v, %v; want the lease of 192.0.2.1 kept", leases, err)
	}
	if _, err := allocdv1.NewLeaseServiceClient(admin).RemoveLease(ctx,
		&allocdv1.RemoveLeaseRequest{Ip: "192.0.2.1"}); err != nil {
		t.Errorf("admin RemoveLease = %v; want OK", err)
	}
}

func reason(st *status.Status) string {
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			return ei.GetReason()
		}
	}
	return ""
}

// errorMetadata returns the metadata of st's google.rpc.ErrorInfo, nil without one.
func errorMetadata(st *status.Status) map[string]string {
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			return ei.GetMetadata()
		}
	}
	return nil
}

// TestClientForceReleaseWithTLSFiles: the Go client, with tlsfiles' credentials, releases
// with Force through ForceRelease as an admin, and gets ErrPermissionDenied as a shim.
func TestClientForceReleaseWithTLSFiles(t *testing.T) {
	p := newTestPKI(t)
	d := startSecure(t, p)
	ctx := callCtx(t)
	newClient := func(l devpki.Leaf) *client.Client {
		crt, key := p.issue("go-client-"+l.CommonName, l)
		files, err := tlsfiles.NewClient(tlsfiles.Files{CAFile: p.caFile, CertFile: crt, KeyFile: key})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(files.Close)
		c, err := client.New(d.GRPCAddr(), client.WithDialOptions(files.DialOption()),
			client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	shim, admin := newClient(shimLeaf), newClient(adminLeaf)
	got, err := shim.Allocate(ctx, &allocdv1.AllocateRequest{Owner: &allocdv1.Owner{Namespace: "default",
		Name: "db", Uid: "uid-db"}, ClusterIps: []string{"10.0.0.10"}})
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	req := &allocdv1.ReleaseRequest{ClusterIps: got.GetClusterIps(), Force: true}
	if _, err := shim.Release(ctx, req); !errors.Is(err, client.ErrPermissionDenied) {
		t.Errorf("shim Release with Force = %v; want ErrPermissionDenied", err)
	}
	rel, err := admin.Release(ctx, req)
	if err != nil || !slices.Equal(rel.GetReleasedClusterIps(), []string{"10.0.0.10"}) {
		t.Errorf("admin Release with Force = %v, %v; want 10.0.0.10 released", rel, err)
	}
}

// TestTLSHandshakeRefusals: a client certificate of another CA, an expired one, and a
// client that does not trust the server's CA never get a call through.
func TestTLSHandshakeRefusals(t *testing.T) {
	p := newTestPKI(t)
	d := startSecure(t, p)
	admin := p.dial(d.GRPCAddr(), &adminLeaf)
	before := state(t, admin)
	other := newTestPKI(t)
	expired := adminLeaf
	expired.CommonName = "expired"
	expired.NotBefore, expired.NotAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour)
	otherCrt, otherKey := other.issue("admin", adminLeaf)
	expCrt, expKey := p.issue("expired", expired)
	for _, tc := range []struct {
		name  string
		files tlsfiles.Files
	}{
		{"client certificate of another CA",
			tlsfiles.Files{CAFile: p.caFile, CertFile: otherCrt, KeyFile: otherKey}},
		{"expired client certificate", tlsfiles.Files{CAFile: p.caFile, CertFile: expCrt, KeyFile: expKey}},
		{"server of an untrusted CA",
			tlsfiles.Files{CAFile: other.caFile, CertFile: otherCrt, KeyFile: otherKey}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := dialFiles(t, d.GRPCAddr(), tc.files)
			for _, m := range mutations[:2] {
				if err := m.call(callCtx(t), conn); status.Code(err) != codes.Unavailable {
					t.Errorf("%s = %v; want UNAVAILABLE (handshake refused)", m.name, err)
				}
			}
			if _, err := healthpb.NewHealthClient(conn).Check(callCtx(t),
				&healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
				t.Errorf("Health.Check = %v; want UNAVAILABLE (handshake refused)", err)
			}
		})
	}
	if after := state(t, admin); !sameState(before, after) {
		t.Errorf("refused connections changed the state")
	}
}

// serverSerial is the serial number of the certificate a new TLS connection to addr
// gets.
func serverSerial(t *testing.T, addr, caFile string) string {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	host, _, _ := net.SplitHostPort(addr)
	conn, err := tls.Dial("tcp", addr,
		&tls.Config{RootCAs: pool, ServerName: host, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatalf("TLS dial %s: %v", addr, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestCertificateRotation replaces the server's certificate and the client CA bundle
// in place: new connections get the new certificate and clients of the new CA are
// admitted, without a restart, while a connection opened before keeps working.
func TestCertificateRotation(t *testing.T) {
	p := newTestPKI(t)
	var certFile string
	d := startSecure(t, p, func(c *Config) { certFile = c.TLSCertFile })
	admin := p.dial(d.GRPCAddr(), &adminLeaf)
	if _, err := allocdv1.NewAllocatorServiceClient(admin).ListRanges(callCtx(t),
		&allocdv1.ListRangesRequest{}); err != nil {
		t.Fatalf("ListRanges before the rotation: %v", err)
	}
	old := serverSerial(t, d.GRPCAddr(), p.caFile)

	p.issue("server-"+d.GRPCAddr(), replicaLeaf(d.GRPCAddr(), d.MetricsAddr())) // same files, new certificate
	if _, err := os.Stat(certFile); err != nil {
		t.Fatalf("rotated certificate: %v", err)
	}
	etcdtest.WaitFor(t, 10*time.Second, "the rotated certificate served", func() bool {
		return serverSerial(t, d.GRPCAddr(), p.caFile) != old
	})
	if _, err := allocdv1.NewAllocatorServiceClient(admin).ListRanges(callCtx(t),
		&allocdv1.ListRangesRequest{}); err != nil {
		t.Errorf("ListRanges on the connection opened before the rotation: %v", err)
	}

	// A second CA in the bundle: its admins get in once the file is read again.
	next := newTestPKI(t)
	if err := os.WriteFile(p.caFile+".tmp", append(slices.Clone(p.ca.PEM), next.ca.PEM...),
		0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p.caFile+".tmp", p.caFile); err != nil {
		t.Fatal(err)
	}
	crt, key := next.issue("admin", adminLeaf)
	etcdtest.WaitFor(t, 10*time.Second, "an admin of the new CA admitted", func() bool {
		conn := dialFiles(t, d.GRPCAddr(), tlsfiles.Files{CAFile: p.caFile, CertFile: crt, KeyFile: key})
		_, err := allocdv1.NewAllocatorServiceClient(conn).ListRanges(callCtx(t),
			&allocdv1.ListRangesRequest{})
		conn.Close()
		return err == nil
	})
}

// TestPolicyReload edits the policy file: what it grants changes without a restart.
func TestPolicyReload(t *testing.T) {
	p := newTestPKI(t)
	policy, orig := copyExamplePolicy(t)
	d := startSecure(t, p, func(c *Config) { c.AuthorizationPolicyFile = policy })
	operator := p.dial(d.GRPCAddr(), &operatorLeaf)
	allocate := mutations[0].call
	if err := allocate(callCtx(t), operator); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("operator Allocate = %v; want PERMISSION_DENIED", err)
	}
	granted := grantOperatorAllocate(t, orig)
	if err := os.WriteFile(policy, []byte(granted), 0o644); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, "operator Allocate allowed by the edited policy", func() bool {
		return allocate(callCtx(t), operator) == nil
	})
}

// TestForwardingWithTLS: two replicas with TLS and the example policy; feeds and
// RunRepair sent to the one that does not lead are forwarded to the leader, which
// admits the forwarding replica by its certificate (the replica identity).
func TestForwardingWithTLS(t *testing.T) {
	p := newTestPKI(t)
	follower, _ := secureFollower(t, p)
	shim, admin := p.dial(follower.GRPCAddr(), &shimLeaf), p.dial(follower.GRPCAddr(), &adminLeaf)
	if err := pushServices(callCtx(t), shim); err != nil {
		t.Fatalf("PushServiceSnapshot through the follower: %v", err)
	}
	rep, err := allocdv1.NewRepairServiceClient(admin).RunRepair(callCtx(t), &allocdv1.RunRepairRequest{})
	if err != nil {
		t.Fatalf("RunRepair through the follower: %v", err)
	}
	if rep.GetReport().GetSnapshotRevision() != 1 {
		t.Errorf("RunRepair report = %v; want the pass over the pushed snapshot (revision 1)",
			rep.GetReport())
	}
}

// TestMetricsTLS: --metrics-tls serves /metrics over HTTPS with the gRPC certificate.
func TestMetricsTLS(t *testing.T) {
	p := newTestPKI(t)
	d := startSecure(t, p, func(c *Config) { c.MetricsTLS = true })
	pem, _ := os.ReadFile(p.caFile)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
		Timeout: 10 * time.Second}
	resp, err := hc.Get("https://" + d.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatalf("GET https /metrics: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "grpc_server_handled_total") {
		t.Errorf("GET https /metrics = %d; want 200 with the gRPC metrics", resp.StatusCode)
	}
	// net/http answers a plain request to its TLS port with 400 and nothing else.
	plain, err := http.Get("http://" + d.MetricsAddr() + "/metrics")
	if err == nil {
		plain.Body.Close()
	}
	if err == nil && plain.StatusCode != http.StatusBadRequest {
		t.Errorf("GET http /metrics with --metrics-tls = %d; want 400 (HTTPS only)", plain.StatusCode)
	}
}

// TestSecurityConfig: Validate says what to fix in the TLS and authorization flags.
func TestSecurityConfig(t *testing.T) {
	p := newTestPKI(t)
	crt, key := p.issue("server", replicaLeaf("127.0.0.1:1"))
	otherDir := t.TempDir()
	keyElsewhere := filepath.Join(otherDir, "tls.key")
	if b, err := os.ReadFile(key); err != nil || os.WriteFile(keyElsewhere, b, 0o600) != nil {
		t.Fatal("copy key")
	}
	_, otherKey := p.issue("server2", replicaLeaf("127.0.0.1:1"))
	mismatched := filepath.Join(filepath.Dir(crt), "other.key")
	if b, err := os.ReadFile(otherKey); err != nil || os.WriteFile(mismatched, b, 0o600) != nil {
		t.Fatal("copy key")
	}
	badPolicy := filepath.Join(otherDir, "policy.json")
	os.WriteFile(badPolicy, []byte(`{"name": "x", "allow_rules": [`+
		`{"name": "r", "request": {"headers": [{"key": ":path", "values": ["x"]}]}}]}`), 0o644)
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		flag   string // refused
		why    error  // the refusal's Kind or cause
		not    error  // a cause it is not, if any
	}{
		{"cert without key", func(c *Config) { c.TLSCertFile = crt },
			"--tls-private-key-file", ErrFlagsTogether, nil},
		{"key without cert", func(c *Config) { c.TLSPrivateKeyFile = key },
			"--tls-cert-file", ErrFlagsTogether, nil},
		{"unreadable cert", func(c *Config) { c.TLSCertFile, c.TLSPrivateKeyFile = crt+".missing", key },
			"--tls-cert-file", fs.ErrNotExist, nil},
		{"key in another directory",
			func(c *Config) { c.TLSCertFile, c.TLSPrivateKeyFile = crt, keyElsewhere },
			"--tls-private-key-file", tlsfiles.ErrPair, nil},
		{"key of another certificate",
			func(c *Config) { c.TLSCertFile, c.TLSPrivateKeyFile = crt, mismatched },
			"--tls-private-key-file", tlsfiles.ErrKeyMismatch, nil},
		{"CA without cert", func(c *Config) { c.ClientCAFile = p.caFile },
			"--tls-cert-file", ErrFlagNeeds, nil},
		{"unreadable CA",
			func(c *Config) { c.TLSCertFile, c.TLSPrivateKeyFile, c.ClientCAFile = crt, key, crt+".missing" },
			"--client-ca-file", fs.ErrNotExist, nil},
		{"CA file without a certificate",
			func(c *Config) { c.TLSCertFile, c.TLSPrivateKeyFile, c.ClientCAFile = crt, key, badPolicy },
			"--client-ca-file", tlsfiles.ErrNoCertificate, nil},
		{"policy without CA", func(c *Config) {
			c.TLSCertFile, c.TLSPrivateKeyFile, c.AuthorizationPolicyFile = crt, key, examplePolicy
		}, "--client-ca-file", ErrFlagNeeds, nil},
		{"unreadable policy", func(c *Config) {
			c.TLSCertFile, c.TLSPrivateKeyFile = crt, key
			c.ClientCAFile, c.AuthorizationPolicyFile = p.caFile, badPolicy+".missing"
		}, "--authorization-policy-file", fs.ErrNotExist, nil},
		{"bad policy", func(c *Config) {
			c.TLSCertFile, c.TLSPrivateKeyFile = crt, key
			c.ClientCAFile, c.AuthorizationPolicyFile = p.caFile, badPolicy
		}, "--authorization-policy-file", ErrFlagValue, fs.ErrNotExist},
		{"metrics TLS without cert", func(c *Config) { c.MetricsTLS = true },
			"--metrics-address", ErrFlagNeeds, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mutate(&c)
			err := c.Validate()
			if !refuses(err, tc.flag, tc.why) || tc.not != nil && errors.Is(err, tc.not) {
				t.Errorf("Validate() = %v; want a *FlagError of %s for %v (not %v)", err, tc.flag, tc.why,
					tc.not)
			}
		})
	}
	c := DefaultConfig()
	c.TLSCertFile, c.TLSPrivateKeyFile, c.ClientCAFile = crt, key, p.caFile
	c.AuthorizationPolicyFile, c.MetricsTLS = examplePolicy, true
	if err := c.Validate(); err != nil {
		t.Errorf("Validate() of a full TLS and authorization configuration = %v; want nil", err)
	}
}

// A client certificate that expires while its connection is open stops working on
// that connection: the handshake checked it once, the calls check it each time.
func TestCertificateExpiresOnOpenConnection(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a real certificate to expire")
	}
	p := newTestPKI(t)
	d := startSecure(t, p)
	ctx := callCtx(t)
	short := shimLeaf
	short.CommonName, short.NotAfter = "short-lived shim", time.Now().Add(2*time.Second)
	conn := p.dial(d.GRPCAddr(), &short)
	alloc := allocdv1.NewAllocatorServiceClient(conn)
	owner := &allocdv1.Owner{Namespace: "default", Name: "web", Uid: "uid-web"}
	if _, err := alloc.Allocate(ctx, &allocdv1.AllocateRequest{Owner: owner}); err != nil {
		t.Fatalf("Allocate before the certificate expired: %v", err)
	}
	time.Sleep(time.Until(short.NotAfter) + 200*time.Millisecond)
	_, err := alloc.Allocate(ctx,
		&allocdv1.AllocateRequest{Owner: &allocdv1.Owner{Namespace: "default", Name: "db", Uid: "uid-db"}})
	if status.Code(err) != codes.Unauthenticated ||
		!strings.Contains(status.Convert(err).Message(), "expired") {
		t.Fatalf("Allocate on the same connection after the certificate expired = %v; want "+
			"UNAUTHENTICATED, expired", err)
	}
}

// TestServerAuthOnlyClientCertificateRefused: a client certificate of the right CA and
// an admin identity, but with the server-auth extended key usage alone, fails the TLS
// handshake: no call gets through and nothing changes. The same identity with client
// auth as well is admitted, so the key usage is what refuses it.
func TestServerAuthOnlyClientCertificateRefused(t *testing.T) {
	p := newTestPKI(t)
	d := startSecure(t, p)
	admin := p.dial(d.GRPCAddr(), &adminLeaf)
	before := state(t, admin)

	serverOnly := adminLeaf
	serverOnly.CommonName, serverOnly.Server, serverOnly.Client = "server-auth-only admin", true, false
	crt, key := p.issue("server-auth-only", serverOnly)
	pair, err := tls.LoadX509KeyPair(crt, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
		t.Fatalf("issued certificate has extended key usages %v; want server auth alone", leaf.ExtKeyUsage)
	}
	conn := dialFiles(t, d.GRPCAddr(), tlsfiles.Files{CAFile: p.caFile, CertFile: crt, KeyFile: key})
	for _, m := range mutations {
		if err := m.call(callCtx(t), conn); status.Code(err) != codes.Unavailable {
			t.Errorf("%s with a server-auth-only client certificate = %v; want "+
				"UNAVAILABLE (handshake refused)", m.name, err)
		}
	}
	if _, err := healthpb.NewHealthClient(conn).Check(callCtx(t),
		&healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("Health.Check with a server-auth-only client certificate = %v; want UNAVAILABLE "+
			"(handshake refused)", err)
	}
	if after := state(t, admin); !sameState(before, after) {
		t.Errorf("calls with a server-auth-only client certificate changed the state:\nbefore %v\nafter  %v",
			before, after)
	}

	both := serverOnly
	both.CommonName, both.Client = "server-and-client-auth admin", true
	if _, err := allocdv1.NewAllocatorServiceClient(p.dial(d.GRPCAddr(), &both)).ListRanges(callCtx(t),
		&allocdv1.ListRangesRequest{}); err != nil {
		t.Errorf("ListRanges with the same identity and client auth too = %v; want OK", err)
	}
}

// TestPolicyReloadKeepsLastValidPolicy: a policy file that turns invalid (garbage, an
// empty allow_rules list, the file deleted) leaves the policy read before in force
// (the shim still allocates, the operator is still refused) after several refresh
// periods; a valid file written afterwards is taken, so the file was being read.
func TestPolicyReloadKeepsLastValidPolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out refresh periods of the policy file")
	}
	p := newTestPKI(t)
	policy, orig := copyExamplePolicy(t)
	d := startSecure(t, p, func(c *Config) { c.AuthorizationPolicyFile = policy })
	shim, operator := p.dial(d.GRPCAddr(), &shimLeaf), p.dial(d.GRPCAddr(), &operatorLeaf)
	allocate := mutations[0].call
	inForce := func(stage string) {
		t.Helper()
		slug := strings.ReplaceAll(stage, " ", "-")
		owner := &allocdv1.Owner{Namespace: "default", Name: "keep-" + slug, Uid: "uid-keep-" + slug}
		if _, err := allocdv1.NewAllocatorServiceClient(shim).Allocate(callCtx(t),
			&allocdv1.AllocateRequest{Owner: owner, NodePortCount: 1}); err != nil {
			t.Errorf("%s: shim Allocate = %v; want OK (the previous policy kept)", stage, err)
		}
		if err := allocate(callCtx(t), operator); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: operator Allocate = %v; want PERMISSION_DENIED (the previous policy kept)", stage,
				err)
		}
	}
	inForce("initial")

	write := func(content string) func() error {
		return func() error { return os.WriteFile(policy, []byte(content), 0o644) }
	}
	const emptyRules = `{"name": "allocd", "allow_rules": []}`
	for _, bad := range []string{"{not json", emptyRules} {
		if _, err := authz.NewStatic(bad); err == nil {
			t.Fatalf("authz.NewStatic(%q) = nil error; the test needs an invalid policy", bad)
		}
	}
	for _, bad := range []struct {
		name  string
		apply func() error
	}{
		{"garbage", write("{not json")},
		{"empty allow_rules", write(emptyRules)},
		{"deleted", func() error { return os.Remove(policy) }},
	} {
		if err := bad.apply(); err != nil {
			t.Fatalf("%s: %v", bad.name, err)
		}
		time.Sleep(5 * 100 * time.Millisecond) // five refresh periods of startSecure
		inForce(bad.name)
	}

	granted := grantOperatorAllocate(t, orig)
	if err := write(granted)(); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second,
		"operator Allocate allowed by a valid policy written after the bad ones",
		func() bool {
			return allocate(callCtx(t), operator) == nil
		})
}

// TestForwardedCallsRefusedAtFollower: with two replicas, callers the policy refuses
// (an operator; a caller without a client certificate) are refused by the follower
// itself for the calls it would forward to the leader (PushServiceSnapshot, RunRepair),
// and the leader's repair status is unchanged: the follower does not lend them its
// replica identity. A shim's push through the follower then shows in that status.
func TestForwardedCallsRefusedAtFollower(t *testing.T) {
	p := newTestPKI(t)
	follower, leading := secureFollower(t, p)
	leaderAdmin := p.dial(leading.GRPCAddr(), &adminLeaf)
	repairStatus := func() *allocdv1.GetRepairStatusResponse {
		t.Helper()
		st, err := allocdv1.NewRepairServiceClient(leaderAdmin).GetRepairStatus(callCtx(t),
			&allocdv1.GetRepairStatusRequest{})
		if err != nil {
			t.Fatalf("GetRepairStatus at the leader: %v", err)
		}
		return &allocdv1.GetRepairStatusResponse{SnapshotRevision: st.GetSnapshotRevision(),
			LastReport: st.GetLastReport()}
	}
	before := repairStatus()

	runRepair := func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := allocdv1.NewRepairServiceClient(conn).RunRepair(ctx, &allocdv1.RunRepairRequest{})
		return err
	}
	for _, caller := range []struct {
		name    string
		leaf    *devpki.Leaf
		code    codes.Code
		message string // in the refusal: the follower names the caller, not its own identity
	}{
		{"operator", &operatorLeaf, codes.PermissionDenied, operatorLeaf.URIs[0]},
		{"no client certificate", nil, codes.Unauthenticated, "needs a client certificate"},
	} {
		conn := p.dial(follower.GRPCAddr(), caller.leaf)
		for _, m := range []struct {
			name string
			call func(context.Context, *grpc.ClientConn) error
		}{{"PushServiceSnapshot", pushServices}, {"RunRepair", runRepair}} {
			err := m.call(callCtx(t), conn)
			if st := status.Convert(err); st.Code() != caller.code ||
				!strings.Contains(st.Message(), caller.message) {
				t.Errorf("%s at the follower as %s = %v; want %v naming %q", m.name, caller.name, err,
					caller.code, caller.message)
			}
		}
	}
	if after := repairStatus(); !proto.Equal(before, after) {
		t.Errorf("refused calls at the follower changed the leader's repair status:\nbefore %v\nafter  %v",
			before, after)
	}

	// The probe sees a forwarded push: the shim's, through the follower.
	if err := pushServices(callCtx(t), p.dial(follower.GRPCAddr(), &shimLeaf)); err != nil {
		t.Fatalf("shim PushServiceSnapshot through the follower: %v", err)
	}
	if got := repairStatus().GetSnapshotRevision(); got != 1 {
		t.Errorf("leader's snapshot revision after the shim's forwarded push = %d; want 1", got)
	}
}

// syncBuffer is a log output that tests read while the daemon writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestForwardingMetadataOnlyFromReplicas: forwarding metadata is honoured only from a
// caller with the replicas' identity. An admin's RunRepair at the follower that claims
// to be forwarded already is forwarded to the leader all the same (the claim dropped);
// the same claim from a replica's certificate is honoured (not forwarded again: the
// follower names the leader). The leader logs the forwarded call with the admin's
// identity, not only the forwarding replica's.
func TestForwardingMetadataOnlyFromReplicas(t *testing.T) {
	p := newTestPKI(t)
	e := etcdtest.New(t)
	logs := map[string]*syncBuffer{}
	var ds []*Daemon
	for range 2 {
		out := &syncBuffer{}
		d := startSecure(t, p, func(c *Config) {
			c.EtcdServers = []string{e.Endpoint}
			c.LogOutput, c.LogLevel = out, "debug"
		})
		logs[d.GRPCAddr()] = out
		ds = append(ds, d)
	}
	admin0 := p.dial(ds[0].GRPCAddr(), &adminLeaf)
	var leaderAddr string
	etcdtest.WaitFor(t, 20*time.Second, "a repair leader", func() bool {
		st, err := allocdv1.NewRepairServiceClient(admin0).GetRepairStatus(callCtx(t),
			&allocdv1.GetRepairStatusRequest{})
		leaderAddr = st.GetLeader()
		return err == nil && leaderAddr != ""
	})
	follower := ds[0]
	if leaderAddr == follower.GRPCAddr() {
		follower = ds[1]
	}
	claim := func(t *testing.T) context.Context {
		return metadata.AppendToOutgoingContext(callCtx(t), "allocd-forwarded-by", "10.9.9.9:8080",
			"allocd-forwarded-for", "spiffe://allocd.local/admin/mallory")
	}
	if err := pushServices(callCtx(t), p.dial(follower.GRPCAddr(), &shimLeaf)); err != nil {
		t.Fatalf("shim PushServiceSnapshot through the follower: %v", err)
	}
	admin := p.dial(follower.GRPCAddr(), &adminLeaf)
	if _, err := allocdv1.NewRepairServiceClient(admin).RunRepair(claim(t),
		&allocdv1.RunRepairRequest{DryRun: true}); err != nil {
		t.Errorf("admin RunRepair at the follower claiming to be forwarded = %v; want it forwarded to the "+
			"leader (the claim dropped)", err)
	}
	etcdtest.WaitFor(t, 10*time.Second, "the leader's log of the forwarded call naming the admin",
		func() bool {
			return strings.Contains(logs[leaderAddr].String(), "forwarded call") &&
				strings.Contains(logs[leaderAddr].String(), adminLeaf.URIs[0])
		})
	if strings.Contains(logs[leaderAddr].String(), "mallory") {
		t.Errorf("the leader logged the identity the admin's call claimed:\n%s", logs[leaderAddr].String())
	}

	replica := replicaLeaf()
	replicaConn := p.dial(follower.GRPCAddr(), &replica)
	_, err := allocdv1.NewRepairServiceClient(replicaConn).RunRepair(claim(t),
		&allocdv1.RunRepairRequest{DryRun: true})
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition ||
		reason(st) != allocdv1.ErrorReason_NOT_REPAIR_LEADER.String() ||
		errorMetadata(st)["leader"] != leaderAddr {
		t.Errorf("replica RunRepair at the follower, forwarded already = %v; want FAILED_PRECONDITION "+
			"naming the leader %s", err, leaderAddr)
	}
}

// TestPolicyReloadFailureLogged: a policy file that turns invalid is logged by allocd
// itself, once, naming the file; a valid file afterwards logs nothing more.
func TestPolicyReloadFailureLogged(t *testing.T) {
	p := newTestPKI(t)
	policy, orig := copyExamplePolicy(t)
	out := &syncBuffer{}
	startSecure(t, p, func(c *Config) { c.AuthorizationPolicyFile, c.LogOutput = policy, out })
	if err := os.WriteFile(policy, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	const line = "authorization policy file cannot be used"
	etcdtest.WaitFor(t, 10*time.Second, "allocd's log of the invalid policy file", func() bool {
		return strings.Contains(out.String(), line) && strings.Contains(out.String(), policy)
	})
	if err := os.WriteFile(policy, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // five refresh periods
	if n := strings.Count(out.String(), line); n != 1 {
		t.Errorf("%d log lines of the invalid policy file; want 1 (once per change)", n)
	}
}
