package pagedattn

import (
	"sync"
	"unsafe"
)

// handle guards a C handle: calls hold the read lock, Close the write lock, so Close never frees
// a handle another goroutine is using and use after Close is an error, not a crash.
type handle struct {
	mu   sync.RWMutex
	p    unsafe.Pointer
	kind string
}

// acquire returns the live pointer with the read lock held (release it), or an error if closed.
func (h *handle) acquire() (unsafe.Pointer, error) {
	if h == nil {
		return nil, goError(NullPointer, "nil handle")
	}
	h.mu.RLock()
	if h.p == nil {
		h.mu.RUnlock()
		return nil, goError(InvalidHandle, "%s is closed", h.kind)
	}
	return h.p, nil
}

func (h *handle) release() { h.mu.RUnlock() }

// acquireExclusive is acquire with the write lock (for calls that need exclusive access).
func (h *handle) acquireExclusive() (unsafe.Pointer, error) {
	if h == nil {
		return nil, goError(NullPointer, "nil handle")
	}
	h.mu.Lock()
	if h.p == nil {
		h.mu.Unlock()
		return nil, goError(InvalidHandle, "%s is closed", h.kind)
	}
	return h.p, nil
}

func (h *handle) releaseExclusive() { h.mu.Unlock() }

func (h *handle) close(destroy func(unsafe.Pointer)) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.p == nil {
		return goError(InvalidHandle, "%s is already closed", h.kind)
	}
	destroy(h.p)
	h.p = nil
	return nil
}

// noPtr is a typed nil for optional handles.
var noPtr unsafe.Pointer
