package watch

import (
	"context"

	"google.golang.org/grpc/metadata"
)

// OwnStream returns ctx marked so that etcd's client puts the watches made with it on a
// gRPC watch stream of their own, named name, instead of the stream it shares between
// every watch whose context carries the same metadata.
//
// A watch that waits for progress notifications needs this. etcd answers a progress
// request on a stream only while every watcher on that stream is synced and none starts
// after the current revision (mvcc's progressIfSync); otherwise the request is dropped,
// not deferred. A watch another package opens from "the revision after the one I
// listed", with nothing written since, would silence the progress of every watch that
// shares its stream until the next write.
func OwnStream(ctx context.Context, name string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "allocd-watch-stream", name)
}
