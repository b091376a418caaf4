package allocator

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/internal/badrequest"
	"github.com/allocd/allocd/internal/etcd/call"
)

// store is the allocator's etcd layer: the keys (see the package doc's Storage), the
// record of the ranges, reads of owner records and the streamed or paged listing of a
// prefix. The values' codec is codec.go; the transactions are the Allocator's (the
// group commit's in batch.go, the others beside the calls that make them).
type store struct {
	cli *clientv3.Client
	log *slog.Logger

	configKey, ipPrefix, portPrefix, ownerPrefix, cidrPrefix string
	// cpPrefix holds the index's checkpoints (checkpoint.go): cpHeadKey and the parts
	// under cpDataPrefix.
	cpPrefix, cpHeadKey, cpDataPrefix string
	// epochKey and the tombstones' index under tombPrefix bound how old a transaction
	// may commit.
	epochKey, tombPrefix string
	// watchStart and watchEnd bound both item prefixes and config/ between them, where
	// the ServiceCIDRs are: one watch sees both, in revision order.
	watchStart, watchEnd string

	// noStream is set once etcd answered RangeStream with Unimplemented.
	noStream atomic.Bool
	listPage int // listPageSize; smaller in tests
	// afterPageRead, when set (tests), runs after each read of ListPage.
	afterPageRead func()
}

func newStore(cli *clientv3.Client, log *slog.Logger, prefix string) *store {
	s := &store{cli: cli, log: log,
		configKey:   prefix + "/config/ranges",
		ipPrefix:    prefix + "/clusterips/",
		portPrefix:  prefix + "/nodeports/",
		ownerPrefix: prefix + "/owners/",
		cidrPrefix:  prefix + "/config/servicecidrs/",
		listPage:    listPageSize,
	}
	s.cpPrefix = prefix + "/checkpoints/"
	s.cpHeadKey, s.cpDataPrefix = s.cpPrefix+"head", s.cpPrefix+"data/"
	s.epochKey, s.tombPrefix = prefix+"/epoch", prefix+"/tombstones/"
	s.watchStart = s.ipPrefix
	s.watchEnd = clientv3.GetPrefixRangeEnd(s.portPrefix)
	return s
}

func (s *store) key(it Item) string {
	if it.Kind == KindClusterIP {
		if !it.Addr.IsValid() {
			return s.ipPrefix + it.Addr.String() // "invalid IP", which AppendTo does not write
		}
		// One allocation, not two (the address's text, then the key).
		var buf [96]byte
		return string(it.Addr.AppendTo(append(buf[:0], s.ipPrefix...)))
	}
	return s.portPrefix + strconv.Itoa(it.Port)
}

func (s *store) ownerKey(uid string) string { return s.ownerPrefix + uid }

// ownForm reports whether text, an item key without its prefix, is it written in its
// own form: parseKey takes 030000 for port 30000, and other spellings of an IPv6
// address, which are no allocation to List and the holders.
func ownForm(it Item, text string) bool {
	var buf [64]byte
	if it.Kind == KindClusterIP {
		return string(it.Addr.AppendTo(buf[:0])) == text
	}
	return string(strconv.AppendInt(buf[:0], int64(it.Port), 10)) == text
}

// ownKey is ownForm of key, it's item key.
func (s *store) ownKey(it Item, key []byte) bool {
	prefix := s.portPrefix
	if it.Kind == KindClusterIP {
		prefix = s.ipPrefix
	}
	return len(key) > len(prefix) && ownForm(it, string(key[len(prefix):]))
}

// parseKey maps an item key back to its item.
func (s *store) parseKey(k []byte) (Item, bool) {
	ks := string(k)
	if rest, ok := strings.CutPrefix(ks, s.ipPrefix); ok {
		addr, err := netip.ParseAddr(rest)
		if err != nil {
			return Item{}, false
		}
		return IP(addr), true
	}
	if rest, ok := strings.CutPrefix(ks, s.portPrefix); ok {
		p, err := strconv.Atoi(rest)
		if err != nil {
			return Item{}, false
		}
		return Port(p), true
	}
	return Item{}, false
}

