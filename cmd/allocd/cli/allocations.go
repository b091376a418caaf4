package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// ownerRef is an owner as operators name it: NS/NAME (the UID is allocd's key, looked
// up when not given).
type ownerRef struct{ namespace, name string }

func parseOwner(s string) (ownerRef, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return ownerRef{}, fmt.Errorf("--owner %q: want NAMESPACE/NAME, like default/web", s)
	}
	return ownerRef{ns, name}, nil
}

func (r ownerRef) String() string { return r.namespace + "/" + r.name }

// is reports whether o is this owner.
func (r ownerRef) is(o *allocdv1.Owner) bool {
	return o.GetNamespace() == r.namespace && o.GetName() == r.name
}

// items are the addresses and ports named on a command line: a number is a NodePort,
// anything else a ClusterIP (allocd says what is wrong with a bad one).
type items struct {
	ips   []string
	ports []int32
}

func parseItems(args []string) items {
	var it items
	for _, a := range args {
		it.add(a)
	}
	return it
}

// add adds the item a.
func (it *items) add(a string) {
	if p, err := strconv.ParseInt(a, 10, 32); err == nil {
		it.ports = append(it.ports, int32(p))
	} else {
		it.ips = append(it.ips, a)
	}
}

func (it items) empty() bool { return len(it.ips) == 0 && len(it.ports) == 0 }

// getRequest asks for the allocation of the item a.
func getRequest(a string) *allocdv1.GetAllocationRequest {
	if p, err := strconv.ParseInt(a, 10, 32); err == nil {
		return &allocdv1.GetAllocationRequest{
			Target: &allocdv1.GetAllocationRequest_NodePort{NodePort: int32(p)}}
	}
	return &allocdv1.GetAllocationRequest{Target: &allocdv1.GetAllocationRequest_ClusterIp{ClusterIp: a}}
}

// itemOf is the address or port of an allocation (or of a repair finding, a leak
// candidate).
func itemOf(a interface {
	GetClusterIp() string
	GetNodePort() int32
}) string {
	if a.GetClusterIp() != "" {
		return a.GetClusterIp()
	}
	return strconv.Itoa(int(a.GetNodePort()))
}

// itemList is ips then ports, as items.
func itemList(ips []string, ports []int32) []string {
	list := slices.Clone(ips)
	for _, p := range ports {
		list = append(list, strconv.Itoa(int(p)))
	}
	return list
}

// ownerName is "namespace/name" of o ("<none>" for an owner known by its UID only).
func ownerName(o *allocdv1.Owner) string {
	if o.GetNamespace() == "" && o.GetName() == "" {
		return "<none>"
	}
	return o.GetNamespace() + "/" + o.GetName()
}

func band(static bool) string {
	if static {
		return "static"
	}
	return "dynamic"
}

func newGetAllocations(o *options) *cobra.Command {
	var owner, uid, prefix, rng string
	var chunk int32
	cmd := &cobra.Command{
		Use:     "allocations [--owner NS/NAME] [--range RANGE]",
		Aliases: []string{"allocation", "alloc"},
		Short:   "List allocations, of one owner or one range",
		Long: `List allocations (ListAllocations), a page of --chunk-size at a time, each page printed as
it arrives: a listing of a million addresses does not wait for the last page, nor is it
held in memory. --range keeps one range (a CIDR as allocd get ranges names it, or the
node port range, like 30000-32767); --uid one owner, by its UID (allocd filters);
--owner-uid-prefix the owners whose UID starts with it, owner by owner (allocd filters:
admission/ lists what allocd-bridge's admission webhook allocated and has not bound to a
Service yet); --owner one owner by namespace and name (this command filters: every page
is read).

-o wide adds when each was allocated and its etcd revisions; -o json prints the
allocations as one ListAllocationsResponse (without the page token). A page that fails
after others were printed ends the document with the page token of the page that
failed (nextPageToken), the error on stderr and exit 1: the output stays valid.`,
		Example: `  allocd get allocations
  allocd get allocations --owner default/web
  allocd get allocations --range 10.0.0.0/24 -o wide
  allocd get allocations --owner-uid-prefix admission/
  allocd get allocations --range 30000-32767 -o json | jq -r '.allocations[].nodePort'`,
		Args: args(0, 0, "no argument (--owner and --range filter)"),
		RunE: runE(o, func(ctx context.Context, s *session, _ []string) error {
			var ref *ownerRef
			if owner != "" {
				r, err := parseOwner(owner)
				if err != nil {
					return usage(s.cmd, err)
				}
				ref = &r
			}
			if uid != "" && prefix != "" {
				return usage(s.cmd, errors.New("--uid and --owner-uid-prefix: give one of the two"))
			}
			req := &allocdv1.ListAllocationsRequest{Range: rng, OwnerUid: uid, OwnerUidPrefix: prefix,
				PageSize: chunk}
			return listAllocations(ctx, s, req, ref)
		}),
	}
	cmd.Flags().StringVar(&owner, "owner", "", "only the allocations of this owner, NAMESPACE/NAME")
	cmd.Flags().StringVar(&uid, "uid", "", "only the allocations of the owner of this UID")
	cmd.Flags().StringVar(&prefix, "owner-uid-prefix", "",
		"only the allocations of the owners whose UID starts with this, like admission/")
	cmd.Flags().StringVar(&rng, "range", "",
		"only the allocations of this range: a CIDR, or the node port range FIRST-LAST")
	cmd.Flags().Int32Var(&chunk, "chunk-size", 500, "allocations per page (allocd caps it at 5000)")
	return cmd
}

