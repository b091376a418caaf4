package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/allocd/allocd/internal/etcd/embedded"
)

func main() {
	var c embedded.Config
	flag.StringVar(&c.Name, "name", "", "member name")
	flag.StringVar(&c.Dir, "data-dir", "", "data directory")
	flag.StringVar(&c.ClientURL, "client-url", "", "client URL, http://HOST:PORT")
	flag.StringVar(&c.PeerURL, "peer-url", "", "peer URL, http://HOST:PORT")
	flag.StringVar(&c.InitialCluster, "initial-cluster", "", "name=peerURL,... of every member")
	flag.StringVar(&c.ClusterToken, "token", "", "initial cluster token")
	flag.UintVar(&c.TickMs, "tick-ms", 0, "raft heartbeat interval (etcd's default when 0)")
	flag.UintVar(&c.ElectionMs, "election-ms", 0, "raft election timeout (etcd's default when 0)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	e, err := embedded.Start(ctx, c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdmember:", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	select {
	case <-ctx.Done():
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "etcdmember:", err)
	}
	e.Close()
}
