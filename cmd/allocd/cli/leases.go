package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

func newGetLeases(o *options) *cobra.Command {
	return &cobra.Command{
		Use:     "leases",
		Aliases: []string{"lease", "masterleases"},
		Short:   "List the master leases of the live API servers",
		Long: `List the master leases (ListLeases): one per API server that renews its own, with the TTL
it asked for and the time left before it expires unless renewed. The Endpoints of
default/kubernetes follow from them (allocd get endpoints default/kubernetes).

-o wide adds the revision of the lease's last renewal and the etcd lease's id, in hex
as etcdctl lease list prints it.`,
		Example: `  allocd get leases
  allocd get leases -o json | jq -r '.leases[].ip'`,
		Args: args(0, 0, "no argument"),
		RunE: runE(o, func(ctx context.Context, s *session, _ []string) error {
			resp, err := call(ctx, o, s.c.ListLeases)
			if err != nil {
				return s.fail("get leases", false, err)
			}
			if o.structured() {
				return printObject(s.out, o.output, resp)
			}
			if len(resp.GetLeases()) == 0 {
				fmt.Fprintln(s.err, "No leases found.")
				return nil
			}
			tw := newTable(s.out)
			header := []string{"IP", "TTL"}
			if o.output == outWide {
				header = append(header, "REVISION", "LEASE ID")
			}
			row(tw, append(header, "EXPIRES IN")...)
			for _, l := range resp.GetLeases() {
				cells := []string{l.GetIp(), humanDuration(time.Duration(l.GetTtlSeconds()) * time.Second)}
				if o.output == outWide {
					// The lease in hexadecimal, as etcdctl lease list writes it.
					cells = append(cells, fmt.Sprint(l.GetRevision()), fmt.Sprintf("%016x", l.GetLeaseId()))
				}
				ttl := humanDuration(time.Duration(l.GetRemainingTtlSeconds()) * time.Second)
				row(tw, append(cells, ttl)...)
			}
			return tw.Flush()
		}),
	}
}

func newDeleteLease(o *options) *cobra.Command {
	return &cobra.Command{
		Use:     "lease IP",
		Aliases: []string{"leases", "masterlease"},
		Short:   "Remove the master lease of an API server that is gone",
		Long: `Remove the master lease of IP (RemoveLease), for an API server that is gone for good and
should not wait for its lease to expire. The Endpoints of default/kubernetes lose the
address at once, unless it was the last one: the guard keeps the last address until
another API server renews (an API server that shuts down cleanly removes its own lease
with shutdown set, which empties them). Removing an absent lease is not an error.`,
		Example: `  allocd delete lease 192.168.0.2`,
		Args:    args(1, 1, "the API server's IP"),
		ValidArgsFunction: completeFrom(o, func(ctx context.Context, s *session) ([]string, error) {
			resp, err := call(ctx, o, s.c.ListLeases)
			var ips []string
			for _, l := range resp.GetLeases() {
				ips = append(ips, l.GetIp())
			}
			return ips, err
		}),
		RunE: runE(o, func(ctx context.Context, s *session, args []string) error {
			resp, err := callWrite(ctx, o, func(ctx context.Context) (*allocdv1.RemoveLeaseResponse, error) {
				return s.c.RemoveLease(ctx, &allocdv1.RemoveLeaseRequest{Ip: args[0]})
			})
			if err != nil {
				return s.fail("delete lease "+args[0], true, err)
			}
			switch {
			case o.structured():
				return printObject(s.out, o.output, resp)
			case resp.GetRemoved():
				fmt.Fprintf(s.out, "lease %s deleted at revision %d\n", args[0], resp.GetRevision())
			default:
				fmt.Fprintf(s.out, "lease %s: there was none\n", args[0])
			}
			return nil
		}),
	}
}