// storedRanges is the JSON of <prefix>/config/ranges.
type storedRanges struct {
	ClusterIPRanges []string `json:"clusterIPRanges"`
	NodePortRange   string   `json:"nodePortRange"`
}

func (s storedRanges) String() string {
	return "--service-cluster-ip-range=" + strings.Join(s.ClusterIPRanges, ",") +
		" --service-node-port-range=" + s.NodePortRange
}

// recordRanges records want at configKey, unless ranges are recorded already: then
// the node port range must be the same (else a *RangesMismatchError). It returns the
// record as stored. The ClusterIP ranges it holds are those of the first start:
// they seed the kubernetes ServiceCIDR when none exists, and may differ from want's.
func (s *store) recordRanges(ctx context.Context, want storedRanges) (storedRanges, error) {
	v, err := json.Marshal(want)
	if err != nil {
		return storedRanges{}, err
	}
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(s.configKey), "=", 0)).
		Then(clientv3.OpPut(s.configKey, string(v))).
		Else(clientv3.OpGet(s.configKey)).Commit()
	if err != nil {
		return storedRanges{}, fmt.Errorf("record ranges at %s: %w", s.configKey, err)
	}
	if resp.Succeeded {
		s.log.Info("recorded ranges in etcd", "key", s.configKey, "ranges", want.String())
		return want, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return storedRanges{}, fmt.Errorf("record ranges at %s: %w", s.configKey, ErrConflict)
	}
	var got storedRanges
	if err := json.Unmarshal(kvs[0].Value, &got); err != nil {
		return storedRanges{}, fmt.Errorf("ranges recorded at %s: %w", s.configKey, err)
	}
	if got.NodePortRange != want.NodePortRange {
		return storedRanges{}, &RangesMismatchError{Key: s.configKey,
			Stored:     "--service-node-port-range=" + got.NodePortRange,
			Configured: "--service-node-port-range=" + want.NodePortRange}
	}
	return got, nil
}

// get reads with a bound on each attempt, and tries again (a read changes nothing)
// when the attempt may have been stuck in a stalled member or an election: the
// client sends the next attempt to the next member.
func (s *store) get(ctx context.Context, key string,
	opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	var resp *clientv3.GetResponse
	err := retryRead(ctx, func(ctx context.Context) (err error) {
		resp, err = s.cli.Get(ctx, key, opts...)
		return err
	})
	return resp, err
}

// retryRead runs read up to three times, each attempt bounded by a second, while it
// fails in a way a stalled member or an election explains (call.Read).
func retryRead(ctx context.Context, read func(ctx context.Context) error) error {
	return call.Read(ctx, time.Second, 3, read)
}

// recordState is an owner record as read, with what compares it.
type recordState struct {
	rec *ownerRecord // nil when absent
	rev int64
}

func (s recordState) cmp(key string) clientv3.Cmp {
	if s.rec == nil {
		return clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	}
	return clientv3.Compare(clientv3.ModRevision(key), "=", s.rev)
}

func (s *store) readRecords(ctx context.Context, uids []string, rev int64) (map[string]recordState, error) {
	out := make(map[string]recordState, len(uids))
	if len(uids) == 0 {
		return out, nil
	}
	var ops []clientv3.Op
	for _, u := range uids {
		if rev != 0 {
			ops = append(ops, clientv3.OpGet(s.ownerKey(u), clientv3.WithRev(rev)))
		} else {
			ops = append(ops, clientv3.OpGet(s.ownerKey(u)))
		}
	}
	resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("read owner records: %w", err)
	}
	for i, r := range resp.Responses {
		st := recordState{}
		if kvs := r.GetResponseRange().Kvs; len(kvs) > 0 {
			rec, err := decodeOwnerRecord(kvs[0].Value)
			if err != nil {
				s.log.Warn("undecodable owner record; rewriting it", "uid", uids[i], "err", err)
				rec = &ownerRecord{UID: uids[i]}
			}
			st = recordState{rec: rec, rev: kvs[0].ModRevision}
		}
		out[uids[i]] = st
	}
	return out, nil
}

