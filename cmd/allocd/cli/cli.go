package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc/codes"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/tlsfiles"
)

// defaultServer is the allocd the commands call without --server or $ALLOCD_SERVER:
// allocd's default --grpc-address.
const defaultServer = "127.0.0.1:8080"

// ServerEnv names the environment variable that replaces defaultServer, as
// ETCDCTL_ENDPOINTS does for etcdctl.
const ServerEnv = "ALLOCD_SERVER"

// Output formats of -o.
const (
	outTable = "table"
	outWide  = "wide"
	outJSON  = "json"
	outYAML  = "yaml"
)

var outputs = []string{outTable, outWide, outJSON, outYAML}

// options are the flags that every operator command shares.
type options struct {
	server  string
	timeout time.Duration
	output  string
	tls     bool
	files   tlsfiles.Files
	// tc is the TLS side of the connection dial made, nil without TLS.
	tc *tlsfiles.Client
}

// register adds the shared flags to fs (a command's persistent flags).
func (o *options) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.server, "server", defaultServer,
		"host:port of the allocd to call ($"+ServerEnv+" replaces the default)")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second,
		"how long to wait for allocd to connect and answer, per call")
	fs.StringVarP(&o.output, "output", "o", outTable,
		"output format: "+strings.Join(outputs, ", ")+" (json is the API's proto JSON)")
	fs.BoolVar(&o.tls, "tls", false, "use TLS (implied by --tls-ca-file), verifying allocd's certificate "+
		"against the system roots unless --tls-ca-file")
	fs.StringVar(&o.files.CAFile, "tls-ca-file", "",
		"PEM CA bundle that allocd's certificate is verified against (it must name the host of --server)")
	fs.StringVar(&o.files.CertFile, "tls-cert-file", "",
		"client certificate to present (allocd's --client-ca-file asks for one)")
	fs.StringVar(&o.files.KeyFile, "tls-private-key-file", "", "private key of --tls-cert-file")
}

// check validates the shared flags before a command runs.
func (o *options) check(cmd *cobra.Command) error {
	if v := os.Getenv(ServerEnv); v != "" && !cmd.Flags().Changed("server") &&
		!cmd.Flags().Changed("grpc-address") {
		o.server = v
	}
	if o.output == "" {
		o.output = outTable
	}
	if o.timeout <= 0 {
		return usage(cmd, fmt.Errorf("--timeout %s: want more than 0", o.timeout))
	}
	if slices.Contains(outputs, o.output) {
		return nil
	}
	return usage(cmd, fmt.Errorf("--output %q: want one of %s", o.output, strings.Join(outputs, ", ")))
}

// usesTLS reports whether the TLS flags ask for TLS.
func (o *options) usesTLS() bool { return o.tls || o.files != (tlsfiles.Files{}) }

// structured reports whether -o asks for JSON or YAML.
func (o *options) structured() bool { return o.output == outJSON || o.output == outYAML }

// dial returns a client of the allocd at --server. Calls are not retried: a person
// waits for the answer and is told at once that allocd is out of reach. hangUp
// releases the connection and the TLS files.
func (o *options) dial() (c *client.Client, hangUp func(), err error) {
	opts := []client.Option{client.WithRetry(client.RetryPolicy{MaxAttempts: 1})}
	closeTLS := func() {}
	if o.usesTLS() {
		tc, err := tlsfiles.NewClient(o.files)
		if err != nil {
			return nil, nil, err
		}
		opts = append(opts, client.WithDialOptions(tc.DialOption()))
		closeTLS = tc.Close
		o.tc = tc
	}
	c, err = client.New(o.server, opts...)
	if err != nil {
		closeTLS()
		return nil, nil, err
	}
	return c, func() { c.Close(); closeTLS() }, nil
}

// call runs a read within --timeout.
func call[T any](ctx context.Context, o *options, f func(context.Context) (T, error)) (T, error) {
	return attempt(ctx, o, true, f)
}

// callWrite runs a write within --timeout.
func callWrite[T any](ctx context.Context, o *options, f func(context.Context) (T, error)) (T, error) {
	return attempt(ctx, o, false, f)
}

// attempt runs f within --timeout. When allocd answers that it cannot serve yet
// (starting, its etcd out of reach) and says when to try again, f is tried again then,
// as a person would, while --timeout allows: a read always, a write only when allocd
// says it applied nothing. An allocd out of reach is not waited for.
func attempt[T any](ctx context.Context, o *options, read bool,
	f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	for {
		v, err := f(ctx)
		var e *client.Error
		if !errors.As(err, &e) || e.Code != codes.Unavailable || unreached(e) || e.RetryDelay <= 0 || !read &&
			!e.NotApplied {
			return v, err
		}
		if deadline, _ := ctx.Deadline(); time.Until(deadline) < e.RetryDelay {
			return v, err
		}
		t := time.NewTimer(e.RetryDelay)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C:
		}
	}
}

// listAt lists every page of a listing read at one revision (list, its items by
// items), calling each with every item and the revision, and page after each page; it
// returns the revision.
func listAt[P interface {
	GetNextPageToken() string
	GetRevision() int64
}, T any](ctx context.Context, s *session, what string, token *string,
	list func(context.Context) (P, error), items func(P) []T, each func(T, int64) error,
	page func() error) (int64, error) {
	var rev int64
	err := pages(ctx, s, what, token, list, func(resp P) error {
		rev = resp.GetRevision()
		for _, it := range items(resp) {
			if err := each(it, rev); err != nil {
				return err
			}
		}
		return page()
	})
	if err != nil {
		return 0, err
	}
	return rev, nil
}

