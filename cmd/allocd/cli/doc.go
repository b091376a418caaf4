// Package cli is allocd's operator command line, kubectl-style: the subcommands of the
// allocd binary that call a running allocd through package client and print what it
// says for a person (tables, a usage bar per range) or for a script (-o json, the
// API's proto JSON; -o yaml).
//
//	allocd get ranges
//	allocd get allocations --owner default/web
//	allocd describe allocation 10.0.0.10
//	allocd release --owner default/web
//	allocd get leases; allocd delete lease 192.168.0.2
//	allocd repair run --dry-run; allocd repair status
//	allocd get servicecidrs; allocd create servicecidr extra 10.96.1.0/24; allocd delete servicecidr extra
//	allocd get endpoints -n shop; allocd get endpointslices -A; allocd watch endpoints -n shop
//
// It owns the commands (Commands, added to the allocd root command beside serving) and
// how they report: Execute prints a failed call in one line that names the gRPC code
// in words, allocd's message and what its google.rpc details add (the bad field, the
// holder of an address, the full range and what to do), or allocd out of reach at the
// address tried. Calls are made once, each within --timeout: a person is told at once.
//
//	root := &cobra.Command{Use: "allocd"}
//	root.AddCommand(cli.Commands()...)
//	os.Exit(cli.Execute(ctx, root, os.Args[1:], os.Stdout, os.Stderr))
//
// Package client stays free of this package's dependencies (cobra, YAML).
package cli
