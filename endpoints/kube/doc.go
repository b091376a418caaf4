// Package kube holds the Kubernetes objects that allocd's Endpoints and EndpointSlice
// controllers read and write, as the feeds carry them and etcd stores them: what the
// controllers need of a Service, a Pod and a Node (k8s.io/api/core/v1), the v1 Endpoints
// object and the discovery/v1 EndpointSlice (with allocd's bookkeeping: who wrote an
// object, its etcd revisions), and the names Kubernetes gives their labels, annotations
// and enumerations. It knows nothing of etcd, of the feeds' wire form or of the
// controllers' rules; package server converts the API's messages to and from these
// types, package endpoints keeps the objects in etcd, and package endpoints/endpointslice
// plans the slices.
//
// Values are defaulted as the API server defaults them by whoever builds them (the
// server's conversion of a feed): a Service's Type is never "", a port's Protocol never
// "".
//
//	svc := &kube.Service{Namespace: "shop", Name: "web", UID: "u1", Type: kube.TypeClusterIP,
//		ClusterIPs: []string{"10.96.0.10"}, Selector: map[string]string{"app": "web"},
//		Ports: []kube.ServicePort{{Port: 80, TargetPort: kube.TargetPort{Name: "http"},
//			Protocol: kube.ProtocolTCP}}}
//	svc.Key()      // "shop/web"
//	svc.Headless() // false
package kube
