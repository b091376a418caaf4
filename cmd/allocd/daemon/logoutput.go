package daemon

import (
	"bufio"
	"io"
	"sync"
	"time"
)

// logFlushDelay is how long a log line may wait in the buffer of the daemon's standard
// error before it is written.
const logFlushDelay = 100 * time.Millisecond

// bufferedOutput buffers the daemon's log lines on their way to standard error, and
// writes them at most logFlushDelay after the first of them came, or when 64 KiB wait:
// at the default level every Allocate and Release logs a line, and a write(2) per line
// is a system call (and, to a pipe, a wake-up of the reader) per call. A kill -9 loses
// the last 100 ms of lines; a panic's report does not go through it. No goroutine runs
// while the buffer is empty: a timer's function writes it out.
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
	if b.timer == nil && b.buf.Buffered() > 0 {
		b.timer = time.AfterFunc(logFlushDelay, b.flush)
	}
	return n, err
}

func (b *bufferedOutput) flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.timer = nil
	b.buf.Flush()
}

// close writes what the buffer holds; later lines are written at once.
func (b *bufferedOutput) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	b.buf.Flush()
	b.closed = true
}
