package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/allocd/allocd/internal/testing/devpki"
)

// TestCommandsBesideServing: `allocd --help` and `allocd help` print the serving flags'
// groups and then the operator commands; a mistyped command gets a suggestion; the
// operator commands run under the same binary.
func TestCommandsBesideServing(t *testing.T) {
	var help, helpCmd bytes.Buffer
	if rc := run([]string{"--help"}, &help, &help); rc != 0 {
		t.Fatalf("allocd --help = %d", rc)
	}
	run([]string{"help"}, &helpCmd, &helpCmd)
	if help.String() != helpCmd.String() {
		t.Errorf("allocd help differs from allocd --help:\n%s\nwant:\n%s", helpCmd.String(), help.String())
	}
	for _, want := range []string{"Serving:", "--grpc-address", "Commands (", "\n  get ", "\n  release ",
		"\n  repair ", "\n  watch ", "\n  health ", "\n  completion "} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("allocd --help has no %q:\n%s", want, help.String())
		}
	}
	for _, tc := range []struct {
		args    []string
		code    int
		wantOut string
		wantErr string
	}{
		{[]string{"gte", "ranges"}, 2, "", `unknown command "gte"; did you mean "get"?`},
		{[]string{"get", "--help"}, 0, "allocd get ranges", ""},
		{[]string{"get", "ranges", "--server", free(t), "--timeout", "1s"}, 1, "",
			"get ranges: cannot reach allocd at "},
		{[]string{"completion", "bash"}, 0, "__start_allocd", ""},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stdout.String(), tc.wantOut) ||
			!strings.Contains(stderr.String(), tc.wantErr) {
			t.Errorf("allocd %s = %d, %q, %q; want %d, %q in stdout, %q in stderr",
				strings.Join(tc.args, " "), code,
				stdout.String(), stderr.String(), tc.code, tc.wantOut, tc.wantErr)
		}
	}
}

// TestCompletionBash sources `allocd completion bash` in bash, as a user's shell does,
// and completes subcommands and flags with the real binary.
func TestCompletionBash(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	bin := buildAllocd(t)
	// _get_comp_words_by_ref comes with the bash-completion package, which cobra's
	// script expects; this is its gist.
	const script = `
_get_comp_words_by_ref() {
	cur="${COMP_WORDS[COMP_CWORD]}"; prev="${COMP_WORDS[COMP_CWORD-1]}"
	words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD
}
source <(allocd completion bash)
complete_line() {
	COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}
	read -ra COMP_WORDS <<< "$COMP_LINE"
	[[ "$COMP_LINE" == *" " ]] && COMP_WORDS+=("")
	COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMPREPLY=()
	__start_allocd
	echo "$1=> ${COMPREPLY[*]}"
}
complete_line "allocd "
complete_line "allocd get "
complete_line "allocd get ra"
complete_line "allocd get allocations --ow"
complete_line "allocd release --"
complete_line "allocd get ranges -o "
`
	cmd := exec.Command(bash, "-c", script)
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, out)
	}
	for _, want := range []string{
		"allocd => ", "get", "describe", "release", "repair", "watch",
		"allocd get => ", "allocations", "servicecidrs", "endpoints", "leases",
		"allocd get ra=> ranges",
		"allocd get allocations --ow=> --owner",
		"allocd release --=> ", "--force", "--uid", "--server", "--tls-ca-file",
		"allocd get ranges -o => table wide json yaml",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("bash completion printed:\n%s\nwant %q in it", out, want)
		}
	}
}

// TestCommandsWithTLS drives an allocd with TLS, client certificates and the example
// policy through the commands: without a certificate they are refused with what to
// do; an operator reads; a shim cannot force a release; an admin can.
func TestCommandsWithTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("a TLS allocd and certificates for every role: seconds")
	}
	d, caFile, issue := startTLSDaemon(t)
	cert := func(name, identity string) []string {
		crt, key := issue(name, identity)
		return []string{"--tls-cert-file", crt, "--tls-private-key-file", key}
	}
	operator := cert("operator", devpki.OperatorIdentity+"alice")
	shim := cert("shim", devpki.ShimIdentity+"apiserver-1")
	admin := cert("admin", devpki.AdminIdentity+"bob")
	for _, step := range []struct {
		who     string
		cert    []string
		args    []string
		code    int
		wantOut string
		wantErr string
	}{
		{"no TLS", nil, []string{"get", "ranges"}, 1, "", "does it serve TLS (--tls-ca-file)?"},
		{"no certificate", nil, []string{"get", "ranges"}, 1, "", "get ranges: unauthenticated: "},
		{"no certificate", nil, []string{"get", "ranges"}, 1, "",
			"present a client certificate: --tls-cert-file and --tls-private-key-file"},
		{"operator", operator, []string{"get", "ranges"}, 0, "10.0.0.0/24", ""},
		{"shim", shim, []string{"create", "allocation", "--owner", "default/web", "--uid", "uid-web",
			"10.0.0.20"}, 0, "allocated 10.0.0.20", ""},
		{"operator", operator, []string{"describe", "allocation", "10.0.0.20"}, 0, "uid-web", ""},
		{"shim", shim, []string{"release", "--force", "10.0.0.20"}, 1, "", "release: permission denied: "},
		{"admin", admin, []string{"release", "--force", "10.0.0.20"}, 0, "released 10.0.0.20 (forced)", ""},
	} {
		args := append(append(step.args, "--server", d.GRPCAddr(), "--tls-ca-file", caFile), step.cert...)
		if step.who == "no TLS" {
			args = append(step.args, "--server", d.GRPCAddr())
		}
		var stdout, stderr bytes.Buffer
		code := run(args, &stdout, &stderr)
		if code != step.code || !strings.Contains(stdout.String(), step.wantOut) ||
			!strings.Contains(stderr.String(), step.wantErr) {
			t.Errorf("allocd %s as %s = %d, %q, %q; want %d, %q in stdout, %q in stderr",
				strings.Join(step.args, " "), step.who,
				code, stdout.String(), stderr.String(), step.code, step.wantOut, step.wantErr)
		}
	}
}
