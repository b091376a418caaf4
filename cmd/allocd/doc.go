// Command allocd serves the allocd.v1 API: ClusterIP and NodePort allocation, master
// leases and the kubernetes Service's endpoints, and the repair loop, all kept in etcd.
// With no --etcd-servers it runs an embedded etcd in --data-dir.
//
// Its subcommands are the operator's command line (package cmd/allocd/cli: allocd get
// ranges, allocd release, ...) and the container health check (allocd health). The
// command is package cmd/allocd/app, so that tools/gendocs can write its reference.
//
//	allocd --service-cluster-ip-range 10.96.0.0/12 --data-dir /var/lib/allocd
//	allocd get ranges --server 127.0.0.1:8080
package main
