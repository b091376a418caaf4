package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// healthTimeout is health's default --timeout: under the 3 s a container runtime
// gives a health check (Dockerfile's HEALTHCHECK --timeout), so that the check says
// why it failed before it is killed.
const healthTimeout = 2 * time.Second

// newHealth is `allocd health`, the container health check, with the flags of every
// other command.
func newHealth(o *options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Exit 0 when an allocd answers grpc.health.v1 SERVING (the container health check)",
		Long: `Ask allocd's gRPC health service (grpc.health.v1 Check, the service "") and print its
status: exit 0 when it is SERVING, 1 otherwise (NOT_SERVING until etcd answers and the
state is loaded, while etcd is unreachable or out of space, and while allocd shuts
down) or when allocd does not answer within --timeout. It needs no client
certificate: with TLS, --tls-ca-file is enough.

-o json prints the HealthCheckResponse ({"status": "SERVING"}).`,
		Example: `  allocd health
  allocd health --server 127.0.0.1:8081 --timeout 1s
  allocd health --tls-ca-file /certs/ca.crt`,
		Args: args(0, 0, "no argument (--server names the allocd)"),
		RunE: runE(o, func(ctx context.Context, s *session, _ []string) error {
			if s.cmd.Flags().Changed("grpc-address") {
				fmt.Fprintln(s.err, "Flag --grpc-address has been deprecated, use --server")
			}
			st, err := call(ctx, o, s.c.Health)
			if err != nil {
				return s.fail("health", false, err)
			}
			if o.structured() {
				err = printObject(s.out, o.output, &healthpb.HealthCheckResponse{Status: st})
			} else {
				_, err = fmt.Fprintln(s.out, st)
			}
			if err != nil {
				return err
			}
			if st != healthpb.HealthCheckResponse_SERVING {
				return ExitCode(1)
			}
			return nil
		}),
	}
	fs := cmd.Flags()
	o.register(fs)
	fs.Lookup("timeout").DefValue = healthTimeout.String()
	o.timeout = healthTimeout
	// Before it took the flags of the other commands, health named the allocd with
	// --grpc-address, as allocd's own flag: still taken, hidden, and said to be
	// deprecated on stderr (cobra's own notice would go to stdout).
	fs.StringVar(&o.server, "grpc-address", defaultServer, "the allocd to check (deprecated: --server)")
	fs.MarkHidden("grpc-address")
	completeOutput(cmd)
	return cmd
}
