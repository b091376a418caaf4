package cli

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"

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
