package admit

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when goroutines outlive them. klog's flush
// daemon runs for the life of the process, by design (client-go logs through klog).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"))
}
