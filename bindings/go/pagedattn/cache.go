package pagedattn

import (
	"runtime"
	"unsafe"
)

// Layout is the order of a block's elements.
type Layout int

// Layouts.
const (
	NHD Layout = 0 // [block][slot][head][dim]
	HND Layout = 1 // [block][head][slot][dim]
)

// Cache flags.
const (
	// CacheHost places a cache in (pinned) host memory owned by the backend, for swaps.
	CacheHost uint32 = 1
	// CacheLatent makes a latent cache for multi-head latent attention (MLA: DeepSeek V2/V3/R1,
	// Kimi K2; FeatureMLA): one row of HeadSize values per token and layer (kv_lora_rank values,
	// then the rotary key: 576 = 512 + 64 for DeepSeek V3) shared by every query head, with
	// NumKVHeads 1. Written by KVCache.WriteLatent, read by Backend.ForwardMLA.
	CacheLatent uint32 = 2
)

// CacheDesc is a cache's geometry.
type CacheDesc struct {
	NumLayers, NumBlocks, BlockSize, NumKVHeads, HeadSize int
	DType                                                 DType
	Layout                                                Layout
	Flags                                                 uint32 // CacheHost, CacheLatent
}

// Latent reports whether d describes a latent (MLA) cache.
func (d CacheDesc) Latent() bool { return d.Flags&CacheLatent != 0 }

// BytesPerBlock returns the bytes one block takes across all layers, K and V (a latent cache's
// rows once; also one block's record in ReadBlocks output).
func (d CacheDesc) BytesPerBlock() (uint64, error) { return cBytesPerBlock(d) }

// LayerMemory is one layer's K and V base addresses and element strides (block, slot, head).
type LayerMemory struct {
	K, V    uintptr
	Strides [3]int64
}

// KVCache is a paged KV cache. Calls that write it may run concurrently only on disjoint
// blocks; reads may run concurrently.
type KVCache struct {
	h       handle
	backend *Backend // keeps the Go backend (and its finalizer) behind the cache
}

func newCache(p unsafe.Pointer, be *Backend) *KVCache {
	c := &KVCache{h: handle{p: p, kind: "kv cache"}, backend: be}
	runtime.SetFinalizer(c, func(c *KVCache) { _ = c.Close() })
	return c
}

// NewKVCache creates a cache whose memory the library allocates on the backend's device, zeroed.
func NewKVCache(be *Backend, desc CacheDesc) (*KVCache, error) {
	bp, err := be.handle().acquire()
	if err != nil {
		return nil, err
	}
	defer be.h.release()
	p, err := cCacheCreate(bp, desc)
	if err != nil {
		return nil, err
	}
	return newCache(p, be), nil
}

// WrapKVCache creates a cache over memory the Go runtime does not manage (C.malloc, mmap, GPU
// memory): one base address per layer for K and for V (a latent cache: its rows in kLayers, and
// vLayers nil), element strides (block, slot, head; zeros = compact) and the memory's device. The
// memory must stay valid until the cache is closed.
func WrapKVCache(be *Backend, desc CacheDesc, kLayers, vLayers []unsafe.Pointer, strides [3]int64, device Device) (*KVCache, error) {
	noV := desc.Latent() && len(vLayers) == 0
	if len(kLayers) != desc.NumLayers || (len(vLayers) != desc.NumLayers && !noV) {
		return nil, goError(InvalidArgument, "%d K and %d V layer pointers for %d layers", len(kLayers), len(vLayers), desc.NumLayers)
	}
	k := make([]uintptr, len(kLayers))
	v := make([]uintptr, len(vLayers))
	for i := range kLayers {
		k[i] = uintptr(kLayers[i])
	}
	for i := range vLayers {
		v[i] = uintptr(vLayers[i])
	}
	bp, err := be.handle().acquire()
	if err != nil {
		return nil, err
	}
	defer be.h.release()
	p, err := cCacheWrap(bp, desc, k, v, strides, device)
	if err != nil {
		return nil, err
	}
	return newCache(p, be), nil
}

// Close destroys the cache (freeing library-owned memory). Batches planned against it stay
// valid. Closing twice returns an error.
func (c *KVCache) Close() error {
	if c == nil {
		return goError(NullPointer, "nil kv cache")
	}
	runtime.SetFinalizer(c, nil)
	return c.h.close(cCacheDestroy)
}

func (c *KVCache) handle() *handle {
	if c == nil {
		return nil
	}
	return &c.h
}

// Desc returns the cache's geometry.
func (c *KVCache) Desc() (CacheDesc, error) {
	p, err := c.handle().acquire()
	if err != nil {
		return CacheDesc{}, err
	}
	defer c.h.release()
	return cCacheDesc(p)
}

// Layer returns layer's K and V base addresses and strides, to hand the memory to other code.
func (c *KVCache) Layer(layer int) (LayerMemory, error) {
	p, err := c.handle().acquire()
	if err != nil {
		return LayerMemory{}, err
	}
	defer c.h.release()
	return cCacheLayer(p, layer)
}

// Write stores key[t], value[t] ([T, Hkv, D]) at slots[t] (1-D int32/int64; -1 = padding) of
// layer. The scales apply to fp8 caches. A host slot mapping is checked before anything is
// written.
func (c *KVCache) Write(layer int, key, value, slots *Tensor, kScale, vScale float32, opts ...CallOption) error {
	if key == nil || value == nil || slots == nil {
		return goError(NullPointer, "key, value and slots are required")
	}
	if err := checkTensors(key, value, slots); err != nil {
		return err
	}
	p, err := c.handle().acquire()
	if err != nil {
		return err
	}
	defer c.h.release()
	err = cCacheWrite(p, layer, key, value, slots, kScale, vScale, configure(opts).stream)
	keepAlive(key, value, slots)
	return err
}

