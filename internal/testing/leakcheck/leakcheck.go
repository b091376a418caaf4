package leakcheck

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// ignored are goroutines that libraries start once per process and never stop, by
// design: they are no test's to end.
var ignored = []goleak.Option{}

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
