package daemon

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"sync"
	"time"
)

// logFlushDelay is how long a log line may wait in the buffer of the daemon's standard
// error before it is written.
const logFlushDelay = 100 * time.Millisecond

// bufferedOutput buffers the daemon's log lines on their way to standard error, and
// writes them at most logFlushDelay after the first of them came, or when 64 KiB wait:
// at the default level every Allocate and Release logs a line, and a write(2) per line
// is a system call (and, to a pipe, a wake-up of the reader) per call. No goroutine
// runs while the buffer is empty: a timer's function writes it out.
//
// Lines at warning and above go through at once (urgentHandler), with what the buffer
// holds before them: they are few, and they are the ones that explain a crash. A
// process that ends without close (kill -9, SIGKILL after the grace period, a panic, an
// os.Exit in a dependency such as a zap Fatal in the embedded etcd or a log.Fatal)
// loses the info and debug lines of its last 100 ms (or 64 KiB, when lines come
// faster). A failed write (a full disk behind standard error, EIO) loses what the
// buffer held then; the lines that come after are written as before.
type bufferedOutput struct {
	mu     sync.Mutex
	out    io.Writer
	buf    *bufio.Writer
	timer  *time.Timer // the pending write of what the buffer holds; nil: none
	closed bool
}

func newBufferedOutput(out io.Writer) *bufferedOutput {
	return &bufferedOutput{out: out, buf: bufio.NewWriterSize(out, 64<<10)}
}

// Write buffers p (one log line); after close it writes p at once.
func (b *bufferedOutput) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return b.out.Write(p)
	}
	n, err := b.buf.Write(p)
	if err != nil {
		b.drop()
		return n, err
	}
	if b.timer == nil && b.buf.Buffered() > 0 {
		b.timer = time.AfterFunc(logFlushDelay, b.flush)
	}
	return n, nil
}

// writeThrough writes what the buffer holds, then p, at once.
func (b *bufferedOutput) writeThrough(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
	return b.out.Write(p)
}

func (b *bufferedOutput) flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.timer = nil
	b.flushLocked()
}

// flushLocked writes what the buffer holds; if that fails, it is lost.
func (b *bufferedOutput) flushLocked() {
	if b.buf.Flush() != nil {
		b.drop()
	}
}

// drop forgets what the buffer holds and the error of its last write: a bufio.Writer
// keeps its first error and refuses every later write, which would silence the log
// for good after one failed write.
func (b *bufferedOutput) drop() { b.buf.Reset(b.out) }

// close writes what the buffer holds; later lines are written at once.
func (b *bufferedOutput) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	b.flushLocked()
	b.closed = true
}

// throughWriter writes each line through its bufferedOutput at once.
type throughWriter struct{ b *bufferedOutput }

func (w throughWriter) Write(p []byte) (int, error) { return w.b.writeThrough(p) }

// urgentHandler sends records at warning and above to through, which writes them at
// once, and the others to buffered, which buffers them: two handlers of the same
// format and options, one on a bufferedOutput, one on its throughWriter.
type urgentHandler struct {
	buffered, through slog.Handler
}

// newUrgentHandler returns an urgentHandler of the handlers that newHandler makes on
// b and on its throughWriter.
func newUrgentHandler(b *bufferedOutput, newHandler func(io.Writer) slog.Handler) *urgentHandler {
	return &urgentHandler{buffered: newHandler(b), through: newHandler(throughWriter{b})}
}

func (h *urgentHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.buffered.Enabled(ctx, l)
}

func (h *urgentHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		return h.through.Handle(ctx, r)
	}
	return h.buffered.Handle(ctx, r)
}

func (h *urgentHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &urgentHandler{buffered: h.buffered.WithAttrs(as), through: h.through.WithAttrs(as)}
}

func (h *urgentHandler) WithGroup(name string) slog.Handler {
	return &urgentHandler{buffered: h.buffered.WithGroup(name), through: h.through.WithGroup(name)}
}
