package leakcheck

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// ignored are goroutines that libraries leave behind by design or that no test can
// end: each with its reason.
var ignored = []goleak.Option{
	// An embedded etcd member hard-stopped as a crash would (etcdtest's StopMember) can
	// leave a request of a peer on its version endpoint waiting for the closed backend's
	// lock for good: etcd's, seen once in 'make fault' (TestRenewThroughLeaderChange).
	goleak.IgnoreAnyFunction(etcdPeerVersionHandler),
}

const etcdPeerVersionHandler = "go.etcd.io/etcd/server/v3/etcdserver/api/etcdhttp." +
	"newPeerHandler.versionHandler.func1"

// MustTestMain runs the tests of m, then each of after (what TestMain started for
// examples, say), then fails the run when goroutines are left that no test ended
// (goleak retries for about a second while they finish). It does not return.
func MustTestMain(m *testing.M, after ...func()) {
	code := m.Run()
	for _, f := range after {
		f()
	}
	if code == 0 {
		if err := goleak.Find(ignored...); err != nil {
			fmt.Fprintf(os.Stderr, "leakcheck: goroutines outlived the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
