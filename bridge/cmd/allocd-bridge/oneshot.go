package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/allocd/allocd/bridge/adopt"
	"github.com/allocd/allocd/client"
)

func newImportCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "import",
		Short: "Allocate in allocd, once, every ClusterIP and NodePort the cluster's Services hold",
		Long: `import creates in allocd the cluster's ServiceCIDRs that allocd lacks, then allocates,
under each Service's UID, the ClusterIPs and NodePorts it holds, and prints what it did.
An address another owner holds in allocd is reported as a conflict and left to it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runImport(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
}

func runImport(ctx context.Context, o *options, out io.Writer) error {
	kube, err := o.kubeClient("import")
	if err != nil {
		return err
	}
	c, err := o.allocdClient()
	if err != nil {
		return err
	}
	defer c.Close()
	a := adopt.New(o.logger(), c)
	cidrs, err := kube.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list ServiceCIDRs: %w", err)
	}
	var n, adopted, held, conflicts, failed int
	synced, err := a.ServiceCIDRs(ctx, cidrs.Items)
	if err != nil {
		failed++ // reported; the Services are adopted all the same
		fmt.Fprintf(out, "FAILED ServiceCIDRs: %v\n", err)
	}
	fmt.Fprintf(out, "ServiceCIDRs: %d in the cluster, %d created in allocd %v, %d deleted in allocd %v\n",
		len(cidrs.Items), len(synced.Created), synced.Created, len(synced.Deleted), synced.Deleted)
	opts := metav1.ListOptions{Limit: 500}
	for {
		list, err := kube.CoreV1().Services("").List(ctx, opts)
		if err != nil {
			return fmt.Errorf("list Services: %w", err)
		}
		for i := range list.Items {
			s := &list.Items[i]
			res, err := a.Service(ctx, s)
			n++
			if err != nil {
				failed++
				fmt.Fprintf(out, "FAILED %s/%s: %v\n", s.Namespace, s.Name, err)
				continue
			}
			adopted += len(res.Adopted)
			held += len(res.Held)
			conflicts += len(res.Conflicts)
			failed += len(res.Failed)
			for _, f := range res.Failed {
				fmt.Fprintf(out, "FAILED %s/%s %s: %v\n", s.Namespace, s.Name, f.Resource, f.Err)
			}
			if len(res.Adopted) > 0 {
				fmt.Fprintf(out, "adopted %s/%s %v\n", s.Namespace, s.Name, res.Adopted)
			}
			for _, c := range res.Conflicts {
				fmt.Fprintf(out, "CONFLICT %s/%s %s is held by %s in allocd\n", s.Namespace, s.Name, c.Resource, c.Holder)
			}
		}
		if list.Continue == "" {
			break
		}
		opts.Continue = list.Continue
	}
	fmt.Fprintf(out, "Services: %d; addresses and ports adopted: %d, already held: %d, conflicts: %d, "+
		"failed: %d\n",
		n, adopted, held, conflicts, failed)
	if conflicts+failed > 0 {
		return fmt.Errorf("%d conflicts, %d failures", conflicts, failed)
	}
	return nil
}

func newLeaseCommand(o *options) *cobra.Command {
	var ip string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "lease",
		Short: "Keep an API server's master lease in allocd (a sidecar of kube-apiserver)",
		Long: `lease renews the master lease of --advertise-address in allocd every TTL/3, as
kube-apiserver's lease endpoint reconciler does, and removes it on SIGTERM, so that
allocd's Endpoints of default/kubernetes list every live API server. Run it beside each
kube-apiserver started with --endpoint-reconciler-type=none.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := netip.ParseAddr(ip); err != nil {
				return fmt.Errorf("--advertise-address %q: %w", ip, err)
			}
			c, err := o.allocdClient()
			if err != nil {
				return err
			}
			defer c.Close()
			log := o.logger()
			k := client.NewLeaseKeeper(c, ip, ttl,
				client.WithRenewErrors(func(err error) { log.Warn("lease renewal failed", "error", err) }))
			log.Info("keeping the master lease", "ip", ip, "ttl", ttl)
			return k.Run(cmd.Context())
		},
	}
	cmd.Flags().StringVar(&ip, "advertise-address", "", "the API server's --advertise-address")
	cmd.Flags().DurationVar(&ttl, "lease-ttl", 15*time.Second, "TTL of the lease (kube-apiserver's 15 s)")
	return cmd
}
