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
// again. A request for a taken, foreign or exhausted address or port is refused with
// kube-apiserver's own words and code; one that kube-apiserver refuses before it
// allocates (a malformed clusterIPs, RequireDualStack on a single-stack cluster) is let
// through untouched, for kube-apiserver to refuse. Dry runs, headless and ExternalName
// Services and default/kubernetes are let through untouched. When allocd cannot
// answer, the webhook answers HTTP 500 with a message naming allocd, and the
// webhook's failurePolicy decides.
//
//	factory := informers.NewSharedInformerFactory(kube, 0)
//	cluster, err := admit.NewCluster(factory)
//	if err != nil { ... }
//	wh, err := admit.New(log, allocdClient, cluster, prometheus.DefaultRegisterer)
//	if err != nil { ... }
//	factory.Start(ctx.Done())
//	go wh.WatchAllocd(ctx, health, 5*time.Second)
//	http.Handle("/mutate", wh) // behind TLS
package admit
