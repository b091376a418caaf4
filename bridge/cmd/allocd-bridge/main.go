// Command allocd-bridge connects allocd to a Kubernetes cluster: it feeds allocd the
// cluster's Services and Pods, writes the Endpoints allocd computes into the cluster,
// adopts the cluster's ClusterIPs and NodePorts into allocd (and binds or frees what
// the admission webhook allocated), keeps an API server's master lease (the lease
// subcommand), and serves the admission webhook that makes allocd allocate (the webhook
// subcommand). See bridge/README.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "allocd-bridge:", err)
		stop()
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	o := defaultOptions()
	root := &cobra.Command{
		Use:   "allocd-bridge",
		Short: "Run allocd's controllers for a Kubernetes cluster",
		Long: `allocd-bridge feeds allocd the cluster's Services and Pods (client-go informers),
writes the Endpoints that allocd computes into the cluster (run kube-controller-manager
with --controllers=*,-endpoint), and allocates in allocd every ClusterIP and NodePort the
cluster's Services hold, under the Service's UID.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return run(cmd.Context(), o)
		},
	}
	o.addConnectionFlags(root.PersistentFlags())
	o.addRunFlags(root.Flags())
	root.AddCommand(newImportCommand(o), newLeaseCommand(o), newWebhookCommand(o))
	return root
}
