package allocator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bits-and-blooms/bitset"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/allocd/allocd/internal/etcdwatch"
)

// Config configures an Allocator.
type Config struct {
	// Prefix is the etcd key prefix, e.g. "/allocd" (no trailing slash).
	Prefix string
	// ClusterIPRanges are one or two CIDRs, one per family; the first is primary.
	ClusterIPRanges []netip.Prefix
	// NodePortRange is the --service-node-port-range.
	NodePortRange PortRange
	// KubernetesNodePort is reserved with the kubernetes address; 0 = none.
	KubernetesNodePort int
	// Logger receives the allocator's logs; nil discards them.
	Logger *slog.Logger
	// Registerer receives the allocator's metrics; nil means no metrics.
	Registerer prometheus.Registerer
	// CommitConcurrency is how many group-commit transactions may be in flight at
	// once; 0 means DefaultCommitConcurrency.
	CommitConcurrency int
}

// DefaultCommitConcurrency is the default number of transactions in flight.
const DefaultCommitConcurrency = 4

// MaxItems is the most items (ClusterIPs plus NodePorts) one request may name or ask
// for, and the most one owner may hold: one transaction of a request with its owner
// record stays within etcd's 128 operations.
const MaxItems = 64

// maxTxnOps is a stock etcd's --max-txn-ops: the bound of compares, of success
// operations and of failure operations of one transaction, each.
const maxTxnOps = 128

// Allocator allocates ClusterIPs and NodePorts in etcd. See the package doc.
type Allocator struct {
	cli *clientv3.Client
	log *slog.Logger
	m   *metrics

	configKey, ipPrefix, portPrefix, ownerPrefix string
	watchStart, watchEnd                         string

	ipRanges  []*rng // primary first
	portRange *rng
	ranges    []*rng // ipRanges then portRange
	kubeIP    netip.Addr
	kubePort  int
	conc      int

	// noStream is set once etcd answered RangeStream with Unimplemented.
	noStream atomic.Bool
	listPage int // listPageSize; smaller in tests

	// watchRev is the revision the index reflects; settle holds the pending bits that
	// clear once watchRev reaches their revision; revc is closed (and replaced) when
	// watchRev moves.
	watchMu  sync.Mutex
	watchRev int64
	settle   []settleEntry
	revc     chan struct{}
	// watching is set while watchLoop runs; progressc asks it for a progress
	// notification; Sync waits at most syncTimeout.
	watching    atomic.Bool
	progressc   chan struct{}
	syncTimeout time.Duration

	// hints are the owner records last written or read.
	hints ownerHints

	// queue feeds the group committer.
	qmu     sync.Mutex
	queue   []*op
	seen    map[string]struct{} // take's set of a batch's keys, reused
	running bool
	stopped bool
	notify  chan struct{}
}

type settleEntry struct {
	rev int64
	r   *rng
	off uint64
}

// New validates cfg, records the ranges in etcd (refusing ranges that differ from the
// recorded ones with a *RangesMismatchError), loads the allocations into the index
// and reserves the first address of the primary range (and KubernetesNodePort) for
// KubernetesOwner. The Allocator serves when New returns; Run keeps it current.
func New(ctx context.Context, cli *clientv3.Client, cfg Config) (*Allocator, error) {
	if err := ValidateConfig(cfg); err != nil {
		return nil, err
	}
	a := &Allocator{
		cli:         cli,
		log:         cfg.Logger,
		configKey:   cfg.Prefix + "/config/ranges",
		ipPrefix:    cfg.Prefix + "/clusterips/",
		portPrefix:  cfg.Prefix + "/nodeports/",
		ownerPrefix: cfg.Prefix + "/owners/",
		kubePort:    cfg.KubernetesNodePort,
		conc:        cfg.CommitConcurrency,
		notify:      make(chan struct{}, 1),
		listPage:    listPageSize,
		revc:        make(chan struct{}),
		progressc:   make(chan struct{}, 1),
		syncTimeout: defaultSyncTimeout,
	}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if a.conc <= 0 {
		a.conc = DefaultCommitConcurrency
	}
	// One watch covers both item prefixes (and config/, which sorts between them).
	a.watchStart = a.ipPrefix
	a.watchEnd = clientv3.GetPrefixRangeEnd(a.portPrefix)
	for i, p := range cfg.ClusterIPRanges {
		a.ipRanges = append(a.ipRanges, newIPRange(p, i == 0))
	}
	a.portRange = newPortRange(cfg.NodePortRange)
	a.ranges = append(append(a.ranges, a.ipRanges...), a.portRange)
	a.kubeIP = a.ipRanges[0].span.addr(0)
	a.m = newMetrics(a, cfg.Registerer)

	if err := a.recordRanges(ctx); err != nil {
		return nil, err
	}
	if err := a.reload(ctx); err != nil {
		return nil, err
	}
	reserve := []Item{IP(a.kubeIP)}
	if a.kubePort != 0 {
		reserve = append(reserve, Port(a.kubePort))
	}
	for _, it := range reserve {
		_, err := a.Assign(ctx, KubernetesOwner, it)
		var ae *AllocatedError
		switch {
		case errors.As(err, &ae):
			a.log.Error("cannot reserve for the kubernetes service: held by another owner",
				"item", it.String(), "holder", ae.Holder.String())
		case err != nil:
			return nil, fmt.Errorf("reserve %s for the kubernetes service: %w", it, err)
		}
	}
	return a, nil
}

