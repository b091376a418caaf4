package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/leader"
	"github.com/allocd/allocd/tlsfiles"

	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// Metadata of calls forwarded from a replica that does not lead to the leader. A
// forwarded call is never forwarded again. The receipt keys carry the receipt of the
// replica that got a Service snapshot first, so that the leader judges with the earlier
// fence (it takes the earlier of its own and these; a caller can make the fence
// earlier, never later).
const (
	mdForwardedBy      = "allocd-forwarded-by"  // the forwarding replica's identity
	mdForwardedFor     = "allocd-forwarded-for" // the original caller's certificate identity
	mdReceivedRevision = "allocd-received-revision"
	mdReceivedTime     = "allocd-received-time-unix-nano"
)

// ForwardingMetadata are the metadata keys that only a replica may send: a server
// that can tell replicas from other callers (by their client certificates) drops them
// from the calls of everyone else (see the daemon's security), so that no caller can
// pass for a forwarding replica.
var ForwardingMetadata = []string{mdForwardedBy, mdForwardedFor, mdReceivedRevision, mdReceivedTime}

// Leadership is what the services need of the election: who leads, and who this
// replica is (*leader.Elector). Leader may answer from a view that trails etcd;
// ReadLeader reads etcd.
type Leadership interface {
	Leader(ctx context.Context) (identity string, self bool, err error)
	ReadLeader(ctx context.Context) (identity string, self bool, err error)
	Identity() string
}

// Forwarder hands the calls that only the leader serves (the feeds, RunRepair,
// GetRepairStatus) to the leader, when this replica does not lead: the election value
// is the leader's gRPC address. It keeps one connection per leader. A leader that
// cannot be reached is UNAVAILABLE naming it.
//
// Who leads comes from the election's Leader, which costs no read of etcd while the
// elector's watch follows the election, and may trail etcd by the watch's delay. That
// is safe: the replica a call is forwarded to serves it only while a term of its own
// runs (and its writes are fenced); otherwise it refuses it, naming the leader it
// knows, and never forwards it again.
//
// During a leader change, a call may go to the old leader. Once its term has ended it
// refuses the call without applying any of it (UNAVAILABLE, or FAILED_PRECONDITION
// NOT_REPAIR_LEADER for repair); a term that ends while it serves the call fails the
// call as any call cut short (a feed's messages before the end applied in that term).
// On a refusal, and on UNAVAILABLE from a leader that cannot be reached, the Forwarder
// reads the leader from etcd and, when etcd names another replica, sends it the call
// once more, whole: a new term has seen none of it. Otherwise (etcd names the same
// replica, none, or this one; the second leader refuses too) the caller gets the
// answer, which it retries as any UNAVAILABLE. A call goes to at most two leaders, and
// a forwarded call is never forwarded again.
type Forwarder struct {
	lead  Leadership
	creds credentials.TransportCredentials
	log   *slog.Logger

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// NewForwarder returns a Forwarder for the election lead. creds secure the calls to
// the leader (with TLS on, the replica's own certificate as client certificate and the
// CA of the replicas'; the leader authorizes the replica's identity); nil means
// plaintext. Close it at shutdown.
func NewForwarder(lead Leadership, creds credentials.TransportCredentials, log *slog.Logger) *Forwarder {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	return &Forwarder{lead: lead, creds: creds, log: log}
}

// Close closes every connection to a leader.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	for k, cc := range f.conns {
		errs = append(errs, cc.Close())
		delete(f.conns, k)
	}
	return errors.Join(errs...)
}

// conn returns a connection to the leader, opened on first use.
func (f *Forwarder) conn(leader string) (*grpc.ClientConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cc, ok := f.conns[leader]; ok {
		return cc, nil
	}
	cc, err := grpc.NewClient(leader,
		grpc.WithTransportCredentials(f.creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxRecvMsgSize),
			grpc.MaxCallSendMsgSize(MaxRecvMsgSize)))
	if err != nil {
		return nil, err
	}
	if f.conns == nil {
		f.conns = map[string]*grpc.ClientConn{}
	}
	f.conns[leader] = cc
	return cc, nil
}

// route tells where a call of controller goes: self when this replica leads (the
// caller serves it), else a connection to the leader and its identity. When the
// election still names this replica though its term is not running, the view may
// trail a change that etcd already knows: etcd is read.
func (f *Forwarder) route(ctx context.Context, controller string) (cc *grpc.ClientConn, leaderID string,
	self bool, err error) {
	id, self, err := f.lead.Leader(ctx)
	if err == nil && !self && id == f.lead.Identity() {
		id, self, err = f.lead.ReadLeader(ctx)
	}
	if err != nil {
		return nil, "", false, Status(err)
	}
	if self {
		return nil, id, true, nil
	}
	cc, err = f.target(ctx, controller, id)
	return cc, id, false, err
}

