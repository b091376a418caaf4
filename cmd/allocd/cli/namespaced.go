package cli

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/protobuf/proto"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// listResponse is one page of a listing read at one revision.
type listResponse interface {
	proto.Message
	GetNextPageToken() string
	GetRevision() int64
}

// object is an object of a namespace.
type object interface {
	proto.Message
	GetNamespace() string
	GetName() string
}

// watchEvent is a change of an object, as a watch sends it.
type watchEvent interface {
	proto.Message
	GetType() allocdv1.WatchEventType
	GetRevision() int64
}

// query picks the objects of a listing.
type query struct {
	namespace string // "": every namespace
	service   string // "": every Service's; a kind listed by Service only
	pageSize  int32  // 0: allocd's default
}

// kind is one kind of namespaced object that allocd keeps (Endpoints,
// EndpointSlices), as its get and watch commands see it: the objects O, listed in pages
// L, whose changes a watch sends as E. Those commands are one loop for every kind
// (getCommand, watchCommand); a kind brings what differs: its requests, its rows.
type kind[O object, L listResponse, E watchEvent] struct {
	resource string // as the commands name it: "endpoints"
	plural   string // as the help names it: "Endpoints"
	field    string // the objects' field in L: -o json's and yaml's, "No … found."
	header   func(wide bool) []string
	row      func(m proto.Message, wide bool) []string
	// get reads one object; nil for a kind shown in listings only.
	get func(ctx context.Context, c *client.Client, namespace, name string) (O, error)
	// list reads the page of token.
	list  func(ctx context.Context, c *client.Client, q query, token string) (L, error)
	items func(L) []O
	// watch opens one stream of the changes after revision from, each with every one,
	// until it breaks.
	watch  func(ctx context.Context, c *client.Client, namespace string, from int64, each func(E) error) error
	object func(E) O // the object of a change
	// event makes a change of an object, for what a listing shows (followWatch).
	event func(allocdv1.WatchEventType, O, int64) E
}

// namespaces are -n and -A, with kubectl's meaning: one namespace's objects, or every
// namespace's. Without either allocd lists every namespace's (it has no current
// namespace, as kubectl's context has), so -A is what a kubectl habit types for that.
type namespaces struct {
	namespace string
	all       bool
}

// register adds -n and -A to fs.
func (n *namespaces) register(fs *pflag.FlagSet) {
	fs.StringVarP(&n.namespace, "namespace", "n", "", "only this namespace (default: every namespace)")
	fs.BoolVarP(&n.all, "all-namespaces", "A", false,
		"every namespace, as without -n (kubectl's flag); -n is then ignored, as kubectl ignores it")
}

// check makes -A win over -n, as kubectl does (its help: "Namespace in current context
// is ignored even if specified with --namespace"), and, when conflict is set, refuses
// -A with what names one namespace's objects (conflict says why).
func (n *namespaces) check(cmd *cobra.Command, conflict string) error {
	if !n.all {
		return nil
	}
	if conflict != "" {
		return usage(cmd, errors.New(conflict))
	}
	n.namespace = ""
	return nil
}

// getCommand completes cmd, the get command of k (its help and arguments set, and the
// flags of q its kind has), with -n, -A, --chunk-size and what it runs: a listing, or
// with an argument one object (NS/NAME, or NAME in -n's namespace; default "default").
// --service (q.service) lists one Service's, in -n's namespace (default "default").
func getCommand[O object, L listResponse, E watchEvent](o *options, k kind[O, L, E], q *query,
	cmd *cobra.Command) *cobra.Command {
	var ns namespaces
	cmd.PreRunE = func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) > 0: // kubectl's words
			return ns.check(cmd, "a resource cannot be retrieved by name across all namespaces")
		case q.service != "":
			return ns.check(cmd, "--service names a Service of one namespace: not with -A/--all-namespaces")
		}
		return ns.check(cmd, "")
	}
	cmd.RunE = runE(o, func(ctx context.Context, s *session, args []string) error {
		if len(args) == 1 {
			return k.show(ctx, s, args[0], ns.namespace)
		}
		q.namespace = ns.namespace
		if q.service != "" && q.namespace == "" {
			q.namespace = "default"
		}
		l := &list{w: s.out, format: o.output, field: k.field, header: k.header(o.output == outWide),
			row: k.row}
		var token string
		rev, err := k.listAll(ctx, s, "get "+k.resource, *q, &token, func(obj O, rev int64) error {
			return l.add(obj, rev)
		}, l.page)
		if err != nil {
			return l.cut(token, err)
		}
		return l.end(s.err, rev)
	})
	ns.register(cmd.Flags())
	cmd.Flags().Int32Var(&q.pageSize, "chunk-size", 500, k.plural+" per page (allocd caps it at 5000)")
	return cmd
}