// storedRanges is the JSON of <prefix>/config/ranges.
type storedRanges struct {
	ClusterIPRanges []string `json:"clusterIPRanges"`
	NodePortRange   string   `json:"nodePortRange"`
}

func (s storedRanges) String() string {
	return "--service-cluster-ip-range=" + strings.Join(s.ClusterIPRanges, ",") + " --service-node-port-range=" + s.NodePortRange
}

func (a *Allocator) recordRanges(ctx context.Context) error {
	want := storedRanges{NodePortRange: a.portRange.name}
	for _, r := range a.ipRanges {
		want.ClusterIPRanges = append(want.ClusterIPRanges, r.name)
	}
	v, err := json.Marshal(want)
	if err != nil {
		return err
	}
	resp, err := a.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(a.configKey), "=", 0)).
		Then(clientv3.OpPut(a.configKey, string(v))).
		Else(clientv3.OpGet(a.configKey)).Commit()
	if err != nil {
		return fmt.Errorf("record ranges at %s: %w", a.configKey, err)
	}
	if resp.Succeeded {
		a.log.Info("recorded ranges in etcd", "key", a.configKey, "ranges", want.String())
		return nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return fmt.Errorf("record ranges at %s: %w", a.configKey, ErrConflict)
	}
	var got storedRanges
	if err := json.Unmarshal(kvs[0].Value, &got); err != nil {
		return fmt.Errorf("ranges recorded at %s: %w", a.configKey, err)
	}
	if got.String() != want.String() {
		return &RangesMismatchError{Key: a.configKey, Stored: got.String(), Configured: want.String()}
	}
	return nil
}

// Run keeps the index current with a watch (re-listing after a compaction) and runs
// the group committer, until ctx ends. Allocate calls made while Run is not running
// commit one by one instead of in groups.
func (a *Allocator) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.watchLoop(ctx) })
	g.Go(func() error { return a.commitLoop(ctx) })
	return g.Wait()
}

// ipRange returns the ClusterIP range of a's family, or nil.
func (a *Allocator) ipRange(is4 bool) *rng {
	for _, r := range a.ipRanges {
		if r.span.is4 == is4 {
			return r
		}
	}
	return nil
}

// locate returns the range and offset of it.
func (a *Allocator) locate(it Item) (*rng, uint64, error) {
	switch it.Kind {
	case KindClusterIP:
		if !it.Addr.IsValid() {
			return nil, 0, &InvalidError{Field: "cluster_ip", Reason: "not an IP address"}
		}
		r := a.ipRange(it.Addr.Is4())
		if r == nil {
			return nil, 0, fmt.Errorf("%s: %w", it, ErrNoRange)
		}
		off, ok := r.offset(it)
		if !ok {
			return nil, 0, &NotInRangeError{Item: it, Range: r.name}
		}
		return r, off, nil
	case KindNodePort:
		off, ok := a.portRange.offset(it)
		if !ok {
			return nil, 0, &NotInRangeError{Item: it, Range: a.portRange.name}
		}
		return a.portRange, off, nil
	}
	return nil, 0, &InvalidError{Field: "kind", Reason: "unknown item kind"}
}

