package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/allocd/allocd/client"
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
	list := firstOf{max: max}
	for _, e := range s.GetEndpoints() {
		for _, a := range e.GetAddresses() {
			list.add(a)
		}
	}
	return list.String()
}

// sliceHeader is the header of sliceRow's table.
func sliceHeader(wide bool) []string {
	h := []string{"NAMESPACE", "NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS"}
	if wide {
		h = append(h, "SERVICE", "READY", "MANAGED BY")
	}
	return h
}

// slicesKind is the EndpointSlices, for getCommand and watchCommand.
var slicesKind = kind[*allocdv1.EndpointSlice, *allocdv1.ListEndpointSlicesResponse,
	*allocdv1.WatchEndpointSlicesResponse]{
	resource: "endpointslices", plural: "EndpointSlices", field: "endpointSlices", header: sliceHeader,
	row: sliceRow,
	list: func(ctx context.Context, c *client.Client, q query,
		token string) (*allocdv1.ListEndpointSlicesResponse, error) {
		return c.ListEndpointSlices(ctx, &allocdv1.ListEndpointSlicesRequest{Namespace: q.namespace,
			ServiceName: q.service, PageSize: q.pageSize, PageToken: token})
	},
	items: (*allocdv1.ListEndpointSlicesResponse).GetEndpointSlices,
	watch: func(ctx context.Context, c *client.Client, namespace string, from int64,
		each func(*allocdv1.WatchEndpointSlicesResponse) error) error {
		return c.WatchEndpointSlices(ctx,
			&allocdv1.WatchEndpointSlicesRequest{Namespace: namespace, StartRevision: from}, each)
	},
	object: (*allocdv1.WatchEndpointSlicesResponse).GetEndpointSlice,
	event: func(t allocdv1.WatchEventType, es *allocdv1.EndpointSlice,
		rev int64) *allocdv1.WatchEndpointSlicesResponse {
		return &allocdv1.WatchEndpointSlicesResponse{Type: t, EndpointSlice: es, Revision: rev}
	},
}

func newGetEndpointSlices(o *options) *cobra.Command {
	q := &query{}
	cmd := &cobra.Command{
		Use:     "endpointslices",
		Aliases: []string{"endpointslice", "slices"},
		Short:   "List the EndpointSlices allocd keeps for Services with a selector, and default/kubernetes",
		Long: `List the EndpointSlices (ListEndpointSlices, a page of --chunk-size at a time), of every
namespace (-A, or no -n), of -n's, or of one Service (--service, with -n; default
namespace "default"). PORTS lists the port numbers and ENDPOINTS the addresses, as
kubectl does.

-o wide lists every address, the Service, how many endpoints are ready, and who manages
the slice (endpointslice-controller.k8s.io; none for default/kubernetes').`,
		Example: `  allocd get endpointslices
  allocd get endpointslices -A -o wide
  allocd get endpointslices -n shop
  allocd get endpointslices -n shop --service web -o yaml`,
		Args: args(0, 0, "no argument (-n and --service pick the slices)"),
	}
	cmd.Flags().StringVar(&q.service, "service", "", "only the slices of this Service (of -n's namespace)")
	return getCommand(o, slicesKind, q, cmd)
}

func newWatchEndpointSlices(o *options) *cobra.Command {
	return watchCommand(o, slicesKind, &cobra.Command{
		Use:     "endpointslices [-n NS | -A]",
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
  allocd watch endpointslices -A
  allocd watch endpointslices -n shop -o json | jq -c '{type, name: .endpointSlice.name}'`,
	})
}
