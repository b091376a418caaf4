package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"

	"github.com/allocd/allocd/allocator"
	"github.com/allocd/allocd/endpoints"
	"github.com/allocd/allocd/endpoints/kube"
	"github.com/allocd/allocd/leader"
	"github.com/allocd/allocd/masterlease"
	"github.com/allocd/allocd/repair"
	"github.com/allocd/allocd/server"
)

// startServices builds the allocator (on an in-process client of the embedded etcd,
// if any), the master leases and the repair loop on d.cli,
// loads their state, swaps them in for the gates, and runs their loops in d.group under
// runCtx. ctx bounds the start.
func (d *Daemon) startServices(ctx, runCtx context.Context) error {
	c := d.cfg
	alloc, acli, err := d.newAllocator(ctx)
	if err != nil {
		return err
	}
	running := false
	defer func() {
		if !running && acli != d.cli {
			acli.Close()
		}
	}()
	leases, err := masterlease.New(ctx, d.cli, masterlease.Config{
		Prefix:      c.EtcdPrefix + c.MasterLeasePrefix,
		DefaultTTL:  c.MasterLeaseTTL,
		ServicePort: c.KubernetesServicePort,
		Logger:      d.log, // masterlease and repair add their component
		Registerer:  d.registry,
	})
	if err != nil {
		return err
	}
	ec, err := d.newEndpoints()
	if err != nil {
		return err
	}
	// One election for every controller that runs on one replica at a time (repair,
	// the Endpoints controller), so that every feed has one place to go. Its key is
	// the one repair's election has always used, so that replicas of older versions
	// elect one leader with these during a rolling upgrade.
	el, err := leader.New(d.cli, leader.Config{
		Prefix:   c.EtcdPrefix + "/repair/leader",
		Identity: d.identity(),
		Logger:   d.log,
	})
	if err != nil {
		return err
	}
	rep, err := repair.New(d.cli, alloc, repair.Config{
		Prefix:            c.EtcdPrefix,
		Interval:          c.RepairInterval,
		LeakStrikes:       c.RepairLeakStrikes,
		LeakGrace:         c.RepairLeakGrace,
		SnapshotFile:      c.ServiceSnapshotFile,
		ParseSnapshotFile: server.ParseServiceSnapshotJSON,
		Leadership:        el,
		Logger:            d.log,
		Registerer:        d.registry,
	})
	if err != nil {
		return err
	}
	handoff, err := newMasterHandoff(leases, ec, d.log, d.registry)
	if err != nil {
		return err
	}
	// Calls that come before Run's watch starts wait for it (a call at start failed
	// with Unavailable, "allocator is not running").
	alloc.Starting()
	d.swapIn(alloc, leases, el, rep, ec)

	// The lease manager runs under its own context, cancelled first at shutdown: its
	// WatchEndpoints streams end with it, so that GracefulStop does not wait on them.
	leaseCtx, cancelLeases := context.WithCancel(runCtx)
	d.stopStreams = cancelLeases
	running = true
	d.group.Go(func() error {
		if acli != d.cli {
			defer acli.Close()
		}
		return alloc.Run(runCtx)
	})
	d.group.Go(func() error { return leases.Run(leaseCtx) })
	d.group.Go(func() error { return el.Run(runCtx, rep.Lead, ec.Lead) })
	d.group.Go(func() error { handoff.run(leaseCtx); return nil })
	return nil
}

// swapIn builds the gRPC services over the parts, secured as d.sec says (the
// credentials of calls forwarded to the leader; forced releases by ForceRelease alone
// when calls are authorized), and swaps them in for the gates.
func (d *Daemon) swapIn(alloc *allocator.Allocator, leases *masterlease.Manager, el *leader.Elector,
	rep *repair.Controller, ec *endpoints.Controller) {
	fw := server.NewForwarder(el, d.sec.peerCredentials(), d.log)
	d.closers = append(d.closers, fw.Close)
	repairSvc := server.NewRepairService(rep, fw, d.log)
	repairSvc.SetEndpoints(ec)
	endpointsSvc := server.NewEndpointsService(ec, rep, fw, d.log)
	d.gates.endpoints.EndpointsServiceServer = endpointsSvc
	allocSvc := server.NewAllocatorService(alloc, d.log)
	if d.sec.authorizing() {
		allocSvc.RequireForceRelease()
	}
	d.gates.alloc.AllocatorServiceServer = allocSvc
	d.gates.lease.LeaseServiceServer = server.NewLeaseService(leases, d.log)
	d.gates.repair.RepairServiceServer = repairSvc
}

// newEndpoints builds the Endpoints and EndpointSlice controllers.
func (d *Daemon) newEndpoints() (*endpoints.Controller, error) {
	c := d.cfg
	endpointOn, sliceOn, err := c.controllers()
	if err != nil {
		return nil, err
	}
	return endpoints.New(d.cli, endpoints.Config{
		Prefix:                c.EtcdPrefix,
		Workers:               c.ConcurrentEndpointSyncs,
		BatchPeriod:           c.EndpointUpdatesBatchPeriod,
		MasterResync:          c.EndpointReconcilerInterval,
		DisableEndpoints:      !endpointOn,
		DisableEndpointSlices: !sliceOn,
		SliceWorkers:          c.ConcurrentServiceEndpointSyncs,
		SliceBatchPeriod:      c.EndpointSliceUpdatesBatchPeriod,
		MaxEndpointsPerSlice:  c.MaxEndpointsPerSlice,
		MaxTxnOps:             c.EtcdMaxTxnOps,
		Logger:                d.log,
		Registerer:            d.registry,
	})
}

