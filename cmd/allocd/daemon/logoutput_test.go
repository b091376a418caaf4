package daemon

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allocd/allocd/internal/testing/etcdtest"
)

// lockedBuffer is a bytes.Buffer safe for the timer's goroutine and the test's.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestBufferedOutput: lines wait in the buffer, are written within the flush delay
// without another line to push them, and close writes what is left; after close, lines
// are written at once.
func TestBufferedOutput(t *testing.T) {
	var out lockedBuffer
	b := newBufferedOutput(&out)
	b.Write([]byte("one\n"))
	if got := out.String(); got != "" {
		t.Errorf("written at once = %q; want it buffered", got)
	}
	etcdtest.WaitFor(t, 10*logFlushDelay, "the line written", func() bool { return out.String() == "one\n" })
	b.Write([]byte("two\n"))
	b.close()
	if got := out.String(); got != "one\ntwo\n" {
		t.Errorf("after close = %q; want both lines", got)
	}
	b.Write([]byte("three\n"))
	if got := out.String(); !strings.HasSuffix(got, "three\n") {
		t.Errorf("a line after close = %q; want it written at once", got)
	}
}

// flakyWriter fails its first write (a full disk, say), then writes.
type flakyWriter struct {
	failed bool
	buf    bytes.Buffer
}

func (w *flakyWriter) Write(p []byte) (int, error) {
	if !w.failed {
		w.failed = true
		return 0, errors.New("no space left on device")
	}
	return w.buf.Write(p)
}

// TestBufferedOutputAfterError: one failed write to standard error loses the lines
// buffered then, but not every later line: os.Stderr written line by line did not
// stop logging after a transient error, and the buffer must not either.
func TestBufferedOutputAfterError(t *testing.T) {
	w := &flakyWriter{}
	b := newBufferedOutput(w)
	b.Write([]byte("lost\n"))
	b.flush() // the timer's write: fails
	b.Write([]byte("later\n"))
	b.close()
	if got := w.buf.String(); got != "later\n" {
		t.Errorf("written after a failed write = %q; want the later line", got)
	}
}

// TestWarningsWrittenThrough: a line at warning or above is written at once, after
// the buffered lines logged before it (they may explain it, and a crash that follows
// would lose them); a line at info after it waits in the buffer again. Attributes and
// groups added with With and WithGroup reach both kinds of line.
func TestWarningsWrittenThrough(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			var out lockedBuffer
			b := newBufferedOutput(&out)
			defer b.close()
			log := newLogger(Config{LogLevel: "info", LogFormat: format}, b).With("component", "test")
			log.Info("first")
			if got := out.String(); got != "" {
				t.Errorf("after an info line: %q written; want it buffered", got)
			}
			log.WithGroup("g").Warn("second", "k", "v")
			got := out.String()
			first, second := strings.Index(got, "first"), strings.Index(got, "second")
			if first < 0 || second < first || strings.Count(got, "component") != 2 ||
				!strings.Contains(got, "g.k") && !strings.Contains(got, `"g":{"k"`) {
				t.Errorf("after a warning: %q written; want the info line, then the warning, both with "+
					"component, the warning's k in group g", got)
			}
			log.Error("third")
			log.Info("fourth")
			if got := out.String(); !strings.Contains(got, "third") || strings.Contains(got, "fourth") {
				t.Errorf("after an error and an info line: %q written; want the error, not the info line",
					got)
			}
		})
	}
}

// BenchmarkLogLine writes an Allocate's "allocated" line (the daemon's text handler, at
// info) to a file, as the daemon writes them to its standard error: one write(2) a line,
// or through bufferedOutput.
func BenchmarkLogLine(b *testing.B) {
	for _, buffered := range []bool{false, true} {
		name := map[bool]string{false: "unbuffered", true: "buffered"}[buffered]
		b.Run(name, func(b *testing.B) {
			f, err := os.Create(filepath.Join(b.TempDir(), "log"))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			var w interface{ Write([]byte) (int, error) } = f
			var bo *bufferedOutput
			if buffered {
				bo = newBufferedOutput(f)
				defer bo.close()
				w = bo
			}
			log := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
			at := time.Now()
			b.ReportAllocs()
			for b.Loop() {
				log.Info("allocated", "namespace", "default", "name", "web", "uid", "0f3c2a9e-1b2c",
					"range", "10.96.0.0/12", "clusterIPs", "10.96.12.34", "revision", 123456,
					"took", time.Since(at))
			}
		})
	}
}
