package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// Commands returns the operator commands, for the allocd root command: get, describe,
// create, delete, release, transfer, repair, watch and health. They share one set of client
// flags (--server, --timeout, -o, TLS); every call goes through package client.
func Commands() []*cobra.Command {
	o := &options{}
	get := group(o, "get",
		"Show ranges, allocations, master leases, ServiceCIDRs, Endpoints or EndpointSlices",
		newGetRanges(o), newGetAllocations(o), newGetLeases(o), newGetServiceCIDRs(o), newGetEndpoints(o),
		newGetEndpointSlices(o))
	get.Example = `  allocd get ranges
  allocd get allocations --owner default/web
  allocd get endpoints -n shop -o json | jq '.endpoints[].name'`
	describe := group(o, "describe", "Show one allocation in detail", newDescribeAllocation(o))
	create := group(o, "create", "Create a ServiceCIDR, or an allocation by hand", newCreateServiceCIDR(o),
		newCreateAllocation(o))
	del := group(o, "delete", "Delete a ServiceCIDR or a master lease", newDeleteServiceCIDR(o),
		newDeleteLease(o))
	repair := group(o, "repair", "Run a repair pass or show what repair found", newRepairRun(o),
		newRepairStatus(o))
	watch := group(o, "watch", "Follow the Endpoints or EndpointSlices as they change, one line per change",
		newWatchEndpoints(o), newWatchEndpointSlices(o))
	release, transfer := newRelease(o), newTransfer(o)
	for _, cmd := range []*cobra.Command{release, transfer} {
		o.register(cmd.PersistentFlags())
		completeOutput(cmd)
	}
	// health has its own options: its --timeout default is shorter.
	return []*cobra.Command{get, describe, create, del, release, transfer, repair, watch,
		newHealth(&options{})}
}

// group returns a command that only holds subcommands (kubectl's "get", "delete"),
// with the shared flags. Run with an unknown resource it says which exist.
func group(o *options, name, short string, subs ...*cobra.Command) *cobra.Command {
	cmd := &cobra.Command{
		Use:   name + " RESOURCE",
		Short: short,
		Long:  short + ".\n\nResources: " + resourceNames(subs) + ".",
		Args:  cobra.ArbitraryArgs,
		// SuggestionsFor's threshold: "rnages" suggests "ranges".
		SuggestionsMinimumDistance: 2,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usage(cmd,
					fmt.Errorf("%s needs a resource: %s", cmd.CommandPath(), resourceNames(subs)))
			}
			err := fmt.Errorf("unknown resource %q for %s (want %s)", args[0], cmd.CommandPath(),
				resourceNames(subs))
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				err = fmt.Errorf("unknown resource %q for %s; did you mean %q?", args[0], cmd.CommandPath(),
					s[0])
			}
			return usage(cmd, err)
		},
	}
	cmd.AddCommand(subs...)
	o.register(cmd.PersistentFlags())
	completeOutput(cmd)
	return cmd
}

// resourceNames lists the names of subs: "ranges, allocations".
func resourceNames(subs []*cobra.Command) string {
	names := make([]string, len(subs))
	for i, s := range subs {
		names[i] = s.Name()
	}
	return strings.Join(names, ", ")
}

// completeOutput completes -o with the formats.
func completeOutput(cmd *cobra.Command) {
	cmd.RegisterFlagCompletionFunc("output",
		cobra.FixedCompletions(outputs, cobra.ShellCompDirectiveNoFileComp))
}

// PrintCommands writes the commands of root, one a line, after the serving flags of
// `allocd --help`.
func PrintCommands(w io.Writer, root *cobra.Command) {
	fmt.Fprintf(w, "\nCommands (allocd COMMAND --help for each; they call the allocd at "+
		"--server, default %s):\n", defaultServer)
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() || c.Name() == "help" {
			fmt.Fprintf(w, "  %-12s %s\n", c.Name(), c.Short)
		}
	}
}
