package etcdtest

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/allocd/allocd/internal/etcd/call"
)

// Cluster is a running test etcd of several members in this process, for tests of
// what allocd does through an etcd leader change. Its methods are for the test's own
// goroutine; Client is safe for concurrent use.
//
//	c := etcdtest.NewCluster(t, 3)
//	c.StopMember(c.Leader()) // the others elect a new leader
//	resp, err := c.Client.Put(ctx, "k", "v")
type Cluster struct {
	// Client is connected to every member's endpoint (it fails over to the members
	// that are up); closed by t.Cleanup.
	Client *clientv3.Client
	// Endpoints are the members' client URLs, by member index.
	Endpoints []string

	t       testing.TB
	token   string
	initial string // the initial cluster: name=peerURL,...
	members []*member
	bin     string // the etcd binary the members run as processes of; "" when embedded
	tickMs  uint
	elecMs  uint
}

// ClusterOption changes how NewCluster's members run.
type ClusterOption func(*Cluster)

// Processes runs the members as processes of go.mod's etcd server (built once by
// EtcdBinary), so that PauseMember can stop one as SIGSTOP stops a process: its raft
// loop and its lessor together. It skips the test under -short (it builds a binary).
func Processes() ClusterOption {
	return func(c *Cluster) {
		c.t.Helper()
		if c.bin == "" {
			c.bin = EtcdBinary(c.t)
		}
	}
}

// Timing sets the members' raft heartbeat interval and election timeout (New's fast
// 10 ms and 100 ms when not given; etcd's defaults are 100 ms and 1 s).
func Timing(tickMs, electionMs uint) ClusterOption {
	return func(c *Cluster) { c.tickMs, c.elecMs = tickMs, electionMs }
}

type member struct {
	name, dir, clientURL, peerURL string
	etcd                          *embed.Etcd   // nil while stopped
	closed                        chan struct{} // closed when the last stop is over; nil before any
	proc                          *process      // with binaryEnv, instead of etcd; nil while stopped
}

// NewCluster starts size members (named m0, m1, ...) as one new cluster on free
// loopback ports, each in its own t.TempDir(), with New's fast raft timing (10 ms
// ticks, 100 ms election timeout, unless Timing says otherwise) and fsync off, and
// returns once every member serves clients. t.Cleanup stops them.
func NewCluster(t testing.TB, size int, opts ...ClusterOption) *Cluster {
	t.Helper()
	if size < 1 {
		t.Fatalf("etcdtest.NewCluster(%d): want at least one member", size)
	}
	c := &Cluster{t: t, token: fmt.Sprintf("etcdtest-%d", time.Now().UnixNano()), bin: binary(),
		tickMs: 10, elecMs: 100}
	for _, o := range opts {
		o(c)
	}
	var initial []string
	for i := range size {
		m := &member{
			name:      fmt.Sprintf("m%d", i),
			dir:       t.TempDir(),
			clientURL: "http://" + freeAddr(t),
			peerURL:   "http://" + freeAddr(t),
		}
		c.members = append(c.members, m)
		c.Endpoints = append(c.Endpoints, m.clientURL)
		initial = append(initial, m.name+"="+m.peerURL)
	}
	c.initial = strings.Join(initial, ",")
	t.Cleanup(c.stopAll)
	// The members of a new cluster become ready together, once they have a quorum:
	// start them all, then wait.
	for i := range c.members {
		c.launch(i)
	}
	for i := range c.members {
		c.waitReady(i)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   c.Endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		// As allocd's own client: the errors of calls that reached no member say so.
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(call.NotSentInterceptor()),
			grpc.WithDisableRetry()},
	})
	if err != nil {
		t.Fatalf("etcd cluster client: %v", err)
	}
	c.Client = cli
	if c.bin == binary() {
		logProcess(t, strings.Join(c.Endpoints, ","))
	}
	return c
}

