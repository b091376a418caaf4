package cli

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/cmd/allocd/daemon"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// pushSlicesFeed pushes shop/web, Node node-a and the Pods as snapshots of revision
// rev.
func pushSlicesFeed(t *testing.T, c *client.Client, rev int64, pods ...*allocdv1.Pod) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	web := &allocdv1.Service{Namespace: "shop", Name: "web", Uid: "uid-web",
		ClusterIps: []string{"10.0.0.40"},
		IpFamilies: []string{"IPv4"},
		Selector:   &allocdv1.Selector{MatchLabels: map[string]string{"app": "web"}},
		Ports: []*allocdv1.ServicePortSpec{{Name: "http", Port: 80,
			TargetPort: &allocdv1.TargetPort{Value: &allocdv1.TargetPort_IntValue{IntValue: 8080}}}}}
	if _, err := c.PushServiceSnapshot(ctx,
		&allocdv1.ServiceSnapshot{Revision: rev, Services: []*allocdv1.Service{web}}); err != nil {
		t.Fatal(err)
	}
	node := &allocdv1.Node{Name: "node-a", Labels: map[string]string{"topology.kubernetes.io/zone": "zone-a"},
		Ready: true}
	if _, err := c.PushNodeSnapshot(ctx,
		&allocdv1.NodeSnapshot{Revision: rev, Nodes: []*allocdv1.Node{node}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PushPodSnapshot(ctx, &allocdv1.PodSnapshot{Revision: rev, Pods: pods}); err != nil {
		t.Fatal(err)
	}
}

func webPod(name, ip, rv string, ready bool) *allocdv1.Pod {
	return &allocdv1.Pod{Namespace: "shop", Name: name, Uid: "uid-" + name, ResourceVersion: rv,
		Labels: map[string]string{"app": "web"}, NodeName: "node-a", PodIps: []string{ip}, Phase: "Running",
		Ready: ready}
}

// TestEndpointSlicesCommands: get endpointslices lists the Service's slice; watch
// endpointslices prints it, and when allocd restarts under it, watches again from the
// last revision it printed and prints the next change once.
func TestEndpointSlicesCommands(t *testing.T) {
	var cfg daemon.Config
	a := start(t, func(c *daemon.Config) { cfg = *c })
	pushSlicesFeed(t, a.c, 1, webPod("web-1", "10.244.1.5", "1", true),
		webPod("web-2", "10.244.1.6", "1", true))
	eventually(t, "the slice of shop/web", func(ctx context.Context) bool {
		out, _, code := execute(ctx, "get", "endpointslices", "-n", "shop")
		return code == 0 && strings.Contains(out, "10.244.1.5,10.244.1.6")
	})
	out, _, code := execute(context.Background(), "get", "endpointslices", "-n", "shop", "--service", "web",
		"-o", "wide")
	if code != 0 || !strings.Contains(out, "IPv4") || !strings.Contains(out, "2/2") ||
		!strings.Contains(out, "endpointslice-controller.k8s.io") {
		t.Errorf("get endpointslices -o wide = %d:\n%s\nwant the slice, IPv4, 2/2 ready, the controller",
			code, out)
	}

	ctx, cancel := context.WithCancel(context.Background())
	w := &lines{ch: make(chan string, 100)}
	var stderr syncedBuffer
	done := make(chan int, 1)
	go func() {
		root := &cobra.Command{Use: "allocd"}
		root.AddCommand(Commands()...)
		done <- Execute(ctx, root, []string{"watch", "endpointslices", "-n", "shop"}, w, &stderr)
	}()
	if h := next(t, w.ch, "the start"); !strings.HasPrefix(h, "EVENT") {
		t.Fatalf("first line %q; want the header", h)
	}
	if l := next(t, w.ch, "the header"); !strings.HasPrefix(l, "ADDED") {
		t.Fatalf("second line %q; want the slice ADDED", l)
	}

	// allocd restarts: the watch breaks and watches again; the new leader needs the
	// feeds again, and a readiness flip then shows once, as MODIFIED.
	a.d.Close()
	d2, err := daemon.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("restart allocd: %v", err)
	}
	t.Cleanup(func() { d2.Close() })
	c2, err := client.New(d2.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	pushSlicesFeed(t, c2, 2, webPod("web-1", "10.244.1.5", "1", true),
		webPod("web-2", "10.244.1.6", "2", false))
	if l := next(t, w.ch, "the restart and the flip"); !strings.HasPrefix(l, "MODIFIED") ||
		!strings.Contains(l, "10.244.1.6") {
		t.Errorf("after the restart %q; want the slice MODIFIED", l)
	}
	select {
	case l := <-w.ch:
		t.Errorf("another line %q; want the change once", l)
	case <-time.After(500 * time.Millisecond):
	}
	cancel()
	if code := <-done; code != 0 || !strings.Contains(stderr.String(), "watching again from revision") {
		t.Errorf("watch endpointslices = %d, stderr %q; want 0 and a note that it watched again", code,
			stderr.String())
	}
}

// syncedBuffer is a bytes.Buffer written by one goroutine and read by another.
type syncedBuffer struct {
	lines
}

func (b *syncedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestResume: after a broken stream, the changes of the last revision printed are
// asked for again (one revision holds the changes of many objects), and those printed
// already, deletions included, are skipped.
func TestResume(t *testing.T) {
	type change struct {
		typ  allocdv1.WatchEventType
		name string
		rev  int64
	}
	const added, modified, deleted = allocdv1.WatchEventType_WATCH_EVENT_TYPE_ADDED,
		allocdv1.WatchEventType_WATCH_EVENT_TYPE_MODIFIED, allocdv1.WatchEventType_WATCH_EVENT_TYPE_DELETED
	streams := [][]change{ // what each stream sends before it breaks
		{{added, "a", 11}, {added, "b", 11}},
		{{added, "a", 11}, {added, "b", 11}, {added, "c", 11}, {modified, "a", 12}, {deleted, "b", 12}},
		{{modified, "a", 12}, {deleted, "b", 12}, {modified, "c", 13}},
	}
	var froms []int64
	var got []change // printed
	type (
		object = *allocdv1.ServiceEndpoints
		wev    = *allocdv1.WatchServiceEndpointsResponse
	)
	p := &eventPrinter[wev]{w: io.Discard, format: outTable,
		row: func(ev wev, _ bool) (string, []string) {
			got = append(got, change{ev.GetType(), ev.GetEndpoints().GetName(), ev.GetRevision()})
			return ev.GetType().String(), nil
		}}
	k := watchKind[object, wev]{
		list: func(context.Context, func(object, int64) error, func() error) (int64, error) {
			return 10, nil
		},
		watch: func(_ context.Context, from int64, each func(wev) error) error {
			froms = append(froms, from)
			for _, c := range streams[len(froms)-1] {
				ep := &allocdv1.ServiceEndpoints{Namespace: "ns", Name: c.name, Revision: c.rev}
				if err := each(&allocdv1.WatchServiceEndpointsResponse{Type: c.typ, Endpoints: ep,
					Revision: c.rev}); err != nil {
					return err
				}
			}
			return client.ErrUnavailable
		},
		key: func(ep object) string { return ep.GetNamespace() + "/" + ep.GetName() },
		change: func(ev wev) (allocdv1.WatchEventType, object, int64) {
			return ev.GetType(), ev.GetEndpoints(), ev.GetRevision()
		},
	}
	w := &followed[object, wev]{k: k, p: p,
		known: map[string]printed[object]{}, deleted: map[string]int64{}}
	ctx := context.Background()
	if err := w.list(ctx); err != nil {
		t.Fatal(err)
	}
	for range streams {
		if err := w.follow(ctx); !errors.Is(err, client.ErrUnavailable) {
			t.Fatalf("follow = %v; want the stream's break", err)
		}
	}
	if want := []int64{10, 10, 11}; !slices.Equal(froms, want) {
		t.Errorf("streams opened after revisions %v; want %v", froms, want)
	}
	want := []change{{added, "a", 11}, {added, "b", 11}, {added, "c", 11}, {modified, "a", 12},
		{deleted, "b", 12},
		{modified, "c", 13}}
	if !slices.Equal(got, want) {
		t.Errorf("printed %v; want %v", got, want)
	}
}
