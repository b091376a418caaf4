// Package admit is allocd's mutating admission webhook of Services: it makes allocd
// the allocator of an unmodified kube-apiserver. kube-apiserver runs mutating
// admission before its own allocation, and allocates exactly the ClusterIPs and node
// ports a Service arrives with (or refuses the Service when one is taken); so the
// webhook asks allocd for what kube-apiserver would allocate, by kube-apiserver's own
// rules (pkg/registry/core/service/storage/alloc.go: the family defaulting of
// initIPFamilyFields, initNodePorts and its ports that share a number,
// allocateLoadBalancerNodePorts, the health check node port of a LoadBalancer with
// externalTrafficPolicy Local, and on update only what the change newly needs), and
// writes allocd's answer into the object with a JSON Patch.
//
// At admission a Service has no UID: the webhook allocates under a provisional owner,
// namespace and name (or generateName) of the Service and UID
// "admission/<AdmissionRequest uid>". The bridge (package adopt) moves those items to
// the Service's UID once it sees the Service stored (allocd's Transfer: never free,
// never two holders), and frees the provisional owners whose Service was never stored,
// after a grace longer than kube-apiserver can take to store it.
//
// The webhook checks every item allocd gives against the cluster (informers of
// IPAddress objects and of Services' node ports): one the cluster uses and allocd has
// not adopted yet (kube-apiserver allocated it while the webhook was bypassed under
// failurePolicy Ignore) is moved to the Service that uses it, and the webhook asks
// again; an address outside every ServiceCIDR kube-apiserver allocates from (one being
// deleted, one allocd has and the cluster does not) is never written. What allocd still
// holds for an earlier admission of the same object (a reinvocation, a retry) moves to
// the current one; what it holds for a Service of the cluster that no longer uses it
// (deleted, or changed, and the bridge not caught up) moves over too, after a quorum
// read of that Service. A request for a taken, foreign or exhausted address or port is
// refused with kube-apiserver's own words and code; one that kube-apiserver refuses
// before it allocates (a malformed clusterIPs, RequireDualStack on a single-stack
// cluster) is let through untouched, for kube-apiserver to refuse. Dry runs, headless
// and ExternalName Services and default/kubernetes are let through untouched. When
// allocd cannot answer (or is behind the cluster's ServiceCIDRs), the webhook answers
// HTTP 500 with a message naming allocd and its last health check, and the webhook's
// failurePolicy decides; its readiness is its informers' alone, so that it stays
// behind its Service to give that answer.
//
//	factory := informers.NewSharedInformerFactory(kube, 0)
//	cluster, err := admit.NewCluster(kube, factory)
//	if err != nil { ... }
//	wh, err := admit.New(log, allocdClient, cluster, prometheus.DefaultRegisterer)
//	if err != nil { ... }
//	factory.Start(ctx.Done())
//	go wh.WatchAllocd(ctx, health, 5*time.Second)
//	http.Handle("/mutate", wh) // behind TLS
package admit
