// Package write keeps allocd's Endpoints (and, with a Kind per kind of object,
// EndpointSlices) in a Kubernetes cluster: a Writer lists and watches allocd's objects
// of one Kind and writes each into the API server, create, update or delete, from a
// pool of workers, with the labels and annotations kube-controller-manager sets.
//
// It writes only what allocd's controllers manage (never the objects of a Service
// without selector), deletes only what allocd deleted or does not hold (and only an
// object its controller wrote: a sweep after each listing and every minute, held off
// while allocd looks reset), retries a conflict from allocd's state, and writes nothing
// when the cluster's object already matches, so that a restarted bridge rewrites
// nothing.
//
//	m := write.NewMetrics(prometheus.DefaultRegisterer)
//	eps := write.NewEndpoints(c, kube, factory, m)
//	w := write.New(log, eps, 5, m)
//	if err := w.Register(); err != nil {
//		return err
//	}
//	factory.Start(ctx.Done())
//	return w.Run(ctx)
package write
