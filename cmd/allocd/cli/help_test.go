package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestCompletion: `allocd completion bash` writes cobra's script, and the completion
// it calls (allocd __complete) offers the commands, resources, flags, -o's formats and
// names read from allocd.
func TestCompletion(t *testing.T) {
	start(t) // for the ServiceCIDR names
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"completion", "bash"},
			[]string{"__start_allocd", "__complete", "complete -o default -F __start_allocd allocd"}},
		{[]string{"completion", "zsh"}, []string{"#compdef allocd"}},
		{[]string{"completion", "fish"}, []string{"complete -c allocd"}},
		{[]string{"__complete", ""}, []string{"get\t", "describe\t", "create\t", "delete\t", "release\t",
			"repair\t", "watch\t", "completion\t"}},
		{[]string{"__complete", "get", ""},
			[]string{"ranges\t", "allocations\t", "leases\t", "servicecidrs\t", "endpoints\t"}},
		{[]string{"__complete", "repair", ""}, []string{"run\t", "status\t"}},
		{[]string{"__complete", "get", "allocations", "--"}, []string{"--owner\t", "--range\t", "--uid\t",
			"--chunk-size\t", "--server\t", "--timeout\t", "--output\t", "--tls-ca-file\t",
			"--tls-cert-file\t", "--tls-private-key-file\t"}},
		{[]string{"__complete", "release", "--"},
			[]string{"--owner\t", "--force\t", "--uid\t", "--server\t"}},
		{[]string{"__complete", "get", "ranges", "-o", ""}, []string{"table", "wide", "json", "yaml"}},
		{[]string{"__complete", "delete", "servicecidr", ""}, []string{"kubernetes"}},
		{[]string{"__complete", "create", "allocation", "--ip-family-policy", ""},
			[]string{"SingleStack", "RequireDualStack"}},
	} {
		out, stderr, code := execute(context.Background(), tc.args...)
		if code != 0 {
			t.Errorf("allocd %s = %d, %s", strings.Join(tc.args, " "), code, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("allocd %q printed:\n%s\nwant %q in it", tc.args, out, w)
			}
		}
	}
}

// TestHelp: every command explains itself, kubectl-style: a line, a paragraph and
// examples, and -h prints them.
func TestHelp(t *testing.T) {
	root := &cobra.Command{Use: "allocd"}
	root.AddCommand(Commands()...)
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if c == root {
			return
		}
		if c.Short == "" || c.Long == "" {
			t.Errorf("%s has no Short or Long help", c.CommandPath())
		}
		if !c.HasSubCommands() && c.Example == "" {
			t.Errorf("%s has no examples", c.CommandPath())
		}
		args := append(strings.Fields(strings.TrimPrefix(c.CommandPath(), "allocd ")), "--help")
		out, _, code := execute(context.Background(), args...)
		if code != 0 || !strings.Contains(out, c.Long[:min(len(c.Long), 20)]) ||
			!strings.Contains(out, "--server") {
			t.Errorf("allocd %s = %d:\n%s\nwant its help, with the shared flags", strings.Join(args, " "),
				code, out)
		}
		if !c.HasSubCommands() && !strings.Contains(out, "Examples:") {
			t.Errorf("allocd %s has no examples:\n%s", strings.Join(args, " "), out)
		}
	}
	walk(root)
	out, _, _ := execute(context.Background(), "get", "ranges", "--help")
	compareGolden(t, "help-get-ranges", out)
}

// TestFullHint: one hint per full range, ServiceCIDRs told from node-port ranges, also
// when a family's ranges are all full at once (the server lists them in one subject).
func TestFullHint(t *testing.T) {
	for subject, want := range map[string]string{
		"10.0.0.0/24": "full: 10.0.0.0/24; make room: release what is unused (allocd get " +
			"allocations --range 10.0.0.0/24) or add a range (allocd create servicecidr NAME CIDR)",
		"10.0.0.0/24, 10.1.0.0/29": "full: 10.0.0.0/24, 10.1.0.0/29; make room: release what is unused " +
			"(allocd get allocations --range 10.0.0.0/24; allocd get allocations --range 10.1.0.0/29) or " +
			"add a range (allocd create servicecidr NAME CIDR)",
		"30000-32767": "full: 30000-32767; make room: release unused node ports (allocd get " +
			"allocations --range 30000-32767)",
	} {
		if got := fullHint(subject); got != want {
			t.Errorf("fullHint(%q) =\n  %s\nwant\n  %s", subject, got, want)
		}
	}
}