// readItemKeys reads the keys of items at one revision: the key-value of each, in
// order, nil for an item that is free.
func (s *store) readItemKeys(ctx context.Context, items []Item) ([]*mvccpb.KeyValue, error) {
	gets := make([]clientv3.Op, len(items))
	for i, it := range items {
		gets[i] = clientv3.OpGet(s.key(it))
	}
	resp, err := s.cli.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return nil, fmt.Errorf("read allocations: %w", err)
	}
	out := make([]*mvccpb.KeyValue, len(items))
	for i, r := range resp.Responses {
		out[i] = firstKV(r.GetResponseRange().Kvs)
	}
	return out, nil
}

// listPageSize is the page size of List on servers without RangeStream: big, since
// etcd walks the rest of the range for every page to count it.
const listPageSize = 50_000

// scan calls fn with the key-values under prefix at rev (0: now), in key order, and
// returns the revision read.
func (s *store) scan(ctx context.Context, prefix string, rev int64,
	fn func([]*mvccpb.KeyValue)) (int64, error) {
	end := clientv3.GetPrefixRangeEnd(prefix)
	if !s.noStream.Load() {
		got, err := s.stream(ctx, prefix, end, rev, fn)
		if status.Code(err) != codes.Unimplemented {
			return got, err
		}
		s.noStream.Store(true)
		s.log.Info("etcd has no RangeStream; listing in pages", "page", s.listPage)
	}
	key := prefix
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(int64(s.listPage))}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(ctx, key, opts...)
		if err != nil {
			return 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		fn(resp.Kvs)
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// stream is scan over RangeStream. An error before the first chunk (Unimplemented
// on an older server) leaves fn uncalled.
func (s *store) stream(ctx context.Context, key, end string, rev int64,
	fn func([]*mvccpb.KeyValue)) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithRange(end)}
	if rev != 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	ch, err := s.cli.GetStream(ctx, key, opts...)
	if err != nil {
		return 0, err
	}
	var got int64
	// Drain the channel even after an error: its sender is the client's goroutine.
	for resp := range ch {
		if err != nil {
			continue
		}
		if err = resp.Err(); err != nil {
			cancel()
			continue
		}
		fn(resp.Kvs)
		if resp.Header != nil {
			got = resp.Header.Revision
		}
	}
	if err != nil {
		return 0, err
	}
	if rev != 0 {
		got = rev
	}
	if got == 0 {
		return 0, errors.New("range stream ended without a revision")
	}
	return got, nil
}

func makeToken(rev int64, lastKey string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(rev, 10) + "\x00" + lastKey))
}

// parseToken returns the revision and the last key of a token that makeToken made,
// refusing one whose key is under none of the prefixes under (a token of another
// listing).
func (s *store) parseToken(tok string, under ...string) (int64, string, error) {
	if tok == "" {
		return 0, "", nil
	}
	bad := badrequest.New("page_token", "not a token of this listing")
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return 0, "", bad
	}
	revs, key, ok := strings.Cut(string(b), "\x00")
	if !ok {
		return 0, "", bad
	}
	rev, err := strconv.ParseInt(revs, 10, 64)
	if err != nil || rev <= 0 || !slices.ContainsFunc(under, func(p string) bool {
		return strings.HasPrefix(key, p)
	}) {
		return 0, "", bad
	}
	return rev, key, nil
}

// listItems calls fn with every item key's item at rev, reading keys only, in
// pages.
func (s *store) listItems(ctx context.Context, rev int64, fn func(Item)) error {
	key := s.watchStart
	for {
		resp, err := s.cli.Get(ctx, key, clientv3.WithRange(s.watchEnd), clientv3.WithKeysOnly(),
			clientv3.WithLimit(10000), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend),
			clientv3.WithRev(rev))
		if err != nil {
			return fmt.Errorf("load allocations: %w", err)
		}
		for _, kv := range resp.Kvs {
			if it, ok := s.parseKey(kv.Key); ok {
				fn(it)
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

func (s *store) tombstoneKey(u int64, uid string) string {
	return s.tombPrefix + fmt.Sprintf("%020d", u) + "/" + uid
}

// firstKV is the first of kvs, nil when there is none.
func firstKV(kvs []*mvccpb.KeyValue) *mvccpb.KeyValue {
	if len(kvs) == 0 {
		return nil
	}
	return kvs[0]
}
