package etcdtest

import (
	"context"
	"testing"
	"time"
)

// WaitFor polls cond every 5 ms until it holds, failing the test after limit: for
// what etcd makes true a moment later (a watch event, a lease expiry).
func WaitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Eventually(limit, cond) {
		t.Fatalf("timed out after %v waiting for %s", limit, what)
	}
}

// Eventually polls cond every 5 ms until it holds, for at most limit, and reports
// whether it held: WaitFor for a test that says itself what did not happen.
func Eventually(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// Context returns the context of a test's calls: it ends after 30 s, or when the test
// does.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
