package cli

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// maxShown is how many endpoints the ENDPOINTS column shows before "+ N more...", as
// kubectl's.
const maxShown = 3

// endpointsList formats the addresses of subsets as kubectl's ENDPOINTS column does:
// "ip:port" for every address and port ("ip" for a subset without ports), the first
// max (all when max < 0) then "+ N more...". notReady formats the not-ready ones.
func endpointsList(subsets []*allocdv1.ServiceEndpointSubset, notReady bool, max int) string {
	var list []string
	count := 0
	add := func(s string) {
		count++
		if max < 0 || len(list) < max {
			list = append(list, s)
		}
	}
	for _, ss := range subsets {
		addrs := ss.GetAddresses()
		if notReady {
			addrs = ss.GetNotReadyAddresses()
		}
		for _, a := range addrs {
			if len(ss.GetPorts()) == 0 {
				add(a.GetIp())
			}
			for _, p := range ss.GetPorts() {
				add(net.JoinHostPort(a.GetIp(), strconv.Itoa(int(p.GetPort()))))
			}
		}
	}
	if len(list) == 0 {
		return "<none>"
	}
	s := strings.Join(list, ",")
	if count > len(list) {
		s += fmt.Sprintf(" + %d more...", count-len(list))
	}
	return s
}

// endpointsRow is the row of one Endpoints object.
func endpointsRow(m proto.Message, wide bool) []string {
	ep := m.(*allocdv1.ServiceEndpoints)
	if wide {
		return []string{ep.GetNamespace(), ep.GetName(), endpointsList(ep.GetSubsets(), false, -1),
			endpointsList(ep.GetSubsets(), true, -1), orNone(ep.GetManagedBy())}
	}
	return []string{ep.GetNamespace(), ep.GetName(), endpointsList(ep.GetSubsets(), false, maxShown),
		endpointsList(ep.GetSubsets(), true, maxShown)}
}