// WriteScaled is Write with per-KV-head scales (fp8 checkpoints quantised per head): on an fp8
// cache head h of key[t] is stored as fp8(key[t][h] / kHeadScales[h]), and likewise for values;
// other caches ignore the scales. Each is a float32 [NumKVHeads] tensor, or nil for scale 1. A
// scale in host memory that is not finite and > 0 is refused (InvalidArgument) before anything
// is written.
func (c *KVCache) WriteScaled(layer int, key, value, slots, kHeadScales, vHeadScales *Tensor, opts ...CallOption) error {
	if key == nil || value == nil || slots == nil {
		return goError(NullPointer, "key, value and slots are required")
	}
	if err := checkTensors(key, value, slots, kHeadScales, vHeadScales); err != nil {
		return err
	}
	p, err := c.handle().acquire()
	if err != nil {
		return err
	}
	defer c.h.release()
	err = cCacheWriteScaled(p, layer, key, value, slots, kHeadScales, vHeadScales, configure(opts).stream)
	keepAlive(key, value, slots, kHeadScales, vHeadScales)
	return err
}

// WriteLatent is reshape-and-cache for a latent (MLA) cache (vLLM's concat_and_cache_mla): it
// stores the row [kvC[t], kPE[t]] at slots[t] (1-D int32/int64; -1 = padding) of layer. kvC is
// [T, R] (the kv_lora_rank values) and kPE [T, D-R] (the rotary key), each 2-D or 3-D with a
// middle extent of 1; or kPE is nil and kvC holds whole rows, [T, D]. An fp8 cache stores
// fp8(x / scale); other caches ignore scale. A plain cache is refused (InvalidArgument), as Write
// refuses a latent one; on error nothing is written.
func (c *KVCache) WriteLatent(layer int, kvC, kPE, slots *Tensor, scale float32, opts ...CallOption) error {
	if kvC == nil || slots == nil {
		return goError(NullPointer, "kvC and slots are required")
	}
	if err := checkTensors(kvC, kPE, slots); err != nil {
		return err
	}
	p, err := c.handle().acquire()
	if err != nil {
		return err
	}
	defer c.h.release()
	err = cCacheWriteLatent(p, layer, kvC, kPE, slots, scale, configure(opts).stream)
	keepAlive(kvC, kPE, slots)
	return err
}

// CopyBlocks copies whole blocks (K and V, all layers) within the cache: {src, dst} pairs.
func (c *KVCache) CopyBlocks(pairs [][2]int32, opts ...CallOption) error {
	p, err := c.handle().acquire()
	if err != nil {
		return err
	}
	defer c.h.release()
	err = cCopyBlocks(p, pairs, configure(opts).stream)
	runtime.KeepAlive(pairs)
	return err
}

// SwapBlocksFrom copies whole blocks from src into c: block pair[0] of src to block pair[1] of
// c. Geometries must match (layouts and block counts may differ); the caches may be on
// different devices (host <-> GPU).
func (c *KVCache) SwapBlocksFrom(src *KVCache, pairs [][2]int32, opts ...CallOption) error {
	p, err := c.handle().acquire()
	if err != nil {
		return err
	}
	defer c.h.release()
	sp := p
	if src != c { // one read lock per handle: a recursive RLock can deadlock behind Close
		if sp, err = src.handle().acquire(); err != nil {
			return err
		}
		defer src.h.release()
	}
	err = cSwapBlocks(p, sp, pairs, configure(opts).stream)
	runtime.KeepAlive(pairs)
	return err
}

// ReadBlocksInto exports blocks into buf: for each id, for each layer, the K block then the V
// block, packed in the cache's layout. buf needs len(ids) * BytesPerBlock bytes.
func (c *KVCache) ReadBlocksInto(ids []int32, buf []byte, opts ...CallOption) error {
	p, err := c.handle().acquire()
	if err != nil {
		return err
	}
	defer c.h.release()
	err = cReadBlocks(p, ids, slicePtr(buf), len(buf), configure(opts).stream)
	runtime.KeepAlive(ids)
	runtime.KeepAlive(buf)
	return err
}

// ReadBlocks exports blocks into a new buffer (see ReadBlocksInto).
func (c *KVCache) ReadBlocks(ids []int32, opts ...CallOption) ([]byte, error) {
	d, err := c.Desc()
	if err != nil {
		return nil, err
	}
	per, err := d.BytesPerBlock()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, int(per)*len(ids))
	if err := c.ReadBlocksInto(ids, buf, opts...); err != nil {
		return nil, err
	}
	return buf, nil
}

// LoadBlocks loads blocks from a buffer in ReadBlocks' format (ids unique).
func (c *KVCache) LoadBlocks(ids []int32, buf []byte, opts ...CallOption) error {
	p, err := c.handle().acquire()
	if err != nil {
		return err
	}
	defer c.h.release()
	err = cLoadBlocks(p, ids, slicePtr(buf), len(buf), configure(opts).stream)
	runtime.KeepAlive(ids)
	runtime.KeepAlive(buf)
	return err
}