// RangeOf returns the name of it's range: ErrNoRange when no range has its IP
// family, a *NotInRangeError when it lies outside (or is the network or broadcast
// address of) its range.
func (a *Allocator) RangeOf(it Item) (string, error) {
	r, _, err := a.locate(it)
	if err != nil {
		return "", err
	}
	return r.name, nil
}

// RangeNames returns the ClusterIP ranges (primary first), then the NodePort range.
func (a *Allocator) RangeNames() []string {
	names := make([]string, len(a.ranges))
	for i, r := range a.ranges {
		names[i] = r.name
	}
	return names
}

// Free returns how many items of the named range the index sees free; 0 for an
// unknown name.
func (a *Allocator) Free(rangeName string) uint64 {
	for _, r := range a.ranges {
		if r.name == rangeName {
			used, _ := r.counts()
			return r.size - used
		}
	}
	return 0
}

// IsReserved reports whether it is the kubernetes address or node port.
func (a *Allocator) IsReserved(it Item) bool {
	switch it.Kind {
	case KindClusterIP:
		return it.Addr == a.kubeIP
	case KindNodePort:
		return a.kubePort != 0 && it.Port == a.kubePort
	}
	return false
}

// IsStatic reports whether it lies in the static (lower) band of its range.
func (a *Allocator) IsStatic(it Item) bool {
	r, off, err := a.locate(it)
	return err == nil && r.static(off)
}

// KubernetesIP returns the address reserved for the kubernetes service.
func (a *Allocator) KubernetesIP() netip.Addr { return a.kubeIP }

func (a *Allocator) key(it Item) string {
	if it.Kind == KindClusterIP {
		return a.ipPrefix + it.Addr.String()
	}
	return a.portPrefix + strconv.Itoa(it.Port)
}

func (a *Allocator) ownerKey(uid string) string { return a.ownerPrefix + uid }

// parseKey maps an item key back to its item.
func (a *Allocator) parseKey(k []byte) (Item, bool) {
	s := string(k)
	if rest, ok := strings.CutPrefix(s, a.ipPrefix); ok {
		addr, err := netip.ParseAddr(rest)
		if err != nil {
			return Item{}, false
		}
		return IP(addr), true
	}
	if rest, ok := strings.CutPrefix(s, a.portPrefix); ok {
		p, err := strconv.Atoi(rest)
		if err != nil {
			return Item{}, false
		}
		return Port(p), true
	}
	return Item{}, false
}

