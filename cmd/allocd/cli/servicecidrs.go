package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/allocd/allocd/client"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// completeCIDRNames completes a ServiceCIDR name from allocd's.
func completeCIDRNames(o *options) cobra.CompletionFunc {
	return completeFrom(o, func(ctx context.Context, s *session) ([]string, error) {
		cs, err := call(ctx, o, s.c.ListServiceCIDRs)
		var names []string
		for _, c := range cs {
			names = append(names, c.GetName())
		}
		return names, err
	})
}

func newGetServiceCIDRs(o *options) *cobra.Command {
	return &cobra.Command{
		Use:     "servicecidrs [NAME]",
		Aliases: []string{"servicecidr"},
		Short:   "List the ServiceCIDRs that ClusterIPs are allocated from",
		Long: `List the ServiceCIDRs (ListServiceCIDRs), or one by NAME (GetServiceCIDR): their CIDRs,
whether they are ready or terminating, and for a terminating one how many allocated
addresses lie in it alone and block its removal (with NAME: a sample of them and their
holders).

-o wide adds when each was created and deleted, and the revision of its last change.`,
		Example: `  allocd get servicecidrs
  allocd get servicecidr kubernetes
  allocd get servicecidrs -o yaml`,
		Args:              args(0, 1, "at most one NAME"),
		ValidArgsFunction: completeCIDRNames(o),
		RunE: runE(o, func(ctx context.Context, s *session, args []string) error {
			var cs []*allocdv1.ServiceCIDR
			var err error
			if len(args) == 1 {
				var c *allocdv1.ServiceCIDR
				c, err = call(ctx, o,
					func(ctx context.Context) (*allocdv1.ServiceCIDR, error) {
						return s.c.GetServiceCIDR(ctx, args[0])
					})
				cs = []*allocdv1.ServiceCIDR{c}
			} else {
				cs, err = call(ctx, o, s.c.ListServiceCIDRs)
			}
			switch {
			case err != nil:
				return s.fail("get servicecidrs", false, err)
			case o.structured() && len(args) == 1:
				return printObject(s.out, o.output, cs[0])
			case o.structured():
				return printObject(s.out, o.output, &allocdv1.ListServiceCIDRsResponse{ServiceCidrs: cs})
			}
			if err := printServiceCIDRs(s.out, cs, o.output == outWide); err != nil {
				return err
			}
			if len(args) == 1 && len(cs[0].GetBlockingSample()) > 0 {
				return printBlockers(s.out, cs[0])
			}
			return nil
		}),
	}
}

func printServiceCIDRs(w io.Writer, cs []*allocdv1.ServiceCIDR, wide bool) error {
	now := time.Now()
	tw := newTable(w)
	header := []string{"NAME", "CIDRS", "STATE", "BLOCKING"}
	if wide {
		header = append(header, "REVISION", "CREATED", "DELETED")
	}
	row(tw, append(header, "AGE")...)
	for _, c := range cs {
		blocking := "-"
		if c.GetState() == allocdv1.ServiceCIDRState_SERVICE_CIDR_STATE_TERMINATING {
			blocking = fmt.Sprint(c.GetBlockingAllocations())
		}
		cells := []string{c.GetName(), strings.Join(c.GetCidrs(), ","), stateName(c.GetState()), blocking}
		if wide {
			cells = append(cells, fmt.Sprint(c.GetRevision()), rfc3339(c.GetCreateTime()),
				rfc3339(c.GetDeleteTime()))
		}
		row(tw, append(cells, age(c.GetCreateTime(), now))...)
	}
	return tw.Flush()
}

// printBlockers lists the sample of allocations that block a terminating ServiceCIDR.
func printBlockers(w io.Writer, c *allocdv1.ServiceCIDR) error {
	fmt.Fprintf(w, "\n%d allocations lie only in %s and block its removal; %d of them:\n",
		c.GetBlockingAllocations(), c.GetName(), len(c.GetBlockingSample()))
	tw := newTable(w)
	row(tw, "  ITEM", "RANGE", "OWNER", "UID")
	for _, a := range c.GetBlockingSample() {
		row(tw, "  "+itemOf(a), a.GetRange(), ownerName(a.GetOwner()), a.GetOwner().GetUid())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "Release them (allocd release --owner NS/NAME IP) and it is removed within a second.")
	return nil
}

