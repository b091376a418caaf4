package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/allocd/allocd/bridge/adopt"
	"github.com/allocd/allocd/bridge/feed"
	"github.com/allocd/allocd/bridge/write"
	"github.com/allocd/allocd/client"
)

// bridge is the running bridge's parts.
type bridge struct {
	log     *slog.Logger
	kube    kubernetes.Interface
	c       *client.Client
	reg     *prometheus.Registry
	factory informers.SharedInformerFactory
	src     *feed.Source
	writers []writer
	adopter *adopt.Controller
	ad      *adopt.Adopter
	sweeper *adopt.Sweeper
	cidrs   cache.SharedIndexInformer // the cluster's ServiceCIDRs (with adoption)
}

func run(ctx context.Context, o *options) error {
	b, err := newBridge(o)
	if err != nil {
		return err
	}
	defer b.c.Close()
	b.factory.Start(ctx.Done())
	defer b.factory.Shutdown()
	g, gctx := errgroup.WithContext(ctx)
	if o.healthAddress != "" {
		srv, err := b.health(o.healthAddress, o.profiling)
		if err != nil {
			return err
		}
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.WithoutCancel(gctx), 5*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		})
	}
	g.Go(func() error { return ignoreCanceled(b.src.Run(gctx)) })
	for _, w := range b.writers {
		g.Go(func() error { return w.Run(gctx) })
	}
	if b.adopter != nil {
		g.Go(func() error {
			if cache.WaitForCacheSync(gctx.Done(), b.cidrs.HasSynced) {
				b.adopter.SyncCIDRs(gctx, b.listCIDRs, 30*time.Second)
			}
			return nil
		})
		g.Go(func() error { return b.adopter.Run(gctx, b.factory.Core().V1().Services().Informer().HasSynced) })
		g.Go(func() error { return b.sweeper.Run(gctx, b.adopter.Ran) })
	}
	b.log.Info("allocd-bridge started", "allocd", o.allocd, "adopt", o.adopt,
		"manage_kubernetes_service", o.kubernetesSvc)
	err = g.Wait()
	b.log.Info("allocd-bridge stopped")
	return err
}

// writer is what the bridge runs of a write.Writer, of either kind.
type writer interface {
	Run(ctx context.Context) error
	Ready() bool
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func newBridge(o *options) (*bridge, error) {
	b := &bridge{log: o.logger(), reg: prometheus.NewRegistry()}
	var err error
	if b.kube, err = o.kubeClient("informers"); err != nil {
		return nil, err
	}
	if b.c, err = o.allocdClient(); err != nil {
		return nil, err
	}
	b.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	b.factory = informers.NewSharedInformerFactory(b.kube, o.resync)
	fopts := []feed.Option{feed.WithRegisterer(b.reg)}
	if o.adopt {
		b.ad = adopt.New(b.log, b.c)
		store := b.factory.Core().V1().Services().Informer().GetStore()
		b.adopter = adopt.NewController(b.ad, b.log, store, o.serviceSyncs)
		if err := b.adopter.Register(b.reg); err != nil {
			return nil, err
		}
		fopts = append(fopts, feed.WithServiceHandler(b.adopter.ServiceChanged))
		b.sweeper = adopt.NewSweeper(b.ad, b.kube, b.log, adopt.SweeperConfig{Grace: o.pendingGrace,
			Interval: o.pendingSweep})
		if err := b.watchCIDRs(); err != nil {
			return nil, err
		}
	}
	feedErrors := func(err error) { b.log.Info("feeding allocd failed; retrying", "error", err) }
	b.src, err = feed.New(b.log, b.kube, b.factory, b.c, []client.FeederOption{client.WithFeedErrors(feedErrors)}, fopts...)
	if err != nil {
		return nil, err
	}
	m := write.NewMetrics(b.reg)
	epsKube, err := o.kubeClient("endpoints")
	if err != nil {
		return nil, err
	}
	eps := write.NewEndpoints(b.c, epsKube, b.factory, m, o.kubernetesSvc)
	w := write.New(b.log, eps, o.endpointSyncs, m)
	if err := w.Register(); err != nil {
		return nil, err
	}
	b.writers = append(b.writers, w)
	if o.sliceSyncs > 0 {
		slicesKube, err := o.kubeClient("endpointslices")
		if err != nil {
			return nil, err
		}
		slices := write.NewEndpointSlices(b.c, slicesKube, b.factory, m, o.kubernetesSvc)
		ws := write.New(b.log, slices, o.sliceSyncs, m)
		if err := ws.Register(); err != nil {
			return nil, err
		}
		b.writers = append(b.writers, ws)
	}
	return b, nil
}

// listCIDRs lists the cluster's ServiceCIDRs, from the informer's store.
func (b *bridge) listCIDRs(context.Context) ([]networkingv1.ServiceCIDR, error) {
	var out []networkingv1.ServiceCIDR
	for _, obj := range b.cidrs.GetStore().List() {
		out = append(out, *obj.(*networkingv1.ServiceCIDR))
	}
	return out, nil
}

// watchCIDRs registers the informer of the cluster's ServiceCIDRs, its changes handed
// to the adoption controller.
func (b *bridge) watchCIDRs() error {
	b.cidrs = b.factory.Networking().V1().ServiceCIDRs().Informer()
	cidr := func(obj any) *networkingv1.ServiceCIDR {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		sc, _ := obj.(*networkingv1.ServiceCIDR)
		return sc
	}
	_, err := b.cidrs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { b.adopter.ServiceCIDRChanged(nil, cidr(obj)) },
		UpdateFunc: func(old, cur any) { b.adopter.ServiceCIDRChanged(cidr(old), cidr(cur)) },
		DeleteFunc: func(obj any) {
			if sc := cidr(obj); sc != nil {
				b.adopter.ServiceCIDRChanged(sc, nil)
			}
		},
	})
	return err
}

// health serves /healthz (the process runs), /readyz (informers synced, allocd's
// objects listed, the first sweep through and its deletions written, adoption run over
// every Service once), /metrics, and with profiling /debug/pprof/.
func (b *bridge) health(addr string, profiling bool) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		ready := b.src.HasSynced()
		for _, wr := range b.writers {
			ready = ready && wr.Ready()
		}
		ready = ready && (b.adopter == nil || b.adopter.Ran())
		if !ready {
			http.Error(w, "not ready: informers syncing, allocd not listed, leftovers not yet swept (allocd "+
				"behind the feed, or looking reset) or adoption not run yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("/metrics", promhttp.HandlerFor(b.reg, promhttp.HandlerOpts{}))
	if profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--health-address: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return srv, nil
}
