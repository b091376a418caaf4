package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/rest"

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
	profiling        bool
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
	fs.BoolVar(&w.profiling, "profiling", w.profiling,
		"serve Go's profiles under /debug/pprof/ on --health-address (not on --webhook-address)")
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
	kube, err := o.kubeClient("webhook", uncompressed)
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
	mux := http.NewServeMux()
	mux.Handle("/mutate", wh)
	mux.Handle("/", healthMux(wh.Ready, reg, false))
	if err := serve(gctx, g, wo.address, mux, certs); err != nil {
		return err
	}
	if wo.healthAddress != "" {
		if err := serve(gctx, g, wo.healthAddress, healthMux(wh.Ready, reg, wo.profiling), nil); err != nil {
			return err
		}
	}
	g.Go(func() error {
		wh.WatchAllocd(gctx, admit.HealthProbe(c.Conn()), allocdCheckInterval)
		return nil
	})
	log.Info("allocd-bridge webhook started", "address", wo.address, "allocd", o.allocd)
	err = g.Wait()
	log.Info("allocd-bridge webhook stopped")
	return err
}

// uncompressed has the webhook's client ask for its responses without gzip. Its
// informers watch every Service and IPAddress, and kube-apiserver v1.37 gzips a watch
// begun as a watch list (client-go's informers, WatchListCompression) event by event:
// a gzip stream per small event, compressed by kube-apiserver and decompressed by each
// replica, for each Service created (3.8 % of kube-apiserver's CPU and about a tenth
// of the webhook's in the numbers' profiles), to save bytes between the webhook and
// the API server of its own cluster. A kubeconfig's disable-compression does the same
// for the bridge's clients.
func uncompressed(cfg *rest.Config) { cfg.DisableCompression = true }

// allocdCheckInterval is how often the webhook checks allocd's health while allocd
// answers: a failed check makes admissions be answered at once while allocd is down.
const allocdCheckInterval = time.Second

// healthMux serves /healthz (the process runs), /readyz (ready says why not), /metrics
// of reg, and with profiling Go's profiles under /debug/pprof/.
func healthMux(ready func() error, reg *prometheus.Registry, profiling bool) *http.ServeMux {
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
	if profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	}
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
