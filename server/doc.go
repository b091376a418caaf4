// Package server is allocd's gRPC surface: the AllocatorService, LeaseService and
// RepairService of allocd.v1 over packages allocator, masterlease and repair; request
// validation; the one mapping of errors to gRPC codes with google.rpc details (Status);
// and the grpc.Server with allocd's interceptors (Prometheus metrics, logging, panic
// recovery), grpc.health.v1 and server reflection that serves the API's comments.
//
//	gs, hs := server.NewGRPCServer(server.Options{Logger: log, Registerer: reg})
//	allocdv1.RegisterAllocatorServiceServer(gs, server.NewAllocatorService(alloc, log))
//	allocdv1.RegisterLeaseServiceServer(gs, server.NewLeaseService(leases, log))
//	allocdv1.RegisterRepairServiceServer(gs, server.NewRepairService(rep, log))
//	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
//	err := gs.Serve(lis)
package server
