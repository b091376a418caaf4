package server

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// leaderConns are the connections a replica keeps to the leaders it forwards calls to
// (a replica that is not the elected leader forwards the feeds and repair calls to the
// one that is), by the leader's identity: its advertised gRPC address.
type leaderConns struct {
	// creds secure the connections (nil: plaintext); set before the first get.
	creds credentials.TransportCredentials
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// get returns a connection to leader, opened on first use.
func (lc *leaderConns) get(leader string) (*grpc.ClientConn, error) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if cc, ok := lc.conns[leader]; ok {
		return cc, nil
	}
	creds := lc.creds
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	cc, err := grpc.NewClient(leader,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxRecvMsgSize), grpc.MaxCallSendMsgSize(MaxRecvMsgSize)))
	if err != nil {
		return nil, err
	}
	if lc.conns == nil {
		lc.conns = map[string]*grpc.ClientConn{}
	}
	lc.conns[leader] = cc
	return cc, nil
}

// close closes every connection.
func (lc *leaderConns) close() error {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	var errs []error
	for k, cc := range lc.conns {
		errs = append(errs, cc.Close())
		delete(lc.conns, k)
	}
	return errors.Join(errs...)
}

// forwardedBy marks a call as forwarded by identity (the deadline of ctx goes along): a
// forwarded call is never forwarded again.
func forwardedBy(ctx context.Context, identity string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, mdForwardedBy, identity)
}
