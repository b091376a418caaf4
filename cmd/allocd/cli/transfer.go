package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

func newTransfer(o *options) *cobra.Command {
	var fromUID, toOwner, toUID string
	cmd := &cobra.Command{
		Use:   "transfer --from-uid UID --to-owner NS/NAME --to-uid UID [IP|PORT...]",
		Short: "Move ClusterIPs and NodePorts from one owner to another, in one transaction",
		Long: `Move addresses and ports from the owner of --from-uid to --to-owner (Transfer), in one
etcd transaction: none is free, nor held by two owners, on the way. Without IP or PORT,
everything --from-uid holds; an owner left holding nothing is released as by a full
release. What --to-uid holds already is left as it is, so the same command again moves
nothing. An IP or PORT that --from-uid does not hold (free, or another owner's) is
refused, and nothing moves.

allocd-bridge binds what its admission webhook allocated under a provisional owner (uid
admission/<request uid>) to the Service's UID this way: allocd get allocations
--owner-uid-prefix admission/ lists what is still provisional. With authorization on, a
policy grants Transfer apart from Release: it moves anyone's addresses to anyone.`,
		Example: `  allocd get allocations --owner-uid-prefix admission/
  allocd transfer --from-uid admission/0b9e --to-owner default/web --to-uid uid-web
  allocd transfer --from-uid uid-db-old --to-owner default/db --to-uid uid-db 10.0.0.10 30010`,
		Args: cobra.ArbitraryArgs,
		RunE: runE(o, func(ctx context.Context, s *session, args []string) error {
			ref, err := parseOwner(toOwner)
			if err != nil {
				return usage(s.cmd,
					fmt.Errorf("--to-owner %q: want NAMESPACE/NAME, like default/web", toOwner))
			}
			it := parseItems(args)
			req := &allocdv1.TransferRequest{From: &allocdv1.Owner{Uid: fromUID},
				To:         &allocdv1.Owner{Namespace: ref.namespace, Name: ref.name, Uid: toUID},
				ClusterIps: it.ips, NodePorts: it.ports}
			resp, err := callWrite(ctx, o, func(ctx context.Context) (*allocdv1.TransferResponse, error) {
				return s.c.Transfer(ctx, req)
			})
			if err != nil {
				return s.failNotOwner("transfer from uid "+fromUID, err,
					"nothing moved; allocd get allocations --uid "+fromUID+" lists what it holds")
			}
			if o.structured() {
				return printObject(s.out, o.output, resp)
			}
			fmt.Fprintln(s.out, transferredLine(req, resp))
			return nil
		}),
	}
	cmd.Flags().StringVar(&fromUID, "from-uid", "",
		"UID of the owner the addresses and ports leave (required)")
	cmd.Flags().StringVar(&toOwner, "to-owner", "", "owner they go to, NAMESPACE/NAME (required)")
	cmd.Flags().StringVar(&toUID, "to-uid", "", "UID of the owner they go to (required)")
	cmd.MarkFlagRequired("from-uid")
	cmd.MarkFlagRequired("to-owner")
	cmd.MarkFlagRequired("to-uid")
	cmd.PreRunE = requireFlags("from-uid", "to-owner", "to-uid")
	return cmd
}

// transferredLine says what a Transfer moved.
func transferredLine(req *allocdv1.TransferRequest, resp *allocdv1.TransferResponse) string {
	got := itemList(resp.GetTransferredClusterIps(), resp.GetTransferredNodePorts())
	to := fmt.Sprintf("%s (uid %s)", ownerName(req.GetTo()), req.GetTo().GetUid())
	from := "uid " + req.GetFrom().GetUid()
	switch {
	case len(got) > 0:
		return fmt.Sprintf("transferred %s from %s to %s at revision %d", strings.Join(got, ", "), from, to,
			resp.GetRevision())
	case len(req.GetClusterIps())+len(req.GetNodePorts()) == 0:
		return fmt.Sprintf("nothing transferred: %s holds nothing", from)
	}
	return fmt.Sprintf("nothing transferred: %s holds them already", to)
}