func newCreateServiceCIDR(o *options) *cobra.Command {
	return &cobra.Command{
		Use:     "servicecidr NAME CIDR [CIDR]",
		Aliases: []string{"servicecidrs"},
		Short:   "Add a ServiceCIDR: a range that ClusterIPs are allocated from",
		Long: `Add a ServiceCIDR (CreateServiceCIDR): one or two CIDRs, at most one per IP family, of 8
to 2^24 addresses, with no host bits set. Every replica allocates from it as soon as its
watch sees it, after the ready ServiceCIDRs created before it are full. A CIDR may
overlap another ServiceCIDR's (that is how a range is widened): an address in both is
one allocation. NAME is a DNS subdomain.`,
		Example: `  allocd create servicecidr extra 10.96.1.0/24
  allocd create servicecidr wide 10.0.0.0/16 fd00:10::/108`,
		Args: args(2, 3, "NAME and one or two CIDRs"),
		RunE: runE(o, func(ctx context.Context, s *session, args []string) error {
			c, err := callWrite(ctx, o, func(ctx context.Context) (*allocdv1.ServiceCIDR, error) {
				return s.c.CreateServiceCIDR(ctx, args[0], args[1:]...)
			})
			if err != nil {
				return s.fail("create servicecidr "+args[0], true, err)
			}
			if o.structured() {
				return printObject(s.out, o.output, c)
			}
			fmt.Fprintf(s.out, "servicecidr %s created: %s\n", c.GetName(), strings.Join(c.GetCidrs(), ", "))
			return nil
		}),
	}
}

func newDeleteServiceCIDR(o *options) *cobra.Command {
	return &cobra.Command{
		Use:     "servicecidr NAME",
		Aliases: []string{"servicecidrs"},
		Short:   "Drain a ServiceCIDR: nothing new comes from it, and it goes once nothing lies in it alone",
		Long: `Delete a ServiceCIDR (DeleteServiceCIDR): from the moment this returns no replica
allocates an address from it that no ready ServiceCIDR holds. It stays, terminating,
while allocated addresses lie in it alone (the kubernetes Service's address too); this
command lists them (GetServiceCIDR's blockers), and it is removed within a second of
the last one's release. Deleting a terminating ServiceCIDR again is not an error.`,
		Example: `  allocd delete servicecidr old
  allocd get servicecidr old     # what still blocks it`,
		Args:              args(1, 1, "the ServiceCIDR's NAME"),
		ValidArgsFunction: completeCIDRNames(o),
		RunE: runE(o, func(ctx context.Context, s *session, args []string) error {
			deleted, err := callWrite(ctx, o, func(ctx context.Context) (*allocdv1.ServiceCIDR, error) {
				return s.c.DeleteServiceCIDR(ctx, args[0])
			})
			if err != nil {
				return s.fail("delete servicecidr "+args[0], true, err)
			}
			c, err := call(ctx, o,
				func(ctx context.Context) (*allocdv1.ServiceCIDR, error) {
					return s.c.GetServiceCIDR(ctx, args[0])
				})
			gone := errors.Is(err, client.ErrNotFound)
			switch {
			case err != nil && !gone:
				return s.fail("delete servicecidr "+args[0]+": read it back", false, err)
			case o.structured() && gone:
				return printObject(s.out, o.output, deleted)
			case o.structured():
				return printObject(s.out, o.output, c)
			case gone:
				fmt.Fprintf(s.out, "servicecidr %s deleted\n", args[0])
				return nil
			case c.GetBlockingAllocations() == 0:
				fmt.Fprintf(s.out, "servicecidr %s terminating: nothing new is allocated from it, nothing "+
					"blocks its removal (within a second)\n", args[0])
				return nil
			}
			fmt.Fprintf(s.out, "servicecidr %s terminating: nothing new is allocated from it\n", args[0])
			return printBlockers(s.out, c)
		}),
	}
}