// Leader returns the index of the member the running members see as their leader,
// waiting up to 10 s for them to have one that is running.
func (c *Cluster) Leader() int {
	c.t.Helper()
	if c.bin != "" {
		return c.processLeader()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, m := range c.members {
			if m.etcd == nil {
				continue
			}
			lead := m.etcd.Server.Leader()
			for i, o := range c.members {
				if o.etcd != nil && o.etcd.Server.MemberID() == lead {
					return i
				}
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("etcd cluster: no running leader after 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// StopMember stops member i as a crash would: its raft node stops at once, without
// handing leadership over (the others elect a leader after the election timeout), and
// StopMember returns. Its listeners close in the background: new requests go to the
// other members at once, but a client stream already open on it (a watch) stays
// silent until etcd cuts it, after its request timeout (5.2 s here), and then resumes
// on another member. With binaryEnv the member's process is killed, which closes its
// connections at once. Stopping a stopped member does nothing.
func (c *Cluster) StopMember(i int) {
	m := c.members[i]
	if m.proc != nil {
		m.proc.kill()
		m.proc = nil
		return
	}
	if m.etcd == nil {
		return
	}
	e := m.etcd
	e.Server.HardStop()
	m.etcd = nil
	m.closed = make(chan struct{})
	go func() { // waited for by StartMember and the cleanup
		defer close(m.closed)
		e.Close()
	}()
}

// PauseMember stops member i's process with SIGSTOP, as a stalled machine or a long
// pause of its collector would: it holds its connections open and answers nothing,
// and its raft ticks and lease expiries stand still until ResumeMember. Only for a
// cluster of Processes.
func (c *Cluster) PauseMember(i int) { c.signal(i, syscall.SIGSTOP) }

// ResumeMember resumes member i paused by PauseMember (SIGCONT).
func (c *Cluster) ResumeMember(i int) { c.signal(i, syscall.SIGCONT) }

func (c *Cluster) signal(i int, sig syscall.Signal) {
	c.t.Helper()
	m := c.members[i]
	if m.proc == nil {
		c.t.Fatalf("etcd member %s: not a running process (NewCluster with Processes)", m.name)
	}
	if err := m.proc.cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("etcd member %s: %v: %v", m.name, sig, err)
	}
}

// StartMember starts member i, stopped by StopMember, again on its data dir and
// ports, and returns once it serves clients (it needs a quorum of members up).
func (c *Cluster) StartMember(i int) {
	c.t.Helper()
	m := c.members[i]
	if m.etcd != nil || m.proc != nil {
		return
	}
	if m.closed != nil {
		<-m.closed // its ports and data dir are free
	}
	c.launch(i)
	c.waitReady(i)
}

// launch starts member i without waiting for it to be ready.
func (c *Cluster) launch(i int) {
	c.t.Helper()
	if c.bin != "" {
		c.launchProcess(i)
		return
	}
	m := c.members[i]
	cu, err := url.Parse(m.clientURL)
	if err != nil {
		c.t.Fatalf("etcd member %s: %v", m.name, err)
	}
	pu, err := url.Parse(m.peerURL)
	if err != nil {
		c.t.Fatalf("etcd member %s: %v", m.name, err)
	}
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = m.dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.ListenMetricsUrls = nil
	cfg.InitialCluster = c.initial
	cfg.InitialClusterToken = c.token // on a restart, etcd reads the cluster from the data dir
	cfg.UnsafeNoFsync = true
	cfg.TickMs, cfg.ElectionMs = c.tickMs, c.elecMs
	cfg.LogLevel = "panic" // as in package embedded: Close logs expected listener errors
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		c.t.Fatalf("start etcd member %s: %v", m.name, err)
	}
	m.etcd = e
}

// waitReady waits for member i to serve clients, for at most a minute.
func (c *Cluster) waitReady(i int) {
	c.t.Helper()
	m := c.members[i]
	if m.proc != nil {
		if err := m.proc.waitHealthy(context.Background(), m.clientURL); err != nil {
			c.t.Fatalf("etcd member %s: %v", m.name, err)
		}
		return
	}
	select {
	case <-m.etcd.Server.ReadyNotify():
	case err := <-m.etcd.Err():
		c.t.Fatalf("etcd member %s: %v", m.name, err)
	case <-time.After(time.Minute):
		c.t.Fatalf("etcd member %s: not ready after 1m", m.name)
	}
}

func (c *Cluster) stopAll() {
	if c.Client != nil {
		c.Client.Close()
	}
	// Stop the members together: a member waiting for its peers must not hold up
	// the others.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan struct{}, len(c.members))
	n := 0
	for _, m := range c.members {
		switch {
		case m.proc != nil:
			go func(p *process) { p.kill(); done <- struct{}{} }(m.proc)
			m.proc = nil
		case m.etcd != nil:
			go func(e *embed.Etcd) { e.Close(); done <- struct{}{} }(m.etcd)
			m.etcd = nil
		case m.closed != nil:
			go func(closed chan struct{}) { <-closed; done <- struct{}{} }(m.closed)
		default:
			continue
		}
		n++
	}
	for range n {
		select {
		case <-done:
		case <-ctx.Done():
			c.t.Errorf("etcd cluster: members not stopped after 1m")
			return
		}
	}
}

// String describes the cluster, for test logs.
func (c *Cluster) String() string {
	return fmt.Sprintf("etcd cluster %s", strings.Join(c.Endpoints, ","))
}