// reload lists every item key at one revision and rebuilds the used bitsets, keeping
// the pending reservations; the index then reflects that revision.
func (a *Allocator) reload(ctx context.Context) error {
	used := make(map[*rng]*bitset.BitSet, len(a.ranges))
	for _, r := range a.ranges {
		used[r] = bitset.New(uint(r.size))
	}
	var rev int64
	key := a.watchStart
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(a.watchEnd), clientv3.WithKeysOnly(),
			clientv3.WithLimit(10000), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := a.cli.Get(ctx, key, opts...)
		if err != nil {
			return fmt.Errorf("load allocations: %w", err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			it, ok := a.parseKey(kv.Key)
			if !ok {
				continue
			}
			r, off, err := a.locate(it)
			if err != nil {
				a.log.Warn("allocation outside the configured ranges", "key", string(kv.Key))
				continue
			}
			used[r].Set(uint(off)) // off < size: locate checked it
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	for _, r := range a.ranges {
		r.replaceUsed(used[r])
	}
	a.advance(rev)
	return nil
}

// advance records that the index reflects rev and clears the pending bits settled
// by then.
func (a *Allocator) advance(rev int64) {
	a.watchMu.Lock()
	if rev > a.watchRev {
		a.watchRev = rev
		close(a.revc)
		a.revc = make(chan struct{})
	}
	var done []settleEntry
	keep := a.settle[:0]
	for _, e := range a.settle {
		if e.rev <= a.watchRev {
			done = append(done, e)
		} else {
			keep = append(keep, e)
		}
	}
	clear(a.settle[len(keep):])
	a.settle = keep
	a.watchMu.Unlock()
	for _, e := range done {
		e.r.unpend(e.off)
	}
}

// settleAt clears the pending bit of off once the index reflects rev, when the
// watch has recorded the key written at rev.
func (a *Allocator) settleAt(rev int64, r *rng, off uint64) {
	a.watchMu.Lock()
	if a.watchRev >= rev {
		a.watchMu.Unlock()
		r.unpend(off)
		return
	}
	a.settle = append(a.settle, settleEntry{rev: rev, r: r, off: off})
	a.watchMu.Unlock()
}

func (a *Allocator) currentRev() int64 {
	a.watchMu.Lock()
	defer a.watchMu.Unlock()
	return a.watchRev
}

const (
	// defaultSyncTimeout bounds how long Sync waits for the watch.
	defaultSyncTimeout = 5 * time.Second
	// progressEvery is how often a waiting Sync asks the watch for progress (etcd
	// ignores the request while the watch is catching up).
	progressEvery = 50 * time.Millisecond
)

// Sync waits until the index reflects every write etcd committed before the call: it
// reads etcd's revision (a linearizable read), then waits for Run's watch to reach
// it, for at most 5 seconds. What Free and Ranges report next is then at least as new
// as any allocation or release acknowledged before Sync was called. It returns
// ErrNotRunning when the watch is behind and Run is not running, ErrNotSynced when
// the watch stays behind for too long, and etcd's and ctx's errors.
func (a *Allocator) Sync(ctx context.Context) error {
	resp, err := a.cli.Get(ctx, a.configKey, clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("read etcd revision: %w", err)
	}
	target := resp.Header.Revision
	var tick <-chan time.Time
	var timeout <-chan time.Time
	for {
		a.watchMu.Lock()
		rev, revc := a.watchRev, a.revc
		a.watchMu.Unlock()
		if rev >= target {
			return nil
		}
		if !a.watching.Load() {
			return fmt.Errorf("allocation index at revision %d, etcd at %d: %w", rev, target, ErrNotRunning)
		}
		if tick == nil {
			t := time.NewTicker(progressEvery)
			defer t.Stop()
			tm := time.NewTimer(a.syncTimeout)
			defer tm.Stop()
			tick, timeout = t.C, tm.C
		}
		select {
		case a.progressc <- struct{}{}:
		default:
		}
		select {
		case <-revc:
		case <-tick:
		case <-timeout:
			return fmt.Errorf("allocation index at revision %d, etcd at %d after %v: %w", rev, target, a.syncTimeout, ErrNotSynced)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// watchLoop applies the item keys' changes to the index from watchRev+1 on; after a
// compaction it re-lists. Progress notifications (which Sync asks for) move watchRev
// past writes outside the watched keys. It returns when ctx ends.
func (a *Allocator) watchLoop(ctx context.Context) error {
	a.watching.Store(true)
	defer a.watching.Store(false)
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		from := a.currentRev() + 1
		// Its own watch stream: Sync waits for progress notifications (see etcdwatch).
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(etcdwatch.OwnStream(ctx, "allocator "+a.watchStart)))
		wch := a.cli.Watch(wctx, a.watchStart, clientv3.WithRange(a.watchEnd), clientv3.WithRev(from))
		compacted := false
	watch:
		for {
			select {
			case <-a.progressc:
				// wctx: the request goes on the watch's stream (same metadata).
				if err := a.cli.RequestProgress(wctx); err != nil {
					a.log.Debug("allocation watch progress request failed", "err", err)
				}
			case resp, ok := <-wch:
				switch {
				case !ok:
					break watch
				case resp.CompactRevision != 0:
					compacted = true
					break watch
				case resp.Err() != nil:
					break watch
				case resp.IsProgressNotify():
					a.advance(resp.Header.Revision)
					continue
				}
				a.apply(resp.Events)
				backoff = 50 * time.Millisecond
			}
		}
		cancel()
		if ctx.Err() != nil {
			break
		}
		if compacted {
			a.log.Warn("allocation watch compacted; re-listing", "from", from)
			if err := a.reload(ctx); err != nil {
				a.log.Warn("re-list allocations", "err", err)
			}
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		backoff = min(2*backoff, 2*time.Second)
	}
	return nil
}

func (a *Allocator) apply(evs []*clientv3.Event) {
	if len(evs) == 0 {
		return
	}
	for _, ev := range evs {
		it, ok := a.parseKey(ev.Kv.Key)
		if !ok {
			continue
		}
		r, off, err := a.locate(it)
		if err != nil {
			continue
		}
		r.setUsed(off, ev.Type == mvccpb.PUT)
	}
	a.advance(evs[len(evs)-1].Kv.ModRevision)
}
