// Package syncbuf is a bytes.Buffer that several goroutines may write and
// read at once, for tests that collect a child process's or a logger's
// output while it runs.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is safe for concurrent use. The zero value is empty and ready.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
