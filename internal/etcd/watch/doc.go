// Package watch holds what the packages that watch etcd share: a list-and-watch loop
// that starts a session again after it ends (Loop), a way to start every loop's session
// anew when an etcd member was left out (Restarts), and a watch stream of one's own for
// the watches that wait for progress notifications (OwnStream).
//
//	restarts := watch.NewRestarts() // Fire it when an etcd member is left out
//	ctx = watch.WithRestarts(ctx, restarts)
//	watch.Loop(ctx, log, "allocations", 5*time.Second, func(ctx context.Context) error {
//		rev, err := list(ctx)
//		if err != nil {
//			return err
//		}
//		return watchFrom(watch.OwnStream(ctx, "allocations"), rev+1) // until it fails
//	}) // returns once ctx ends
package watch
