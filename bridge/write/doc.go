// Package write keeps allocd's Endpoints and EndpointSlices in a Kubernetes cluster: a
// Writer, typed by the kind's allocd object, lists and watches allocd's objects of one
// Kind and writes each into the API server, create, update or delete, from a pool of
// workers, with the labels and annotations kube-controller-manager sets. Both kinds
// write through one loop of create, update and delete (with its retries); what differs
// between them (which object is theirs, how one is compared and merged) are their
// rules.
//
// It writes only what allocd's controllers manage (never the objects of a Service
// without selector), deletes only what allocd deleted or does not hold (and only an
// object its controller wrote: a sweep after each listing and every minute, held off
// while allocd looks reset), retries a conflict from allocd's state, and writes nothing
// when the cluster's object already matches, so that a restarted bridge rewrites
// nothing.
//
//	m := write.NewMetrics(prometheus.DefaultRegisterer)
//	eps := write.NewEndpoints(c, kube, factory, m, false)
//	w := write.New(log, eps, 5, m)
//	if err := w.Register(); err != nil {
//		return err
//	}
//	factory.Start(ctx.Done())
//	return w.Run(ctx)
package write