// newAllocator builds the allocator of the configured ranges. It talks to an embedded
// etcd through direct calls (v3client), not gRPC over loopback: about 15% less CPU per
// Allocate. The caller closes that client (the one returned, when it is not d.cli).
func (d *Daemon) newAllocator(ctx context.Context) (*allocator.Allocator, *clientv3.Client, error) {
	c := d.cfg
	ranges, err := c.clusterIPRanges()
	if err != nil {
		return nil, nil, err
	}
	ports, err := allocator.ParsePortRange(c.ServiceNodePortRange)
	if err != nil {
		return nil, nil, fmt.Errorf("--service-node-port-range: %w", err)
	}
	acli := d.cli
	if d.etcd != nil {
		acli = v3client.New(d.etcd.Server)
	}
	alloc, err := allocator.New(ctx, acli, allocator.Config{
		Prefix:             c.EtcdPrefix,
		ClusterIPRanges:    ranges,
		NodePortRange:      ports,
		KubernetesNodePort: c.KubernetesServiceNodePort,
		Logger:             d.log.With("component", "allocator"),
		Registerer:         d.registry,
		// Every replica may lead and run the repair passes: each keeps the holders,
		// so that the first pass of a term is as fast as the next.
		KeepHolders: true,
	})
	if err != nil {
		if acli != d.cli {
			acli.Close()
		}
		return nil, nil, err
	}
	return alloc, acli, nil
}

// identity is the address other replicas reach this one at, to forward repair calls
// and feeds to the leader: --advertise-address, else the gRPC listen address.
func (d *Daemon) identity() string {
	if d.cfg.AdvertiseAddress != "" {
		return d.cfg.AdvertiseAddress
	}
	identity := d.GRPCAddr()
	if ap, err := netip.ParseAddrPort(identity); err == nil && ap.Addr().IsUnspecified() {
		d.log.Warn("--grpc-address listens on every interface and --advertise-address is not set: "+
			"other replicas cannot reach this one to forward repair calls; set --advertise-address HOST:PORT",
			"grpc_address", identity)
	}
	return identity
}

// handoffPatience is how long the master leases' endpoints may be out of the Endpoints
// controller's reach before it is logged at warning: longer than a start takes.
const handoffPatience = 10 * time.Second

// masterHandoff hands every state of the master leases' Endpoints of default/kubernetes
// to the Endpoints controller (set), which stores them beside the others. A watch of
// the leases that fails (the lease manager behind etcd, etcd out of reach) is opened
// again a second later: meanwhile default/kubernetes does not follow the leases. Every
// failure counts in failures; a streak of them that lasts handoffPatience is logged at
// warning, once, and its end at info.
type masterHandoff struct {
	m        *masterlease.Manager
	set      func(*kube.Endpoints)
	log      *slog.Logger
	clock    clockwork.Clock
	failures prometheus.Counter
}

// newMasterHandoff returns the hand-off of m's endpoints to ec, its failures counted
// in allocd_masterlease_endpoints_handoff_failures_total on reg.
func newMasterHandoff(m *masterlease.Manager, ec *endpoints.Controller, log *slog.Logger,
	reg prometheus.Registerer) (*masterHandoff, error) {
	failures := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "allocd_masterlease_endpoints_handoff_failures_total",
		Help: "Failed watches of the master leases' endpoints for the Endpoints controller, each " +
			"tried again a second later: while it rises, default/kubernetes does not follow the leases.",
	})
	if err := reg.Register(failures); err != nil {
		return nil, err
	}
	return &masterHandoff{m: m, set: ec.SetMasterEndpoints, log: log, clock: clockwork.NewRealClock(),
		failures: failures}, nil
}

// run hands the endpoints over until ctx ends.
func (h *masterHandoff) run(ctx context.Context) {
	var since time.Time // the first failure of the current streak; zero: none
	warned := false
	for ctx.Err() == nil {
		err := h.m.WatchEndpoints(ctx, func(e masterlease.Endpoints) error {
			if warned {
				h.log.Info("master lease endpoints followed again", "unavailable_since", since)
			}
			since, warned = time.Time{}, false
			if len(e.Ports) == 0 {
				// The state before this replica saw any lease: it says nothing, and
				// must not erase what an earlier leader stored (the reconciler's guard).
				// An empty state after the last API server shut down carries its port.
				return nil
			}
			h.set(masterEndpoints(e))
			return nil
		})
		if ctx.Err() != nil {
			return
		}
		h.failures.Inc()
		if since.IsZero() {
			since = h.clock.Now()
		}
		switch {
		case warned:
		case h.clock.Since(since) >= handoffPatience:
			h.log.Warn("master lease endpoints unavailable: default/kubernetes does not follow the "+
				"leases; trying again every second", "error", err, "since", since)
			warned = true
		default:
			h.log.Debug("master lease endpoints not available yet; trying again", "error", err)
		}
		select {
		case <-ctx.Done():
		case <-h.clock.After(time.Second):
		}
	}
}

// masterEndpoints is the one subset of the kubernetes Service's Endpoints: the lease
// addresses on the configured ports.
func masterEndpoints(e masterlease.Endpoints) *kube.Endpoints {
	out := &kube.Endpoints{Namespace: "default", Name: "kubernetes"}
	if len(e.Addresses) == 0 {
		return out
	}
	sub := kube.Subset{}
	for _, a := range e.Addresses {
		sub.Addresses = append(sub.Addresses, kube.Address{IP: a.String()})
	}
	for _, p := range e.Ports {
		sub.Ports = append(sub.Ports, kube.Port{Name: p.Name, Port: int32(p.Port), Protocol: p.Protocol})
	}
	out.Subsets = []kube.Subset{sub}
	return out
}
