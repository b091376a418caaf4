package cli

import (
	"context"
	"strings"
	"testing"
)

// TestHealth: allocd health takes the flags of the other commands (--server,
// $ALLOCD_SERVER, -o, --timeout), prints the status and exits 0 when SERVING; the
// --grpc-address it had before still works, with a deprecation notice.
func TestHealth(t *testing.T) {
	a := start(t) // sets $ALLOCD_SERVER
	addr := a.d.GRPCAddr()
	for _, tc := range []struct {
		args       []string
		out, inErr string
	}{
		{[]string{"health"}, "SERVING\n", ""},
		{[]string{"health", "--server", addr, "--timeout", "1s"}, "SERVING\n", ""},
		{[]string{"health", "-o", "json"}, "{\n  \"status\": \"SERVING\"\n}\n", ""},
		{[]string{"health", "--grpc-address", addr}, "SERVING\n",
			"--grpc-address has been deprecated, use --server"},
	} {
		out, stderr, code := execute(context.Background(), tc.args...)
		if code != 0 || out != tc.out || !strings.Contains(stderr, tc.inErr) || tc.inErr == "" &&
			stderr != "" {
			t.Errorf("allocd %s = %d, %q, %q; want 0, %q, stderr %q", strings.Join(tc.args, " "), code, out,
				stderr, tc.out, tc.inErr)
		}
	}
	a.d.Close() // NOT_SERVING while it shuts down, then gone
	out, stderr, code := execute(context.Background(), "health", "--timeout", "1s")
	if code != 1 || out != "" || !strings.HasPrefix(stderr, "error: health: ") {
		t.Errorf("allocd health of a stopped allocd = %d, %q, %q; want 1 and one error line", code, out,
			stderr)
	}
	_, stderr, code = execute(context.Background(), "health", "extra")
	if code != 2 || !strings.Contains(stderr, `unexpected argument "extra"`) {
		t.Errorf("allocd health extra = %d, %q; want 2, a usage error", code, stderr)
	}
}
