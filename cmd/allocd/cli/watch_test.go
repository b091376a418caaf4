package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/cmd/allocd/daemon"
	"github.com/allocd/allocd/internal/loopback"
	allocdv1 "github.com/allocd/allocd/proto/allocd/v1"
)

// lines is an io.Writer that hands on every complete line written to it.
type lines struct {
	mu  sync.Mutex
	buf bytes.Buffer
	ch  chan string
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	for {
		line, err := l.buf.ReadString('\n')
		if err != nil {
			l.buf.WriteString(line) // not complete yet
			return len(p), nil
		}
		l.ch <- strings.TrimSuffix(line, "\n")
	}
}

// watch runs `allocd watch endpoints args...` until stop is called, which returns its
// exit code and stderr.
func watch(t *testing.T, args ...string) (out chan string, stop func() (int, string)) {
	ctx, cancel := context.WithCancel(context.Background())
	w := &lines{ch: make(chan string, 100)}
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		root := &cobra.Command{Use: "allocd"}
		root.AddCommand(Commands()...)
		done <- Execute(ctx, root, append([]string{"watch", "endpoints"}, args...), w, &stderr)
	}()
	return w.ch, func() (int, string) {
		cancel()
		select {
		case code := <-done:
			return code, stderr.String()
		case <-time.After(10 * time.Second):
			t.Fatal("watch endpoints still running 10s after it was interrupted")
			return 0, ""
		}
	}
}

// next waits for the next line.
func next(t *testing.T, ch chan string, after string) string {
	t.Helper()
	select {
	case l := <-ch:
		return l
	case <-time.After(10 * time.Second):
		t.Fatalf("watch endpoints printed no line within 10s after %s", after)
		return ""
	}
}

