package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// familyPolicies are the --ip-family-policy values, spelled as in a Kubernetes Service.
var familyPolicies = map[string]allocdv1.IPFamilyPolicy{
	"SingleStack":      allocdv1.IPFamilyPolicy_IP_FAMILY_POLICY_SINGLE_STACK,
	"PreferDualStack":  allocdv1.IPFamilyPolicy_IP_FAMILY_POLICY_PREFER_DUAL_STACK,
	"RequireDualStack": allocdv1.IPFamilyPolicy_IP_FAMILY_POLICY_REQUIRE_DUAL_STACK,
}

func newCreateAllocation(o *options) *cobra.Command {
	var owner, uid, policy string
	var nodePorts int32
	var noClusterIP, dryRun bool
	cmd := &cobra.Command{
		Use:     "allocation --owner NS/NAME --uid UID [IP|PORT...]",
		Aliases: []string{"alloc"},
		Short:   "Allocate ClusterIPs and NodePorts for an owner by hand, as a shim would",
		Long: `Allocate (Allocate) for one owner, all or nothing: the IPs and PORTs named, or else one
dynamic ClusterIP (two with --ip-family-policy RequireDualStack or PreferDualStack on a
dual-stack allocd; none with --no-cluster-ip), and --node-ports dynamic NodePorts.

API-server shims allocate for Services; this is for an operator who must hold an address
for something that is not a Service yet. The same command again (same owner UID, same
request) answers what it allocated the first time, marked replayed. --dry-run checks
without writing.`,
		Example: `  allocd create allocation --owner default/db --uid uid-db 10.0.0.10 30010
  allocd create allocation --owner default/web --uid uid-web \
      --ip-family-policy RequireDualStack --node-ports 1`,
		Args: cobra.ArbitraryArgs,
		RunE: runE(o, func(ctx context.Context, s *session, args []string) error {
			ref, err := parseOwner(owner)
			if err != nil {
				return usage(s.cmd, err)
			}
			pol, ok := familyPolicies[policy]
			if !ok && policy != "" {
				return usage(s.cmd, fmt.Errorf(
					"--ip-family-policy %q: want SingleStack, PreferDualStack or RequireDualStack", policy))
			}
			it := parseItems(args)
			req := &allocdv1.AllocateRequest{Owner: &allocdv1.Owner{Namespace: ref.namespace, Name: ref.name,
				Uid: uid},
				IpFamilyPolicy: pol, ClusterIps: it.ips, NodePorts: it.ports, NodePortCount: nodePorts,
				NoClusterIp: noClusterIP, DryRun: dryRun}
			resp, err := callWrite(ctx, o,
				func(ctx context.Context) (*allocdv1.AllocateResponse, error) {
					return s.c.Allocate(ctx, req)
				})
			if err != nil {
				return s.fail("create allocation for "+ref.String(), true, err)
			}
			if o.structured() {
				return printObject(s.out, o.output, resp)
			}
			fmt.Fprintln(s.out, allocatedLine(req, resp))
			return nil
		}),
	}
	cmd.Flags().StringVar(&owner, "owner", "", "owner, NAMESPACE/NAME (required)")
	cmd.Flags().StringVar(&uid, "uid", "", "owner's UID, the key of ownership and of retries (required)")
	cmd.Flags().StringVar(&policy, "ip-family-policy", "",
		"SingleStack (default), PreferDualStack or RequireDualStack, for a dynamic ClusterIP")
	cmd.Flags().Int32Var(&nodePorts, "node-ports", 0, "dynamic NodePorts to allocate besides the PORTs named")
	cmd.Flags().BoolVar(&noClusterIP, "no-cluster-ip", false, "allocate no ClusterIP (NodePorts only)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "check without allocating")
	cmd.MarkFlagRequired("owner")
	cmd.MarkFlagRequired("uid")
	cmd.PreRunE = requireFlags("owner", "uid")
	cmd.RegisterFlagCompletionFunc("ip-family-policy", cobra.FixedCompletions(
		[]string{"SingleStack", "PreferDualStack", "RequireDualStack"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// allocatedLine says what an Allocate gave.
func allocatedLine(req *allocdv1.AllocateRequest, resp *allocdv1.AllocateResponse) string {
	got := itemList(resp.GetClusterIps(), resp.GetNodePorts())
	who := fmt.Sprintf("%s (uid %s)", ownerName(req.GetOwner()), req.GetOwner().GetUid())
	switch {
	case req.GetDryRun():
		return fmt.Sprintf("dry run: %s could be allocated %s; nothing was written", who,
			orNone(strings.Join(got, ", ")))
	case resp.GetReplayed():
		return fmt.Sprintf("allocated %s to %s at revision %d (replayed: allocd answered this "+
			"same request before)", strings.Join(got, ", "), who, resp.GetRevision())
	}
	return fmt.Sprintf("allocated %s to %s at revision %d", strings.Join(got, ", "), who, resp.GetRevision())
}