// show shows one object: arg is NS/NAME, or NAME in namespace (default "default").
func (k kind[O, L, E]) show(ctx context.Context, s *session, arg, namespace string) error {
	ns, name := splitName(arg, namespace)
	obj, err := call(ctx, s.o, func(ctx context.Context) (O, error) { return k.get(ctx, s.c, ns, name) })
	if err != nil {
		return s.fail("get "+k.resource+" "+ns+"/"+name, false, err)
	}
	if s.o.structured() {
		return printObject(s.out, s.o.output, obj)
	}
	tw := newTable(s.out)
	row(tw, k.header(s.o.output == outWide)...)
	row(tw, k.row(obj, s.o.output == outWide)...)
	return tw.Flush()
}

// splitName reads NS/NAME, or NAME in namespace (default "default").
func splitName(arg, namespace string) (string, string) {
	if ns, name, ok := strings.Cut(arg, "/"); ok {
		return ns, name
	}
	if namespace == "" {
		namespace = "default"
	}
	return namespace, arg
}

// listAll calls each with every object of q's listing and page after each page; it
// returns the revision the listing was read at. *token is the page token of the page
// read last (of the page that failed, on an error). what names the command in errors.
func (k kind[O, L, E]) listAll(ctx context.Context, s *session, what string, q query, token *string,
	each func(O, int64) error, page func() error) (int64, error) {
	return listAt(ctx, s, what, token,
		func(ctx context.Context) (L, error) { return k.list(ctx, s.c, q, *token) }, k.items, each, page)
}

// watchCommand completes cmd, the watch command of k (its help set), with -n, -A and
// what it runs: the objects listed, then their changes followed (followWatch) until
// Ctrl-C or SIGTERM, which exit 0.
func watchCommand[O object, L listResponse, E watchEvent](o *options, k kind[O, L, E],
	cmd *cobra.Command) *cobra.Command {
	var ns namespaces
	cmd.Args = args(0, 0, "no argument (-n picks the namespace)")
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error { return ns.check(cmd, "") }
	cmd.RunE = runE(o, func(ctx context.Context, s *session, _ []string) error {
		ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
		return k.follow(ctx, s, ns.namespace)
	})
	ns.register(cmd.Flags())
	return cmd
}

// follow lists the objects of namespace (every one for ""), then follows their
// changes from the listing's revision, printing each (followWatch).
func (k kind[O, L, E]) follow(ctx context.Context, s *session, namespace string) error {
	what := "watch " + k.resource
	p := &eventPrinter[E]{w: s.out, format: s.o.output, header: k.header(s.o.output == outWide),
		row: func(ev E, wide bool) (string, []string) {
			return ev.GetType().String(), k.row(k.object(ev), wide)
		}}
	return followWatch(ctx, s, watchKind[O, E]{
		what: what,
		list: func(ctx context.Context, each func(O, int64) error, page func() error) (int64, error) {
			var token string
			return k.listAll(ctx, s, what, query{namespace: namespace}, &token, each, page)
		},
		watch: func(ctx context.Context, from int64, each func(E) error) error {
			return k.watch(ctx, s.c, namespace, from, each)
		},
		key: func(obj O) string { return obj.GetNamespace() + "/" + obj.GetName() },
		change: func(ev E) (allocdv1.WatchEventType, O, int64) {
			return ev.GetType(), k.object(ev), ev.GetRevision()
		},
		event: k.event,
	}, p)
}