// TestWatchEndpoints pushes Services and Pods through the client's feed methods, as a
// shim does, and reads `allocd watch endpoints` print one line per change.
func TestWatchEndpoints(t *testing.T) {
	a := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	web := &allocdv1.Service{Namespace: "shop", Name: "web", Uid: "uid-web",
		ClusterIps: []string{"10.0.0.40"},
		Selector:   &allocdv1.Selector{MatchLabels: map[string]string{"app": "web"}},
		Ports: []*allocdv1.ServicePortSpec{{Name: "http", Port: 80,
			TargetPort: &allocdv1.TargetPort{Value: &allocdv1.TargetPort_IntValue{IntValue: 8080}}}}}
	pod := func(name, ip, rv string, ready bool) *allocdv1.Pod {
		return &allocdv1.Pod{Namespace: "shop", Name: name, Uid: "uid-" + name, ResourceVersion: rv,
			Labels:   map[string]string{"app": "web"},
			NodeName: "node-a", PodIps: []string{ip}, Phase: "Running", Ready: ready}
	}
	if _, err := a.c.PushServiceSnapshot(ctx,
		&allocdv1.ServiceSnapshot{Revision: 20, Services: []*allocdv1.Service{web}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.PushPodSnapshot(ctx, &allocdv1.PodSnapshot{Revision: 20,
		Pods: []*allocdv1.Pod{pod("web-1", "10.244.1.5", "101", true)}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Endpoints of shop/web", func(ctx context.Context) bool {
		_, err := a.c.GetServiceEndpoints(ctx, "shop", "web")
		return err == nil
	})
	a.note("a shim pushed shop/web (selector app=web) and its Pod web-1, ready")

	// -o json: one line of JSON per change.
	out, stop := watch(t, "-n", "shop", "-o", "json")
	first := next(t, out, "the start")
	stop()
	a.record([]string{"watch", "endpoints", "-n", "shop", "-o", "json"}, first+"\n", 0)

	out, stop = watch(t, "-n", "shop")
	var got []string
	got = append(got, next(t, out, "the start"), next(t, out, "the header"))
	for i, ev := range []struct {
		what  string
		event *allocdv1.Event
	}{
		{"web-2 starts, not ready", &allocdv1.Event{Type: allocdv1.EventType_EVENT_TYPE_UPSERT,
			Object: &allocdv1.Event_Pod{Pod: pod("web-2", "10.244.1.6", "102", false)}}},
		{"web-2 is ready", &allocdv1.Event{Type: allocdv1.EventType_EVENT_TYPE_UPSERT,
			Object: &allocdv1.Event_Pod{Pod: pod("web-2", "10.244.1.6", "103", true)}}},
		{"web-1 is deleted", &allocdv1.Event{Type: allocdv1.EventType_EVENT_TYPE_DELETE,
			Object: &allocdv1.Event_Pod{Pod: pod("web-1", "10.244.1.5", "104", true)}}},
		{"shop/web is deleted", &allocdv1.Event{Type: allocdv1.EventType_EVENT_TYPE_DELETE,
			Object: &allocdv1.Event_Service{Service: web}}},
	} {
		rev := int64(21 + i)
		ev.event.Revision = rev
		if _, err := a.c.PushEvents(ctx,
			&allocdv1.PushEventsRequest{Revision: rev, Events: []*allocdv1.Event{ev.event}}); err != nil {
			t.Fatal(err)
		}
		got = append(got, "# "+ev.what, next(t, out, ev.what))
	}
	code, stderr := stop()
	if code != 0 || stderr != "" {
		t.Errorf("watch endpoints interrupted = %d, %q; want 0 and nothing on stderr", code, stderr)
	}
	a.record([]string{"watch", "endpoints", "-n", "shop"}, strings.Join(got, "\n")+"\n", 0)
	a.golden("watch")
}

// change is one line of `allocd watch endpoints -o json`, read back.
type change struct {
	typ, name string
	ready     []string
	rev       int64
}

func readChange(t *testing.T, ch chan string, after string) change {
	t.Helper()
	line := next(t, ch, after)
	var ev allocdv1.WatchServiceEndpointsResponse
	if err := protojson.Unmarshal([]byte(line), &ev); err != nil {
		t.Fatalf("watch endpoints -o json printed %q after %s: %v", line, after, err)
	}
	c := change{typ: strings.TrimPrefix(ev.GetType().String(), "WATCH_EVENT_TYPE_"),
		name: ev.GetEndpoints().GetName(),
		rev:  ev.GetRevision()}
	for _, ss := range ev.GetEndpoints().GetSubsets() {
		for _, a := range ss.GetAddresses() {
			c.ready = append(c.ready, a.GetIp())
		}
	}
	slices.Sort(c.ready)
	return c
}

// TestWatchEndpointsResumes: the allocd a watch talks to (a second replica on the
// first one's etcd) stops and starts again. The watch resumes from the last change it
// printed: the change made while it was away comes once, nothing comes twice. Then,
// while it is away, etcd compacts past that change: the watch lists again and prints
// what changed since (a Service created, one deleted).
func TestWatchEndpointsResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("stops and starts an allocd replica twice: seconds")
	}
	a := start(t) // the first replica, with etcd; the shim pushes to it
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := daemon.TestConfig(t.TempDir(), func() string {
		addr, err := loopback.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		return addr
	})
	cfg.EtcdServers = a.d.Client().Endpoints()
	second := func() *daemon.Daemon {
		d, err := daemon.Start(ctx, cfg)
		if err != nil {
			t.Fatalf("start the second replica: %v", err)
		}
		return d
	}
	two := second()
	defer func() { two.Close() }()

	sel := &allocdv1.Selector{MatchLabels: map[string]string{"app": "web"}}
	web := &allocdv1.Service{Namespace: "shop", Name: "web", Uid: "uid-web", Selector: sel,
		Ports: []*allocdv1.ServicePortSpec{{Name: "http", Port: 80}}}
	api := &allocdv1.Service{Namespace: "shop", Name: "api", Uid: "uid-api", Selector: sel,
		Ports: []*allocdv1.ServicePortSpec{{Name: "http", Port: 81}}}
	pod := func(name, ip string) *allocdv1.Pod {
		return &allocdv1.Pod{Namespace: "shop", Name: name, Uid: "uid-" + name, ResourceVersion: "1",
			Labels: sel.MatchLabels, PodIps: []string{ip}, Phase: "Running", Ready: true}
	}
	push := func(rev int64, evs ...*allocdv1.Event) {
		t.Helper()
		if _, err := a.c.PushEvents(ctx,
			&allocdv1.PushEventsRequest{Revision: rev, Events: evs}); err != nil {
			t.Fatal(err)
		}
	}
	upsert := func(rev int64, o any) *allocdv1.Event {
		ev := &allocdv1.Event{Type: allocdv1.EventType_EVENT_TYPE_UPSERT, Revision: rev}
		switch o := o.(type) {
		case *allocdv1.Pod:
			ev.Object = &allocdv1.Event_Pod{Pod: o}
		case *allocdv1.Service:
			ev.Object = &allocdv1.Event_Service{Service: o}
		}
		return ev
	}
	stored := func(name string, n int) {
		t.Helper()
		eventually(t, fmt.Sprintf("shop/%s with %d addresses", name, n), func(ctx context.Context) bool {
			ep, err := a.c.GetServiceEndpoints(ctx, "shop", name)
			if n < 0 {
				return errors.Is(err, client.ErrNotFound)
			}
			ready := 0
			for _, ss := range ep.GetSubsets() {
				ready += len(ss.GetAddresses())
			}
			return err == nil && ready == n
		})
	}
	if _, err := a.c.PushServiceSnapshot(ctx,
		&allocdv1.ServiceSnapshot{Revision: 10, Services: []*allocdv1.Service{web}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.PushPodSnapshot(ctx,
		&allocdv1.PodSnapshot{Revision: 10, Pods: []*allocdv1.Pod{pod("web-1", "10.244.0.1")}}); err != nil {
		t.Fatal(err)
	}
	stored("web", 1)

	out, stop := watch(t, "-n", "shop", "-o", "json", "--server", two.GRPCAddr())
	var got []change
	got = append(got, readChange(t, out, "the start"))

	two.Close() // the stream breaks
	push(11, upsert(11, pod("web-2", "10.244.0.2")))
	stored("web", 2)
	two = second()
	got = append(got, readChange(t, out, "the restart"))
	push(12, &allocdv1.Event{Type: allocdv1.EventType_EVENT_TYPE_DELETE, Revision: 12,
		Object: &allocdv1.Event_Pod{Pod: pod("web-1", "10.244.0.1")}})
	got = append(got, readChange(t, out, "web-1 deleted"))

	two.Close()
	push(14, upsert(13, api), &allocdv1.Event{Type: allocdv1.EventType_EVENT_TYPE_DELETE, Revision: 14,
		Object: &allocdv1.Event_Service{Service: web}})
	stored("web", -1)
	stored("api", 1)
	resp, err := a.d.Client().Get(ctx, "/none")
	if err == nil {
		_, err = a.d.Client().Compact(ctx, resp.Header.Revision)
	}
	if err != nil {
		t.Fatalf("compact etcd: %v", err)
	}
	two = second()
	got = append(got, readChange(t, out, "the compaction"), readChange(t, out, "the compaction"))
	code, stderr := stop()

	want := []change{
		{typ: "ADDED", name: "web", ready: []string{"10.244.0.1"}},
		{typ: "MODIFIED", name: "web", ready: []string{"10.244.0.1", "10.244.0.2"}},
		{typ: "MODIFIED", name: "web", ready: []string{"10.244.0.2"}},
		{typ: "ADDED", name: "api", ready: []string{"10.244.0.2"}},
		{typ: "DELETED", name: "web", ready: []string{"10.244.0.2"}},
	}
	for i := range got {
		got[i].rev = 0
	}
	same := func(x, y change) bool {
		return x.typ == y.typ && x.name == y.name && slices.Equal(x.ready, y.ready)
	}
	if !slices.EqualFunc(got, want, same) {
		t.Errorf("watch endpoints across two restarts printed\n%v\nwant\n%v", got, want)
	}
	select {
	case l := <-out:
		t.Errorf("watch endpoints printed %q more", l)
	default:
	}
	if code != 0 || !strings.Contains(stderr, "; watching again from revision ") ||
		!strings.Contains(stderr, "was compacted; listing again") {
		t.Errorf("watch endpoints interrupted = %d, stderr:\n%s\nwant 0, the resumes and the listing again "+
			"said", code, stderr)
	}
}
