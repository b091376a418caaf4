// Package daemon wires allocd together: etcd (embedded or remote), the allocator, the
// master leases, the repair loop, the gRPC server with health and reflection, and the
// metrics listener; with the security flags, TLS for both, client certificates, and
// the authorization of calls by grpc-go's authz policy (security.go). cmd/allocd parses
// flags into a Config and calls Run; tests call StartForTest.
//
//	d, err := daemon.Start(ctx, daemon.DefaultConfig())
//	if err != nil { ... }
//	defer d.Close()
//	fmt.Println("serving on", d.GRPCAddr())
package daemon