// listAllocations prints every allocation req lists (of ref only, when set), a page at
// a time.
func listAllocations(ctx context.Context, s *session, req *allocdv1.ListAllocationsRequest,
	ref *ownerRef) error {
	now := time.Now()
	l := &list{w: s.out, format: s.o.output, field: "allocations",
		header: []string{"ITEM", "RANGE", "OWNER", "UID", "BAND", "AGE"},
		row: func(m proto.Message, wide bool) []string {
			a := m.(*allocdv1.Allocation)
			cells := []string{itemOf(a), a.GetRange(), ownerName(a.GetOwner()), a.GetOwner().GetUid(),
				band(a.GetStaticBand())}
			if wide {
				cells = append(cells, fmt.Sprint(a.GetCreateRevision()), fmt.Sprint(a.GetModRevision()),
					rfc3339(a.GetAllocateTime()))
			}
			return append(cells, age(a.GetAllocateTime(), now))
		}}
	if s.o.output == outWide {
		l.header = []string{"ITEM", "RANGE", "OWNER", "UID", "BAND", "CREATE REVISION", "MOD REVISION",
			"ALLOCATED", "AGE"}
	}
	var rev int64
	err := pages(ctx, s, "get allocations", &req.PageToken,
		func(ctx context.Context) (*allocdv1.ListAllocationsResponse, error) {
			return s.c.ListAllocations(ctx, req)
		}, func(page *allocdv1.ListAllocationsResponse) error {
			rev = page.GetRevision()
			for _, a := range page.GetAllocations() {
				if ref == nil || ref.is(a.GetOwner()) {
					if err := l.add(a, rev); err != nil {
						return err
					}
				}
			}
			return l.page()
		})
	if err != nil {
		return l.cut(req.GetPageToken(), err)
	}
	return l.end(s.err, rev)
}

func newDescribeAllocation(o *options) *cobra.Command {
	return &cobra.Command{
		Use:     "allocation IP|PORT",
		Aliases: []string{"allocations", "alloc"},
		Short:   "Show who holds a ClusterIP or NodePort, since when, at which revision",
		Long: `Show one allocation (GetAllocation): its range and band, the owner holding it (namespace,
name and UID: the UID is what Release checks), when it was allocated, and the etcd
revisions that created it and last wrote it; then everything else that owner holds.
A number is a NodePort, anything else a ClusterIP. A free address is NOT_FOUND.`,
		Example: `  allocd describe allocation 10.0.0.10
  allocd describe allocation 30010
  allocd describe allocation fd00:10::8:db07 -o yaml`,
		Args: args(1, 1, "one IP or port"),
		RunE: runE(o, func(ctx context.Context, s *session, args []string) error {
			a, err := call(ctx, o, func(ctx context.Context) (*allocdv1.Allocation, error) {
				return s.c.GetAllocation(ctx, getRequest(args[0]))
			})
			if err != nil {
				return s.fail("describe allocation "+args[0], false, err)
			}
			if o.structured() {
				return printObject(s.out, o.output, a)
			}
			// One more than is shown, to know whether there are more: allocd answers an
			// owner's listing in one page, whatever page_size says.
			held, err := call(ctx, o, func(ctx context.Context) (*allocdv1.ListAllocationsResponse, error) {
				return s.c.ListAllocations(ctx, &allocdv1.ListAllocationsRequest{
					OwnerUid: a.GetOwner().GetUid(), PageSize: maxHeldShown + 1})
			})
			return describeAllocation(s, a, held, err)
		}),
	}
}

// maxHeldShown bounds the owner's allocations describe lists.
const maxHeldShown = 16

// describeAllocation writes a, and what its holder holds (held, or why that is not
// known: heldErr).
func describeAllocation(s *session, a *allocdv1.Allocation, held *allocdv1.ListAllocationsResponse,
	heldErr error) error {
	kind := "ClusterIP"
	if a.GetClusterIp() == "" {
		kind = "NodePort"
	}
	var all []string
	for _, h := range held.GetAllocations() {
		all = append(all, itemOf(h))
	}
	if len(all) > maxHeldShown || held.GetNextPageToken() != "" {
		all = all[:min(len(all), maxHeldShown)]
		all = append(all, "and more: allocd get allocations --uid "+a.GetOwner().GetUid())
	}
	if heldErr != nil {
		all = []string{"<unknown: " + codeWords(status.Code(heldErr)) + ">"}
	}
	tw := newTable(s.out)
	for _, f := range [][2]string{
		{"Item:", itemOf(a)},
		{"Kind:", kind},
		{"Range:", a.GetRange()},
		{"Band:", band(a.GetStaticBand())},
		{"Holder:", ownerName(a.GetOwner())},
		{"Holder UID:", a.GetOwner().GetUid()},
		{"Holder has:", strings.Join(all, ", ")},
		{"Allocated:", timestamp(a.GetAllocateTime(), time.Now())},
		{"Create Revision:", fmt.Sprint(a.GetCreateRevision())},
		{"Mod Revision:", fmt.Sprint(a.GetModRevision())},
	} {
		row(tw, f[0], f[1])
	}
	return tw.Flush()
}