// pages reads a paged listing: list reads the page of *token (its request's page
// token) and each takes it, until the last page. A failed call is s.fail(what).
func pages[P interface{ GetNextPageToken() string }](ctx context.Context, s *session, what string,
	token *string,
	list func(context.Context) (P, error), each func(P) error) error {
	for {
		page, err := call(ctx, s.o, list)
		if err != nil {
			return s.fail(what, false, err)
		}
		if err := each(page); err != nil {
			return err
		}
		if *token = page.GetNextPageToken(); *token == "" {
			return nil
		}
	}
}

// session is what a command's body gets: its command, a connected client and where
// to print.
type session struct {
	cmd *cobra.Command
	c   *client.Client
	o   *options
	out io.Writer
	err io.Writer
}

// fail wraps the error of a call made to do what (a write when write is set), for
// Execute to print; nil stays nil.
func (s *session) fail(what string, write bool, err error) error {
	if err == nil {
		return nil
	}
	e := &callError{what: what, server: s.o.server, timeout: s.o.timeout, tls: s.o.usesTLS(),
		json: s.o.structured(), write: write, err: err}
	if s.o.tc != nil {
		e.handshake = s.o.tc.HandshakeError()
	}
	return e
}

// failNotOwner is fail for a write whose refusal with ErrNotOwner (FAILED_PRECONDITION,
// NOT_OWNER) is followed by hint rather than by release's --force.
func (s *session) failNotOwner(what string, err error, hint string) error {
	e := s.fail(what, true, err)
	if ce, ok := e.(*callError); ok {
		ce.notOwnerHint = hint
	}
	return e
}

// runE makes a command's RunE of body: it checks the shared flags, dials, runs body
// and hangs up.
func runE(o *options, body func(ctx context.Context, s *session, args []string) error) func(*cobra.Command,
	[]string) error {
	return func(cmd *cobra.Command, args []string) error {
		if err := o.check(cmd); err != nil {
			return err
		}
		c, hangUp, err := o.dial()
		if err != nil {
			return usage(cmd, err) // the TLS files
		}
		defer hangUp()
		return body(cmd.Context(),
			&session{cmd: cmd, c: c, o: o, out: cmd.OutOrStdout(), err: cmd.ErrOrStderr()}, args)
	}
}

// completeFrom completes a command's one argument with what list asks allocd for
// (ServiceCIDR names, lease IPs), with the flags given so far; nothing when allocd
// does not answer within a second or two.
func completeFrom(o *options,
	list func(ctx context.Context, s *session) ([]string, error)) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 || o.check(cmd) != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		c, hangUp, err := o.dial()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		defer hangUp()
		o.timeout = min(o.timeout, 2*time.Second)
		names, _ := list(cmd.Context(), &session{cmd: cmd, c: c, o: o, out: io.Discard, err: io.Discard})
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

// ExitCode is an error that only sets the exit code: what failed was said already.
type ExitCode int

// Error says which exit code.
func (e ExitCode) Error() string { return fmt.Sprintf("exit code %d", int(e)) }

// usageError is a command line that cannot be run as written.
type usageError struct {
	cmd *cobra.Command
	err error
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usage(cmd *cobra.Command, err error) error { return &usageError{cmd: cmd, err: err} }

// args checks that a command has between min and max arguments (max < 0: no bound),
// naming what they are in the error.
func args(min, max int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) < min:
			return usage(cmd, fmt.Errorf("missing %s", what))
		case max >= 0 && len(args) > max:
			return usage(cmd, fmt.Errorf("unexpected argument %q (want %s)", args[max], what))
		}
		return nil
	}
}

// requireFlags is a PreRunE that refuses a command line without the flags names, as a
// usage error (cobra's own check of required flags, after it, does not say it is one).
func requireFlags(names ...string) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		var missing []string
		for _, n := range names {
			if !cmd.Flags().Changed(n) {
				missing = append(missing, "--"+n)
			}
		}
		if len(missing) > 0 {
			return usage(cmd, fmt.Errorf("missing %s", strings.Join(missing, " and ")))
		}
		return nil
	}
}

// Execute runs root (allocd with the commands of Commands added) with args, prints
// the error of a command that fails in one line on stderr (a failed call as its
// google.rpc.Status in JSON with -o json or yaml) and returns the exit code: 0, 1 for
// a failed command, 2 for a command line that cannot be run.
func Execute(ctx context.Context, root *cobra.Command, args []string, stdout, stderr io.Writer) int {
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SilenceErrors, root.SilenceUsage = true, true
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error { return usage(cmd, err) })
	_, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	var code ExitCode
	var uerr *usageError
	var cerr *callError
	switch {
	case errors.As(err, &code):
		return int(code)
	case errors.As(err, &uerr):
		fmt.Fprintf(stderr, "error: %s (see '%s --help')\n", oneLine(uerr.err.Error()),
			uerr.cmd.CommandPath())
		return 2
	case errors.As(err, &cerr):
		cerr.print(stderr)
		return 1
	}
	fmt.Fprintf(stderr, "error: %s\n", oneLine(err.Error()))
	return 1
}

// oneLine joins the lines of s.
func oneLine(s string) string { return strings.ReplaceAll(strings.TrimSpace(s), "\n", "; ") }
