package client

import (
	"context"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Health asks allocd's grpc.health.v1 service (the service "", allocd as a whole) for
// its status: SERVING once etcd answers and the state is loaded; NOT_SERVING while etcd
// is unreachable or out of space, and while allocd shuts down. A status is an answer,
// not an error: errors are those of a call that got none.
func (c *Client) Health(ctx context.Context) (healthpb.HealthCheckResponse_ServingStatus, error) {
	resp, err := unary(ctx, c, healthpb.Health_Check_FullMethodName, &healthpb.HealthCheckRequest{},
		healthpb.NewHealthClient(c.conn).Check)
	return resp.GetStatus(), err
}
