package daemon

import "context"

// startServices builds the allocator, the master leases and the repair loop on d.cli,
// loads their state, swaps them in for the gates, and runs their loops in d.group under
// runCtx. ctx bounds the start.
func (d *Daemon) startServices(ctx, runCtx context.Context) error {
	return nil
}
