// Package feed feeds allocd from a Kubernetes cluster: client-go informers on Services
// and Pods drive client.Feeder, so that allocd's controllers and its repair loop see
// the cluster's objects. Snapshots come from the informers' caches once they are
// synced, then events in order; a broken watch, a delete missed during it, or allocd
// asking for them brings new snapshots.
//
//	factory := informers.NewSharedInformerFactory(kube, 0)
//	src, err := feed.New(log, kube, factory, c, nil)
//	if err != nil {
//		return err
//	}
//	factory.Start(ctx.Done())
//	return src.Run(ctx)
package feed
