package cli

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// maxShown is how many endpoints the ENDPOINTS column shows before "+ N more...", as
// kubectl's.
const maxShown = 3

// firstOf is a list as kubectl's ENDPOINTS column shows it: the first max items added
// (every one when max < 0), then "+ N more...".
type firstOf struct {
	max   int
	count int
	shown []string
}

// add adds an item.
func (f *firstOf) add(s string) {
	f.count++
	if f.max < 0 || len(f.shown) < f.max {
		f.shown = append(f.shown, s)
	}
}

// String is the items shown, comma-separated, and how many more there are; "<none>"
// without items.
func (f *firstOf) String() string {
	if len(f.shown) == 0 {
		return "<none>"
	}
	s := strings.Join(f.shown, ",")
	if f.count > len(f.shown) {
		s += fmt.Sprintf(" + %d more...", f.count-len(f.shown))
	}
	return s
}

// endpointsList formats the addresses of subsets as kubectl's ENDPOINTS column does:
// "ip:port" for every address and port ("ip" for a subset without ports), the first
// max (all when max < 0) then "+ N more...". notReady formats the not-ready ones.
func endpointsList(subsets []*allocdv1.ServiceEndpointSubset, notReady bool, max int) string {
	list := firstOf{max: max}
	for _, ss := range subsets {
		addrs := ss.GetAddresses()
		if notReady {
			addrs = ss.GetNotReadyAddresses()
		}
		for _, a := range addrs {
			if len(ss.GetPorts()) == 0 {
				list.add(a.GetIp())
			}
			for _, p := range ss.GetPorts() {
				list.add(net.JoinHostPort(a.GetIp(), strconv.Itoa(int(p.GetPort()))))
			}
		}
	}
	return list.String()
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

// endpointsKind is the Endpoints objects, for getCommand and watchCommand.
var endpointsKind = kind[*allocdv1.ServiceEndpoints, *allocdv1.ListServiceEndpointsResponse,
	*allocdv1.WatchServiceEndpointsResponse]{
	resource: "endpoints", plural: "Endpoints", field: "endpoints",
	header: endpointsHeader, row: endpointsRow,
	get: func(ctx context.Context, c *client.Client, ns, name string) (*allocdv1.ServiceEndpoints, error) {
		return c.GetServiceEndpoints(ctx, ns, name)
	},
	list: func(ctx context.Context, c *client.Client, q query,
		token string) (*allocdv1.ListServiceEndpointsResponse, error) {
		return c.ListServiceEndpoints(ctx, &allocdv1.ListServiceEndpointsRequest{Namespace: q.namespace,
			PageSize: q.pageSize, PageToken: token})
	},
	items: (*allocdv1.ListServiceEndpointsResponse).GetEndpoints,
	watch: func(ctx context.Context, c *client.Client, namespace string, from int64,
		each func(*allocdv1.WatchServiceEndpointsResponse) error) error {
		return c.WatchServiceEndpoints(ctx,
			&allocdv1.WatchServiceEndpointsRequest{Namespace: namespace, StartRevision: from}, each)
	},
	object: (*allocdv1.WatchServiceEndpointsResponse).GetEndpoints,
	event: func(t allocdv1.WatchEventType, ep *allocdv1.ServiceEndpoints,
		rev int64) *allocdv1.WatchServiceEndpointsResponse {
		return &allocdv1.WatchServiceEndpointsResponse{Type: t, Endpoints: ep, Revision: rev}
	},
}

func newGetEndpoints(o *options) *cobra.Command {
	return getCommand(o, endpointsKind, &query{}, &cobra.Command{
		Use:     "endpoints [NS/NAME]",
		Aliases: []string{"endpoint", "ep"},
		Short:   "List the Endpoints allocd keeps for Services with a selector, and default/kubernetes",
		Long: `List the Endpoints objects (ListServiceEndpoints, a page of --chunk-size at a time), of
every namespace (-A, or no -n) or of -n's, or show one (GetServiceEndpoints): NS/NAME, or
NAME in -n's namespace (default when -n is not given). ENDPOINTS lists the ready
addresses with their ports as kubectl does, NOT READY the others.

-o wide lists every address, and who manages the object (endpoint-controller for a
Service's, masterlease for default/kubernetes).`,
		Example: `  allocd get endpoints
  allocd get endpoints -n shop
  allocd get endpoints -A -o wide
  allocd get endpoints shop/web -o yaml
  allocd get endpoints default/kubernetes`,
		Args: args(0, 1, "at most one NS/NAME"),
	})
}

func newWatchEndpoints(o *options) *cobra.Command {
	return watchCommand(o, endpointsKind, &cobra.Command{
		Use:     "endpoints [-n NS | -A]",
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
	})
}
