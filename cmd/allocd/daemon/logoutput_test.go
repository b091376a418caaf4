package daemon

import (
	"bytes"
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
