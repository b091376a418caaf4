// Package adopt keeps allocd's allocations in step with a cluster's Services: every
// ClusterIP and NodePort a Service holds is held in allocd under the Service's UID
// (adoption), and what a Service gives up is released. allocd's ServiceCIDRs follow the
// cluster's as they change (Controller.SyncCIDRs, driven by an informer): one the
// cluster allocates from is created in allocd, one the cluster is deleting is deleted
// in allocd, so that allocd hands out nothing kube-apiserver refuses. It owns the
// second half of the admission webhook's allocations (package admit): the webhook
// allocates under a provisional owner (UID "admission/<request uid>") before the
// Service has a UID, and this package settles them.
//
//   - Binding: adoption finds a Service's item held by a provisional owner of the
//     Service's namespace and name (or generateName) and moves it to the Service's UID
//     with allocd's Transfer, in one transaction: never free, never two holders.
//   - Sweeping: a Sweeper lists the provisional owners every interval; an item older
//     than the grace is bound to the stored Service that holds it (a quorum read of the
//     API server) or freed. The grace exceeds the longest time kube-apiserver takes
//     from admission to storing the object, so no Service can still be stored with it.
//
// Both act on the same items without harm: a Transfer of an item its provisional
// owner no longer holds, and a Release of one, change nothing (allocd answers
// ErrNotOwner). allocd's repair loop judges a provisional owner's item only when it is
// older than the Service snapshot allocd judges against and its --repair-leak-grace:
// a stored Service that uses it makes repair reassign it to the Service, none makes it
// a leak candidate freed after --repair-leak-strikes passes.
//
//	a := adopt.New(log, allocdClient)
//	ctl := adopt.NewController(a, log, factory.Core().V1().Services().Informer().GetStore(), 5)
//	sw := adopt.NewSweeper(a, kube, log, adopt.SweeperConfig{})
//	go ctl.Run(ctx, informer.HasSynced)
//	go ctl.SyncCIDRs(ctx, listCIDRs, 30*time.Second) // and ctl.ServiceCIDRChanged on its informer
//	go sw.Run(ctx, ctl.Ran)
package adopt
