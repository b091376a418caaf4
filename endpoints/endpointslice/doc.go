// Package endpointslice plans a Service's EndpointSlices, as Kubernetes'
// k8s.io/endpointslice library plans them for kube-controller-manager's EndpointSlice
// controller: what the Service's Pods make of its slices (Desire: upstream's
// podToEndpoint, getEndpointPorts and getAddressTypesForService in utils.go), the
// placement of those endpoints into the stored slices (Reconciler.Reconcile:
// reconciler.go), and their hints (topology.go: topologycache/, for a Service annotated
// service.kubernetes.io/topology-mode: Auto; trafficdist.go: trafficdist/, for
// spec.trafficDistribution). It also holds the rules that read one Pod, which the
// Endpoints controller follows too, as upstream's takes them from this library
// (ShouldPodBeInEndpoints, ShouldSetHostname, FindPort).
//
// It does no I/O and keeps no state: package endpoints reads the inputs and the stored
// slices, hands them over and writes the plan. allocd makes every choice deterministic
// where upstream picks from a map, so the same inputs always give the same slices;
// docs/shims/endpointslices.md lists where allocd does better or deviates.
//
//	d := endpointslice.Desire(svc, pods, nodeByName)
//	r := &endpointslice.Reconciler{Service: svc, Desired: d, Existing: stored,
//		Taken: storedNames, MaxEndpointsPerSlice: 100, TriggerTime: trigger}
//	plan := r.Reconcile() // plan.Creates, plan.Updates, plan.Deletes
package endpointslice