// endpointsHeader is the header of endpointsRow's table.
func endpointsHeader(wide bool) []string {
	if wide {
		return []string{"NAMESPACE", "NAME", "ENDPOINTS", "NOT READY", "MANAGED BY"}
	}
	return []string{"NAMESPACE", "NAME", "ENDPOINTS", "NOT READY"}
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

func newGetEndpoints(o *options) *cobra.Command {
	var namespace string
	var chunk int32
	cmd := &cobra.Command{
		Use:     "endpoints [NS/NAME]",
		Aliases: []string{"endpoint", "ep"},
		Short:   "List the Endpoints allocd keeps for Services with a selector, and default/kubernetes",
		Long: `List the Endpoints objects (ListServiceEndpoints, a page of --chunk-size at a time), of
every namespace or of -n's, or show one (GetServiceEndpoints): NS/NAME, or NAME in -n's
namespace (default when -n is not given). ENDPOINTS lists the ready addresses with
their ports as kubectl does, NOT READY the others.

-o wide lists every address, and who manages the object (endpoint-controller for a
Service's, masterlease for default/kubernetes).`,
		Example: `  allocd get endpoints
  allocd get endpoints -n shop
  allocd get endpoints shop/web -o yaml
  allocd get endpoints default/kubernetes`,
		Args: args(0, 1, "at most one NS/NAME"),
		RunE: runE(o, func(ctx context.Context, s *session, args []string) error {
			if len(args) == 1 {
				return getEndpoints(ctx, s, args[0], namespace)
			}
			req := &allocdv1.ListServiceEndpointsRequest{Namespace: namespace, PageSize: chunk}
			l := &list{w: s.out, format: o.output, field: "endpoints",
				header: endpointsHeader(o.output == outWide), row: endpointsRow}
			rev, err := listEndpoints(ctx, s, "get endpoints", req,
				func(ep *allocdv1.ServiceEndpoints, rev int64) error { return l.add(ep, rev) }, l.page)
			if err != nil {
				return l.cut(req.GetPageToken(), err)
			}
			return l.end(s.err, rev)
		}),
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "only this namespace (default: every namespace)")
	cmd.Flags().Int32Var(&chunk, "chunk-size", 500, "Endpoints per page (allocd caps it at 5000)")
	return cmd
}

// getEndpoints shows the Endpoints of one Service.
func getEndpoints(ctx context.Context, s *session, arg, namespace string) error {
	ns, name := splitName(arg, namespace)
	ep, err := call(ctx, s.o, func(ctx context.Context) (*allocdv1.ServiceEndpoints, error) {
		return s.c.GetServiceEndpoints(ctx, ns, name)
	})
	if err != nil {
		return s.fail("get endpoints "+ns+"/"+name, false, err)
	}
	if s.o.structured() {
		return printObject(s.out, s.o.output, ep)
	}
	tw := newTable(s.out)
	row(tw, endpointsHeader(s.o.output == outWide)...)
	row(tw, endpointsRow(ep, s.o.output == outWide)...)
	return tw.Flush()
}

// listEndpoints calls each with every Endpoints of req's listing and page after each
// page; it returns the revision the listing was read at. what names the command in
// errors.
func listEndpoints(ctx context.Context, s *session, what string, req *allocdv1.ListServiceEndpointsRequest,
	each func(*allocdv1.ServiceEndpoints, int64) error, page func() error) (int64, error) {
	return listAt(ctx, s, what, &req.PageToken,
		func(ctx context.Context) (*allocdv1.ListServiceEndpointsResponse, error) {
			return s.c.ListServiceEndpoints(ctx, req)
		}, (*allocdv1.ListServiceEndpointsResponse).GetEndpoints, each, page)
}

func newWatchEndpoints(o *options) *cobra.Command {
	var namespace string
	cmd := &cobra.Command{
		Use:     "endpoints [-n NS]",
		Aliases: []string{"endpoint", "ep"},
		Short:   "Print the Endpoints, then one line per change, until interrupted",
		Long: `List the Endpoints (of -n's namespace, or every one) as ADDED, then follow them
(WatchServiceEndpoints from the listing's revision) and print one line per change,
ADDED, MODIFIED or DELETED, as kubectl get -w --output-watch-events does, until Ctrl-C
(or SIGTERM), which exits 0. An allocd out of reach at the start exits 1.

A stream that breaks (allocd restarted, the connection cut) is opened again from the
last change printed, after a pause that grows up to 5s while it keeps failing (said on
stderr); no change is printed twice, none is missed. When etcd has compacted that
revision meanwhile, the Endpoints are listed again and what changed since is printed as
the changes it makes: DELETED for what is gone, ADDED or MODIFIED for the rest.

-o json prints each change as one line of JSON (a WatchServiceEndpointsResponse), -o
yaml as a YAML document.`,
		Example: `  allocd watch endpoints
  allocd watch endpoints -n shop
  allocd watch endpoints -o json | jq -c '{type, name: .endpoints.name}'`,
		Args: args(0, 0, "no argument (-n picks the namespace)"),
		RunE: runE(o, func(ctx context.Context, s *session, _ []string) error {
			ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			return watchEndpoints(ctx, s, namespace)
		}),
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "only this namespace (default: every namespace)")
	return cmd
}

// watchEndpoints lists, then follows the changes from the listing's revision, printing
// each (followWatch).
func watchEndpoints(ctx context.Context, s *session, namespace string) error {
	type (
		object = *allocdv1.ServiceEndpoints
		change = *allocdv1.WatchServiceEndpointsResponse
		typ    = allocdv1.WatchEventType
	)
	p := &eventPrinter[change]{w: s.out, format: s.o.output,
		header: endpointsHeader(s.o.output == outWide),
		row: func(ev change, wide bool) (string, []string) {
			return ev.GetType().String(), endpointsRow(ev.GetEndpoints(), wide)
		}}
	return followWatch(ctx, s, watchKind[object, change]{
		what: "watch endpoints",
		list: func(ctx context.Context, each func(object, int64) error, page func() error) (int64, error) {
			return listEndpoints(ctx, s, "watch endpoints",
				&allocdv1.ListServiceEndpointsRequest{Namespace: namespace}, each, page)
		},
		watch: func(ctx context.Context, from int64, each func(change) error) error {
			return s.c.WatchServiceEndpoints(ctx,
				&allocdv1.WatchServiceEndpointsRequest{Namespace: namespace, StartRevision: from}, each)
		},
		key: func(ep object) string { return ep.GetNamespace() + "/" + ep.GetName() },
		change: func(ev change) (typ, object, int64) {
			return ev.GetType(), ev.GetEndpoints(), ev.GetRevision()
		},
		event: func(t typ, ep object, rev int64) change {
			return &allocdv1.WatchServiceEndpointsResponse{Type: t, Endpoints: ep, Revision: rev}
		},
	}, p)
}
