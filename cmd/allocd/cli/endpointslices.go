package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// sliceRow is the row of one EndpointSlice, as kubectl's: its ports and the first
// addresses ("+ N more..."); -o wide every address, its Service, how many endpoints
// are ready, and who manages it.
func sliceRow(m proto.Message, wide bool) []string {
	s := m.(*allocdv1.EndpointSlice)
	var ports []string
	for _, p := range s.GetPorts() {
		ports = append(ports, strconv.Itoa(int(p.GetPort())))
	}
	portCol := strings.Join(ports, ",")
	if len(ports) == 0 {
		portCol = "<unset>"
	}
	if !wide {
		return []string{s.GetNamespace(), s.GetName(), s.GetAddressType(), portCol,
			sliceAddresses(s, maxShown)}
	}
	ready := 0
	for _, e := range s.GetEndpoints() {
		if e.GetConditions().GetReady() {
			ready++
		}
	}
	return []string{s.GetNamespace(), s.GetName(), s.GetAddressType(), portCol, sliceAddresses(s, -1),
		s.GetLabels()["kubernetes.io/service-name"], fmt.Sprintf("%d/%d", ready, len(s.GetEndpoints())),
		orNone(s.GetLabels()["endpointslice.kubernetes.io/managed-by"])}
}

// sliceAddresses lists the addresses of a slice's endpoints, the first max (all when
// max < 0) then "+ N more...".
func sliceAddresses(s *allocdv1.EndpointSlice, max int) string {
	var list []string
	count := 0
	for _, e := range s.GetEndpoints() {
		for _, a := range e.GetAddresses() {
			count++
			if max < 0 || len(list) < max {
				list = append(list, a)
			}
		}
	}
	if len(list) == 0 {
		return "<none>"
	}
	out := strings.Join(list, ",")
	if count > len(list) {
		out += fmt.Sprintf(" + %d more...", count-len(list))
	}
	return out
}

// sliceHeader is the header of sliceRow's table.
func sliceHeader(wide bool) []string {
	h := []string{"NAMESPACE", "NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS"}
	if wide {
		h = append(h, "SERVICE", "READY", "MANAGED BY")
	}
	return h
}

func newGetEndpointSlices(o *options) *cobra.Command {
	var namespace, service string
	var chunk int32
	cmd := &cobra.Command{
		Use:     "endpointslices",
		Aliases: []string{"endpointslice", "slices"},
		Short:   "List the EndpointSlices allocd keeps for Services with a selector, and default/kubernetes",
		Long: `List the EndpointSlices (ListEndpointSlices, a page of --chunk-size at a time), of every
namespace, of -n's, or of one Service (--service, with -n; default namespace "default").
PORTS lists the port numbers and ENDPOINTS the addresses, as kubectl does.

-o wide lists every address, the Service, how many endpoints are ready, and who manages
the slice (endpointslice-controller.k8s.io; none for default/kubernetes').`,
		Example: `  allocd get endpointslices
  allocd get endpointslices -n shop
  allocd get endpointslices -n shop --service web -o yaml`,
		Args: args(0, 0, "no argument (-n and --service pick the slices)"),
		RunE: runE(o, func(ctx context.Context, s *session, _ []string) error {
			if service != "" && namespace == "" {
				namespace = "default"
			}
			req := &allocdv1.ListEndpointSlicesRequest{Namespace: namespace, ServiceName: service,
				PageSize: chunk}
			l := &list{w: s.out, format: o.output, field: "endpointSlices",
				header: sliceHeader(o.output == outWide), row: sliceRow}
			rev, err := listSlices(ctx, s, "get endpointslices", req,
				func(es *allocdv1.EndpointSlice, rev int64) error {
					return l.add(es, rev)
				}, l.page)
			if err != nil {
				return err
			}
			return l.end(s.err, rev)
		}),
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "only this namespace (default: every namespace)")
	cmd.Flags().StringVar(&service, "service", "", "only the slices of this Service (of -n's namespace)")
	cmd.Flags().Int32Var(&chunk, "chunk-size", 500, "EndpointSlices per page (allocd caps it at 5000)")
	return cmd
}

// listSlices calls each with every slice of req's listing and page after each page; it
// returns the revision the listing was read at.
func listSlices(ctx context.Context, s *session, what string, req *allocdv1.ListEndpointSlicesRequest,
	each func(*allocdv1.EndpointSlice, int64) error, page func() error) (int64, error) {
	return listAt(ctx, s, what, &req.PageToken,
		func(ctx context.Context) (*allocdv1.ListEndpointSlicesResponse, error) {
			return s.c.ListEndpointSlices(ctx, req)
		}, (*allocdv1.ListEndpointSlicesResponse).GetEndpointSlices, each, page)
}

func newWatchEndpointSlices(o *options) *cobra.Command {
	var namespace string
	cmd := &cobra.Command{
		Use:     "endpointslices [-n NS]",
		Aliases: []string{"endpointslice", "slices"},
		Short:   "Print the EndpointSlices, then one line per change, until interrupted",
		Long: `List the EndpointSlices (of -n's namespace, or every one) as ADDED, then follow them
(WatchEndpointSlices from the listing's revision) and print one line per change, ADDED,
MODIFIED or DELETED, as kubectl get -w --output-watch-events does, until Ctrl-C (or
SIGTERM), which exits 0. When the stream breaks (allocd restarted), it watches again from
the last revision it printed; when that revision was compacted, it lists again.

-o json prints each change as one line of JSON (a WatchEndpointSlicesResponse), -o yaml
as a YAML document.`,
		Example: `  allocd watch endpointslices
  allocd watch endpointslices -n shop -o json | jq -c '{type, name: .endpointSlice.name}'`,
		Args: args(0, 0, "no argument (-n picks the namespace)"),
		RunE: runE(o, func(ctx context.Context, s *session, _ []string) error {
			ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			return watchSlices(ctx, s, namespace)
		}),
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "only this namespace (default: every namespace)")
	return cmd
}

// watchSlices lists, then follows the changes from the listing's revision, printing
// each (followWatch).
func watchSlices(ctx context.Context, s *session, namespace string) error {
	type (
		object = *allocdv1.EndpointSlice
		change = *allocdv1.WatchEndpointSlicesResponse
		typ    = allocdv1.WatchEventType
	)
	p := &eventPrinter[change]{w: s.out, format: s.o.output,
		header: sliceHeader(s.o.output == outWide),
		row: func(ev change, wide bool) (string, []string) {
			return ev.GetType().String(), sliceRow(ev.GetEndpointSlice(), wide)
		}}
	return followWatch(ctx, s, watchKind[object, change]{
		what: "watch endpointslices",
		list: func(ctx context.Context, each func(object, int64) error, page func() error) (int64, error) {
			return listSlices(ctx, s, "watch endpointslices",
				&allocdv1.ListEndpointSlicesRequest{Namespace: namespace}, each, page)
		},
		watch: func(ctx context.Context, from int64, each func(change) error) error {
			return s.c.WatchEndpointSlices(ctx,
				&allocdv1.WatchEndpointSlicesRequest{Namespace: namespace, StartRevision: from}, each)
		},
		key: func(es object) string { return es.GetNamespace() + "/" + es.GetName() },
		change: func(ev change) (typ, object, int64) {
			return ev.GetType(), ev.GetEndpointSlice(), ev.GetRevision()
		},
		event: func(t typ, es object, rev int64) change {
			return &allocdv1.WatchEndpointSlicesResponse{Type: t, EndpointSlice: es, Revision: rev}
		},
	}, p)
}
