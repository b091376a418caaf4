// Command etcdmember runs one member of an etcd cluster as a process of its own, so
// that the fault suite can kill it with SIGKILL, pause it with SIGSTOP and restart it
// on its data. It is etcd's embed package behind a few flags, fsync on:
//
//	etcdmember -name m0 -data-dir /tmp/m0 -client-url http://127.0.0.1:2379 \
//		-peer-url http://127.0.0.1:2380 -initial-cluster m0=http://127.0.0.1:2380,... -token t
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
