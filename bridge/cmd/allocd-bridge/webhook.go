package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/client-go/informers"

	"github.com/allocd/allocd/bridge/admit"
	"github.com/allocd/allocd/tlsfiles"
)

// webhookOptions are the webhook subcommand's flags.
type webhookOptions struct {
	address          string
	certFile         string
	keyFile          string
	healthAddress    string
	maxAdmissionTime time.Duration
	serviceCIDRs     string
}

func newWebhookCommand(o *options) *cobra.Command {
	w := &webhookOptions{address: ":8443", healthAddress: "127.0.0.1:10261",
		maxAdmissionTime: admit.DefaultMaxTime}
	cmd := &cobra.Command{
		Use:   "webhook",
		Short: "Serve the admission webhook that makes allocd allocate ClusterIPs and NodePorts",
		Long: `webhook serves kube-apiserver's mutating admission of Services over HTTPS (POST /mutate):
on create and update it allocates in allocd what kube-apiserver would allocate, by its
rules, and writes allocd's answer into the Service, so that kube-apiserver stores
exactly allocd's ClusterIPs and NodePorts. Run two replicas or more behind a Service
(they keep no state) with the bridge (which binds what the webhook allocated to the
stored Service, or frees it), and register deploy/kube/allocd-webhook.yaml's
MutatingWebhookConfiguration. When allocd is unreachable it answers HTTP 500 with a
message naming allocd: the failurePolicy decides.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runWebhook(cmd.Context(), o, w)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&w.address, "webhook-address", w.address, "host:port serving the webhook over HTTPS")
	fs.StringVar(&w.certFile, "tls-cert-file", w.certFile,
		"PEM serving certificate (with its chain) of --webhook-address; read again when it changes")
	fs.StringVar(&w.keyFile, "tls-private-key-file", w.keyFile, "PEM private key of --tls-cert-file")
	fs.StringVar(&w.healthAddress, "health-address", w.healthAddress,
		"host:port serving /healthz, /readyz and /metrics over HTTP; empty: none (they are served on "+
			"--webhook-address too)")
	fs.StringVar(&w.serviceCIDRs, "service-cluster-ip-range", w.serviceCIDRs,
		"kube-apiserver's --service-cluster-ip-range (one CIDR, or two of both families, primary first): "+
			"the cluster's IP families as kube-apiserver defaults a Service's; empty: those of the "+
			"ServiceCIDR \"kubernetes\" (kube-apiservers with other flags, as during a single- to "+
			"dual-stack upgrade, need it set to the flag they all share)")
	fs.DurationVar(&w.maxAdmissionTime, "max-admission-time", w.maxAdmissionTime,
		"longest an admission may take when kube-apiserver names no timeout (it does: the webhook answers a "+
			"second before it)")
	return cmd
}

func runWebhook(ctx context.Context, o *options, wo *webhookOptions) error {
	if wo.certFile == "" || wo.keyFile == "" {
		return errors.New("--tls-cert-file and --tls-private-key-file are required: kube-apiserver calls " +
			"webhooks over HTTPS")
	}
	var families admit.Families
	if wo.serviceCIDRs != "" {
		var ok bool
		cidrs := strings.Split(wo.serviceCIDRs, ",")
		for i := range cidrs {
			cidrs[i] = strings.TrimSpace(cidrs[i])
		}
		if families, ok = admit.FamiliesOf(cidrs); !ok {
			return fmt.Errorf("--service-cluster-ip-range %q: want one CIDR, or two of both IP families",
				wo.serviceCIDRs)
		}
	}
	log := o.logger()
	kube, err := o.kubeClient("webhook")
	if err != nil {
		return err
	}
	c, err := o.allocdClient()
	if err != nil {
		return err
	}
	defer c.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	factory := informers.NewSharedInformerFactory(kube, 0)
	cluster, err := admit.NewCluster(kube, factory)
	if err != nil {
		return err
	}
	cluster.SetFamilies(families)
	wh, err := admit.New(log, c, cluster, reg)
	if err != nil {
		return err
	}
	wh.SetMaxTime(wo.maxAdmissionTime)
	certs, err := tlsfiles.NewServer(tlsfiles.Files{CertFile: wo.certFile, KeyFile: wo.keyFile})
	if err != nil {
		return err
	}
	defer certs.Close()
	factory.Start(ctx.Done())
	defer factory.Shutdown()

	g, gctx := errgroup.WithContext(ctx)
	health := healthMux(wh.Ready, reg)
	mux := http.NewServeMux()
	mux.Handle("/mutate", wh)
	mux.Handle("/", health)
	if err := serve(gctx, g, wo.address, mux, certs); err != nil {
		return err
	}
	if wo.healthAddress != "" {
		if err := serve(gctx, g, wo.healthAddress, health, nil); err != nil {
			return err
		}
	}
	g.Go(func() error {
		wh.WatchAllocd(gctx, func(ctx context.Context) error {
			st, err := c.Health(ctx)
			if err == nil && st != grpc_health_v1.HealthCheckResponse_SERVING {
				err = fmt.Errorf("health %s", st)
			}
			return err
		}, 5*time.Second)
		return nil
	})
	log.Info("allocd-bridge webhook started", "address", wo.address, "allocd", o.allocd)
	err = g.Wait()
	log.Info("allocd-bridge webhook stopped")
	return err
}

// healthMux serves /healthz (the process runs), /readyz (ready says why not) and
// /metrics of reg.
func healthMux(ready func() error, reg *prometheus.Registry) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}

// serve serves h on addr (over TLS with certs' current certificate when certs is set)
// in g until ctx ends, then shuts the server down, letting requests in flight finish
// for up to 5 s.
func serve(ctx context.Context, g *errgroup.Group, addr string, h http.Handler,
	certs *tlsfiles.Server) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	if certs != nil {
		srv.TLSConfig = certs.Config()
	}
	g.Go(func() error {
		var err error
		if certs != nil {
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	})
	g.Go(func() error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	})
	return nil
}
