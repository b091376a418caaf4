// Package etcdtest starts a real etcd for tests: one embedded member on free loopback
// ports in t.TempDir(), stopped by t.Cleanup. Every package's tests use it; nothing in
// allocd mocks etcd. With ALLOCD_TEST_ETCD_BINARY (binaryEnv) the members are processes
// of that etcd binary instead: make etcd-matrix runs the tests against etcd 3.5 and 3.6.
// NewCluster(t, 3, Processes()) runs go.mod's etcd as processes (EtcdBinary builds it),
// so that PauseMember can stop a member as SIGSTOP does, lessor and all.
//
//	func TestX(t *testing.T) {
//		e := etcdtest.New(t)
//		resp, err := e.Client.Put(ctx, "k", "v")
//		...
//	}
package etcdtest
