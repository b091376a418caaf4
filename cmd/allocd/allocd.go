// Command allocd serves the allocd.v1 API: ClusterIP and NodePort allocation, master
// leases and the kubernetes Service's endpoints, and the repair loop, all kept in etcd.
// With no --etcd-servers it runs an embedded etcd in --data-dir.
//
// Its subcommands are the operator's command line (package cmd/allocd/cli: allocd get
// ranges, allocd release, ...) and the container health check (allocd health). The
// command is package cmd/allocd/app, so that tools/gendocs can write its reference.
package main

import (
	"io"
	"os"

	"github.com/allocd/allocd/cmd/allocd/app"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is allocd with args (package app); it returns the exit code.
func run(args []string, stdout, stderr io.Writer) int { return app.Run(args, stdout, stderr) }
