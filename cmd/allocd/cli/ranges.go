package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

func newGetRanges(o *options) *cobra.Command {
	return &cobra.Command{
		Use:     "ranges",
		Aliases: []string{"range"},
		Short:   "List every range with its size, use, bands and a usage bar",
		Long: `List every range (ListRanges): the ClusterIP ranges of the ServiceCIDRs, ready ones in
allocation order then terminating ones, and the NodePort range; each with its size, how
many addresses or ports are used and free, the static (lower) and dynamic (upper) bands
as USED/SIZE, and a bar of how full it is. Dynamic allocation fills a range's dynamic
band first, then the next ready range of the family.

-o wide adds whether the range is the primary one (the kubernetes Service's address
comes from it), the bands' bounds and the ServiceCIDRs that list each range.`,
		Example: `  allocd get ranges
  allocd get ranges -o wide
  allocd get ranges -o json | jq -r '.ranges[] | "\(.name) \(.used // "0")/\(.size)"'`,
		Args: args(0, 0, "no argument"),
		RunE: runE(o, func(ctx context.Context, s *session, _ []string) error {
			ranges, err := call(ctx, o, s.c.ListRanges)
			if err != nil {
				return s.fail("get ranges", false, err)
			}
			if o.structured() {
				return printObject(s.out, o.output, &allocdv1.ListRangesResponse{Ranges: ranges})
			}
			return printRanges(s, ranges)
		}),
	}
}

func printRanges(s *session, ranges []*allocdv1.Range) error {
	tw := newTable(s.out)
	header := []string{"NAME", "KIND", "FAMILY", "STATE", "SIZE", "USED", "FREE", "STATIC", "DYNAMIC"}
	if s.o.output == outWide {
		header = append(header, "PRIMARY", "STATIC BAND", "DYNAMIC BAND", "SERVICECIDRS")
	}
	row(tw, append(header, "USAGE")...)
	for _, r := range ranges {
		kind, family, state := "NodePort", "-", "-"
		if r.GetKind() == allocdv1.RangeKind_RANGE_KIND_CLUSTER_IP {
			kind, family, state = "ClusterIP", familyName(r.GetFamily()), stateName(r.GetState())
		}
		cells := []string{r.GetName(), kind, family, state, fmt.Sprint(r.GetSize()), fmt.Sprint(r.GetUsed()),
			fmt.Sprint(r.GetFree()),
			bandUse(r.GetStaticBand()), bandUse(r.GetDynamicBand())}
		if s.o.output == outWide {
			cells = append(cells, fmt.Sprint(r.GetPrimary()), bandBounds(r.GetStaticBand()),
				bandBounds(r.GetDynamicBand()), orNone(strings.Join(r.GetServiceCidrs(), ",")))
		}
		row(tw, append(cells, bar(r.GetUsed(), r.GetSize()))...)
	}
	return tw.Flush()
}

// bandUse is a band's USED/SIZE.
func bandUse(b *allocdv1.Band) string { return fmt.Sprintf("%d/%d", b.GetUsed(), b.GetSize()) }

// bandBounds is a band's FIRST-LAST.
func bandBounds(b *allocdv1.Band) string {
	if b.GetSize() == 0 {
		return "<none>"
	}
	return b.GetFirst() + "-" + b.GetLast()
}

// familyName spells an IP family as Kubernetes does.
func familyName(f allocdv1.IPFamily) string {
	switch f {
	case allocdv1.IPFamily_IP_FAMILY_IPV4:
		return "IPv4"
	case allocdv1.IPFamily_IP_FAMILY_IPV6:
		return "IPv6"
	}
	return "-"
}

// stateName spells a ServiceCIDR state: Ready, Terminating.
func stateName(s allocdv1.ServiceCIDRState) string {
	switch s {
	case allocdv1.ServiceCIDRState_SERVICE_CIDR_STATE_READY:
		return "Ready"
	case allocdv1.ServiceCIDRState_SERVICE_CIDR_STATE_TERMINATING:
		return "Terminating"
	}
	return "-"
}
