// Package feed feeds allocd from a Kubernetes cluster: client-go informers on Services
// and Pods drive client.Feeder, so that allocd's controllers and its repair loop see
// the cluster's objects. Once the informers have synced, snapshots listed from the API
// server (exact at the list's resourceVersion), then the informers' events in order; a
// broken watch, a delete missed during it, a change older than one fed before (a
// relist's replay) or allocd asking for them brings new snapshots.
//
//	factory := informers.NewSharedInformerFactory(kube, 0)
//	src, err := feed.New(log, kube, factory, c, nil)
//	if err != nil {
//		return err
//	}
//	factory.Start(ctx.Done())
//	return src.Run(ctx)
package feed