// target returns a connection to the leader id, or the error to answer when there is
// no leader to forward to: none elected, this call was forwarded already, or the
// election still names this replica while it no longer leads.
func (f *Forwarder) target(ctx context.Context, controller, id string) (*grpc.ClientConn, error) {
	switch {
	case id == "":
		return nil, Status(&leader.NotLeaderError{Controller: controller})
	case isForwarded(ctx):
		return nil, Status(&leader.NotLeaderError{Controller: controller, Leader: id})
	case id == f.lead.Identity():
		return nil, Status(&leader.NotLeaderError{Controller: controller, Leader: id,
			Err: errors.New("leadership is changing")})
	}
	cc, err := f.conn(id)
	if err != nil {
		f.log.Warn("cannot dial the leader", "leader", id, "error", err)
		return nil, Status(&leader.NotLeaderError{Controller: controller, Leader: id, Err: err})
	}
	return cc, nil
}

// outgoing marks a call as forwarded by this replica for the caller of ctx (the
// deadline of ctx goes along).
func (f *Forwarder) outgoing(ctx context.Context, kv ...string) context.Context {
	kv = append(kv, mdForwardedBy, f.lead.Identity())
	if id := tlsfiles.PeerIdentity(ctx); id != "" {
		kv = append(kv, mdForwardedFor, id)
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// failed passes the leader's answer through, and turns a leader that cannot be
// reached into UNAVAILABLE naming it.
func (f *Forwarder) failed(controller, id string, err error) error {
	if st, ok := status.FromError(err); ok && st.Code() != codes.Unavailable {
		return err
	}
	f.log.Warn("leader unreachable", "controller", controller, "leader", id, "error", err)
	return Status(&leader.NotLeaderError{Controller: controller, Leader: id, Err: err})
}

// refused tells an answer of the replica a call was forwarded to that may mean it no
// longer leads: UNAVAILABLE (the NotLeaderError of the Endpoints controller, or of repair
// without a leader to name; a replica that cannot be reached) or FAILED_PRECONDITION
// NOT_REPAIR_LEADER.
func refused(err error) bool {
	st, ok := status.FromError(err)
	switch {
	case !ok:
		return false
	case st.Code() == codes.Unavailable:
		return true
	case st.Code() != codes.FailedPrecondition:
		return false
	}
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetDomain() == errorDomain &&
			ei.GetReason() == allocdv1.ErrorReason_NOT_REPAIR_LEADER.String() {
			return true
		}
	}
	return false
}

// successor reads the leader from etcd after the leader id refused a call, and returns
// it and a connection to it when it is another replica: not id, not this one.
func (f *Forwarder) successor(ctx context.Context, id string) (string, *grpc.ClientConn, bool) {
	next, self, err := f.lead.ReadLeader(ctx)
	if err != nil || self || next == "" || next == id || next == f.lead.Identity() {
		return "", nil, false
	}
	cc, err := f.conn(next)
	if err != nil {
		return "", nil, false
	}
	return next, cc, true
}

// send makes a forwarded call with do on cc, the connection to the leader id; when that
// leader refuses it and etcd names another leader now, it makes it once more there. It
// returns the answer, or the error to end the call with.
func send[Resp any](ctx context.Context, f *Forwarder, controller, id string, cc *grpc.ClientConn,
	do func(*grpc.ClientConn) (*Resp, error)) (*Resp, error) {
	resp, err := do(cc)
	if err != nil && refused(err) {
		if next, ncc, ok := f.successor(ctx, id); ok {
			f.log.Info("the leader refused a forwarded call; sending it to the leader etcd names now",
				"controller", controller, "refused_by", id, "leader", next, "error", err)
			id = next
			resp, err = do(ncc)
		}
	}
	if err != nil {
		return nil, f.failed(controller, id, err)
	}
	return resp, nil
}

// forwardUnary sends req to the leader id with call and returns its answer.
func forwardUnary[Req, Resp any](ctx context.Context, f *Forwarder, controller, id string, req *Req,
	call func(grpc.ClientConnInterface, context.Context, *Req) (*Resp, error)) (*Resp, error) {
	cc, err := f.target(ctx, controller, id)
	if err != nil {
		return nil, err
	}
	octx := f.outgoing(ctx)
	return send(ctx, f, controller, id, cc, func(cc *grpc.ClientConn) (*Resp, error) {
		return call(cc, octx, req)
	})
}

// streamOpener opens a client stream of the method a forwarded stream replays on.
type streamOpener[Req, Resp any] func(grpc.ClientConnInterface,
	context.Context) (grpc.ClientStreamingClient[Req, Resp], error)

// toLeader forwards msgs to the leader on a client stream that open opens, with the
// metadata kv, unless this replica leads: forwarded is false then, and the caller
// applies msgs itself.
func toLeader[Req, Resp any](ctx context.Context, f *Forwarder, controller string, msgs []*Req,
	open streamOpener[Req, Resp], kv ...string) (resp *Resp, forwarded bool, err error) {
	cc, id, self, err := f.route(ctx, controller)
	if self || err != nil {
		return nil, !self, err
	}
	octx := f.outgoing(ctx, kv...)
	resp, err = send(ctx, f, controller, id, cc, func(cc *grpc.ClientConn) (*Resp, error) {
		return replay(octx, cc, msgs, open)
	})
	return resp, true, err
}

// unaryVia adapts method m of the generated client that newClient makes to
// forwardUnary:
//
//	unaryVia(allocdv1.NewRepairServiceClient, allocdv1.RepairServiceClient.RunRepair)
func unaryVia[C, Req, Resp any](newClient func(grpc.ClientConnInterface) C,
	m func(C, context.Context, *Req, ...grpc.CallOption) (*Resp, error),
) func(grpc.ClientConnInterface, context.Context, *Req) (*Resp, error) {
	return func(cc grpc.ClientConnInterface, ctx context.Context, req *Req) (*Resp, error) {
		return m(newClient(cc), ctx, req)
	}
}

// streamVia adapts client-stream method m of the generated client that newClient makes
// to toLeader.
func streamVia[C, Req, Resp any](newClient func(grpc.ClientConnInterface) C,
	m func(C, context.Context, ...grpc.CallOption) (grpc.ClientStreamingClient[Req, Resp], error),
) streamOpener[Req, Resp] {
	return func(cc grpc.ClientConnInterface,
		ctx context.Context) (grpc.ClientStreamingClient[Req, Resp], error) {
		return m(newClient(cc), ctx)
	}
}

// replay sends msgs on a client stream that open opens on cc and returns its answer.
func replay[Req, Resp any](ctx context.Context, cc grpc.ClientConnInterface, msgs []*Req,
	open streamOpener[Req, Resp]) (*Resp, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := open(cc, ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range msgs {
		if err := st.Send(m); err != nil {
			if err == io.EOF {
				break // the leader ended the stream: CloseAndRecv has its status
			}
			return nil, err
		}
	}
	return st.CloseAndRecv()
}

// isForwarded tells a call a replica forwarded.
func isForwarded(ctx context.Context) bool {
	return len(metadata.ValueFromIncomingContext(ctx, mdForwardedBy)) > 0
}

// ForwardedFor returns, for a call a replica forwarded, the replica's identity and the
// original caller's certificate identity ("" without one); ok is false for a call that
// was not forwarded. Call logs name both.
func ForwardedFor(ctx context.Context) (replica, caller string, ok bool) {
	by := metadata.ValueFromIncomingContext(ctx, mdForwardedBy)
	if len(by) == 0 {
		return "", "", false
	}
	if v := metadata.ValueFromIncomingContext(ctx, mdForwardedFor); len(v) > 0 {
		caller = v[0]
	}
	return by[0], caller, true
}

// receiveChunks reads the chunks of a snapshot stream until the client closes it:
// every chunk must carry a snapshot (rev's ok), all of one revision. first runs when the
// first chunk arrives (repair takes its receipt then). It returns the chunks and their
// revision, or the error to end the call with (INVALID_ARGUMENT naming the field for a
// malformed stream; nothing was applied).
func receiveChunks[Req any, Resp any](stream grpc.ClientStreamingServer[Req, Resp],
	rev func(*Req) (int64, bool), first func() error) ([]*Req, int64, error) {
	var chunks []*Req
	var want int64
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, 0, err
		}
		r, ok := rev(req)
		switch {
		case !ok:
			return nil, 0, Status(Invalid("snapshot", "required in every chunk"))
		case len(chunks) == 0:
			want = r
			if first != nil {
				if err := first(); err != nil {
					return nil, 0, Status(err)
				}
			}
		case r != want:
			return nil, 0, Status(Invalid("snapshot.revision", fmt.Sprintf(
				"chunk %d has revision %d but the first chunk had %d: "+
					"every chunk of one stream carries the same revision", len(chunks), r, want)))
		}
		chunks = append(chunks, req)
	}
	if len(chunks) == 0 {
		return nil, 0, Status(Invalid("snapshot", "the stream carried no chunk"))
	}
	return chunks, want, nil
}

// parseInt64 reads the one positive integer of a metadata key's values md, 0 when it is
// absent, repeated or bad.
func parseInt64(md []string) int64 {
	if len(md) != 1 {
		return 0
	}
	n, err := strconv.ParseInt(md[0], 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}
