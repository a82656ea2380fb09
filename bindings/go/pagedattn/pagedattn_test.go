package pagedattn

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

func cpuBackend(t *testing.T) *Backend {
	t.Helper()
	be, err := NewBackend("cpu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be
}

func smallDesc(layout Layout) CacheDesc {
	return CacheDesc{NumLayers: 2, NumBlocks: 8, BlockSize: 4, NumKVHeads: 2, HeadSize: 8, DType: Float32, Layout: layout}
}

// values returns deterministic floats in [-1, 1).
func values(n int, seed uint64) []float32 {
	s := seed*0x9E3779B97F4A7C15 | 1
	out := make([]float32, n)
	for i := range out {
		s ^= s << 13
		s ^= s >> 7
		s ^= s << 17
		out[i] = float32(s>>40)/float32(1<<24)*2 - 1
	}
	return out
}

// must returns v, panicking (and so failing the test) on an unexpected error.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func wantCode(t *testing.T, err error, code Code) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want %v, got %v", code, err)
	}
	if e.Code != code {
		t.Fatalf("want %v, got %v (%s)", code, e.Code, e.Msg)
	}
	if e.Msg == "" {
		t.Fatalf("%v without a message", code)
	}
	return e
}

func TestVersion(t *testing.T) {
	v := LibraryVersion()
	if v.Major != HeaderVersion.Major {
		t.Fatalf("library %v, headers %v", v, HeaderVersion)
	}
	if LibraryVersionString() != v.String() {
		t.Fatalf("%q vs %v", LibraryVersionString(), v)
	}
}

func TestBackendsAndCapabilities(t *testing.T) {
	list := must(Backends())
	found := false
	for _, b := range list {
		if b.Name == "cpu" {
			found = b.Available && b.Reason == ""
		}
		if !b.Available && b.Reason == "" {
			t.Errorf("%s unavailable without a reason", b.Name)
		}
	}
	if !found {
		t.Fatal("cpu backend not listed as available")
	}
	caps := must(cpuBackend(t).Capabilities())
	if caps.Name != "cpu" || caps.Device.Type != CPU || !caps.SupportsDType(Float32) ||
		!caps.SupportsBlockSize(16) || !caps.SupportsHeadSize(64) || !caps.Features.Has(FeatureLSE) {
		t.Fatalf("capabilities %+v", caps)
	}
}

func TestUnknownBackend(t *testing.T) {
	_, err := NewBackend("no-such-backend")
	e := wantCode(t, err, UnknownBackend)
	if !strings.Contains(e.Msg, "no-such-backend") || !strings.HasPrefix(err.Error(), "PAGEDATTN_ERROR_UNKNOWN_BACKEND: ") {
		t.Fatalf("error %q", err)
	}
	if !errors.Is(err, &Error{Code: UnknownBackend}) {
		t.Fatal("errors.Is by code")
	}
	_, err = NewBackendWithOptions("cpu", BackendOptions{NumThreads: -1})
	wantCode(t, err, InvalidArgument)
}

func TestCloseTwiceAndUseAfterClose(t *testing.T) {
	be := must(NewBackend("cpu"))
	cache := must(NewKVCache(be, smallDesc(NHD)))
	batch := must(NewBatch(be, cache, nil, &BatchDesc{QueryLens: []int32{1}, ContextLens: []int32{0},
		BlockTables: []int32{3}, BlockTableStride: 1}))
	// Out of order: the backend first. The caches and batches keep working (C refcounts it).
	if err := be.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := cache.Desc(); err != nil {
		t.Fatalf("cache after its backend closed: %v", err)
	}
	if _, err := batch.Info(); err != nil {
		t.Fatalf("batch after its backend closed: %v", err)
	}
	wantCode(t, be.Close(), InvalidHandle)
	_, err := be.Capabilities()
	wantCode(t, err, InvalidHandle)
	_, err = NewKVCache(be, smallDesc(NHD))
	wantCode(t, err, InvalidHandle)
	if err := cache.Close(); err != nil {
		t.Fatal(err)
	}
	wantCode(t, cache.Close(), InvalidHandle)
	wantCode(t, cache.CopyBlocks([][2]int32{{0, 1}}), InvalidHandle)
	if _, err := batch.SlotMapping(); err != nil {
		t.Fatalf("batch after its cache closed: %v", err)
	}
	if err := batch.Close(); err != nil {
		t.Fatal(err)
	}
	wantCode(t, batch.Close(), InvalidHandle)
	_, err = batch.Info()
	wantCode(t, err, InvalidHandle)
	var nilBackend *Backend
	wantCode(t, nilBackend.Close(), NullPointer)
	_, err = NewKVCache(nil, smallDesc(NHD))
	wantCode(t, err, NullPointer)
}

func TestFinalizersFreeUnclosedHandles(t *testing.T) {
	for i := 0; i < 50; i++ {
		be := must(NewBackend("cpu"))
		_ = must(NewKVCache(be, smallDesc(HND)))
	}
	runtime.GC()
	runtime.GC()
}

func TestCacheWriteReadCopyLoadSwap(t *testing.T) {
	be := cpuBackend(t)
	d := smallDesc(NHD)
	if got := must(d.BytesPerBlock()); got != 2*2*4*2*8*4 {
		t.Fatalf("bytes per block %d", got)
	}
	cache := must(NewKVCache(be, d))
	defer cache.Close()
	if got := must(cache.Desc()); got != d {
		t.Fatalf("desc %+v", got)
	}
	lm := must(cache.Layer(1))
	if lm.K == 0 || lm.V == 0 || lm.Strides != [3]int64{64, 16, 8} {
		t.Fatalf("layer memory %+v", lm)
	}
	_, err := cache.Layer(2)
	wantCode(t, err, OutOfRange)

	k, v := values(3*16, 1), values(3*16, 2)
	kt := must(NewTensor(k, Float32, 3, 2, 8))
	vt := must(NewTensor(v, Float32, 3, 2, 8))
	if err := cache.Write(1, kt, vt, Int64Tensor([]int64{5, -1, 30}), 1, 1); err != nil {
		t.Fatal(err)
	}
	block := must(cache.ReadBlocks([]int32{1}))
	f := bufFromBytes(block, Float32).f32
	const be1 = 4 * 2 * 8
	for i := 0; i < 16; i++ {
		if f[2*be1+16+i] != k[i] || f[3*be1+16+i] != v[i] {
			t.Fatalf("slot 5 of layer 1 element %d", i)
		}
	}
	all := []int32{0, 1, 2, 3, 4, 5, 6, 7}
	before := must(cache.ReadBlocks(all))
	wantCode(t, cache.Write(0, kt, vt, Int32Tensor([]int32{0, 1, 32}), 1, 1), OutOfRange)
	if string(must(cache.ReadBlocks(all))) != string(before) {
		t.Fatal("refused write changed the cache")
	}
	if err := cache.CopyBlocks([][2]int32{{7, 3}}); err != nil {
		t.Fatal(err)
	}
	if string(must(cache.ReadBlocks([]int32{3}))) != string(must(cache.ReadBlocks([]int32{7}))) {
		t.Fatal("copy_blocks")
	}
	wantCode(t, cache.CopyBlocks([][2]int32{{0, 5}, {1, 5}}), InvalidArgument)
	wantCode(t, cache.CopyBlocks([][2]int32{{0, 8}}), OutOfRange)

	exported := must(cache.ReadBlocks([]int32{1}))
	other := must(NewKVCache(be, d))
	defer other.Close()
	if err := other.LoadBlocks([]int32{0}, exported); err != nil {
		t.Fatal(err)
	}
	wantCode(t, other.LoadBlocks([]int32{0}, exported[1:]), InvalidArgument)
	hd := d
	hd.Layout, hd.NumBlocks = HND, 2
	hnd := must(NewKVCache(be, hd))
	defer hnd.Close()
	if err := hnd.SwapBlocksFrom(other, [][2]int32{{0, 1}}); err != nil {
		t.Fatal(err)
	}
	back := must(NewKVCache(be, d))
	defer back.Close()
	if err := back.SwapBlocksFrom(hnd, [][2]int32{{1, 6}}); err != nil {
		t.Fatal(err)
	}
	if string(must(back.ReadBlocks([]int32{6}))) != string(exported) {
		t.Fatal("load/swap round trip")
	}
}

func TestWrapKVCacheOverForeignMemory(t *testing.T) {
	be := cpuBackend(t)
	d := smallDesc(NHD)
	d.NumLayers = 1
	n := d.NumBlocks * d.BlockSize * d.NumKVHeads * d.HeadSize * 4
	// Memory the Go runtime does not manage, as cgo's rules require for memory C keeps.
	km := must(syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE))
	vm := must(syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE))
	defer syscall.Munmap(km)
	defer syscall.Munmap(vm)
	cache := must(WrapKVCache(be, d, []unsafe.Pointer{unsafe.Pointer(&km[0])}, []unsafe.Pointer{unsafe.Pointer(&vm[0])}, [3]int64{}, HostDevice))
	k := values(16, 3)
	kt := must(NewTensor(k, Float32, 1, 2, 8))
	if err := cache.Write(0, kt, kt, Int64Tensor([]int64{9}), 1, 1); err != nil {
		t.Fatal(err)
	}
	if err := cache.Close(); err != nil {
		t.Fatal(err)
	}
	got := unsafe.Slice((*float32)(unsafe.Pointer(&km[9*16*4])), 16)
	for i := range k {
		if got[i] != k[i] {
			t.Fatalf("wrapped memory element %d", i)
		}
	}
	_, err := WrapKVCache(be, d, nil, nil, [3]int64{}, HostDevice)
	wantCode(t, err, InvalidArgument)
}

func TestBatchPlanUpdateCapacity(t *testing.T) {
	be := cpuBackend(t)
	cache := must(NewKVCache(be, smallDesc(NHD)))
	defer cache.Close()
	tables := []int32{3, 5, 0, 6, 1, 2}
	batch := must(NewBatch(be, cache, nil, &BatchDesc{QueryLens: []int32{1, 3}, ContextLens: []int32{6, 2},
		BlockTables: tables, BlockTableStride: 3, MaxNumSeqs: 4, MaxNumTokens: 8, MaxBlocksPerSeq: 3}))
	defer batch.Close()
	info := must(batch.Info())
	if info.NumSeqs != 2 || info.NumTokens != 4 || info.NumDecodeSeqs != 1 || info.NumPrefillSeqs != 1 ||
		info.MaxQueryLen != 3 || info.MaxSeqLen != 7 || info.BlockSize != 4 {
		t.Fatalf("info %+v", info)
	}
	if s := must(batch.SlotMapping()); len(s) != 4 || s[0] != 22 || s[1] != 26 || s[2] != 27 || s[3] != 4 {
		t.Fatalf("slot mapping %v", s)
	}
	if q := must(batch.QueryStart()); len(q) != 3 || q[0] != 0 || q[1] != 1 || q[2] != 4 {
		t.Fatalf("query start %v", q)
	}
	if x := must(batch.CrossSlotMapping()); len(x) != 0 {
		t.Fatalf("cross slot mapping %v", x)
	}
	if err := batch.Update(&BatchDesc{QueryLens: []int32{1}, ContextLens: []int32{0}, BlockTables: []int32{7}, BlockTableStride: 1}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, batch.Update(&BatchDesc{QueryLens: []int32{9}, ContextLens: []int32{0}, BlockTables: tables, BlockTableStride: 3}), Capacity)
	if s := must(batch.SlotMapping()); len(s) != 1 || s[0] != 28 {
		t.Fatalf("after a failed update %v", s)
	}
	_, err := NewBatch(be, cache, nil, &BatchDesc{QueryLens: []int32{1}, ContextLens: []int32{0}, BlockTables: []int32{8}, BlockTableStride: 1})
	wantCode(t, err, OutOfRange)
	_, err = NewBatch(be, cache, nil, &BatchDesc{QueryLens: []int32{1}, ContextLens: []int32{4}, BlockTables: []int32{0}, BlockTableStride: 1})
	wantCode(t, err, OutOfRange)
	_, err = NewBatch(be, cache, nil, &BatchDesc{QueryLens: []int32{1, 1}, ContextLens: []int32{0}})
	if e := wantCode(t, err, InvalidArgument); !strings.Contains(e.Msg, "(Go)") {
		t.Fatalf("binding check message %q", e.Msg)
	}
}

func TestForwardReferenceAndMerge(t *testing.T) {
	be := cpuBackend(t)
	const h, hkv, dd, ctx, row = 4, 2, 8, 6, 2 * 8
	d := smallDesc(HND)
	d.NumLayers = 1
	cache := must(NewKVCache(be, d))
	defer cache.Close()
	tables := []int32{5, 2}
	keys, vals := values((ctx+1)*row, 10), values((ctx+1)*row, 11)
	slots := make([]int64, ctx)
	for p := range slots {
		slots[p] = int64(tables[p/4])*4 + int64(p%4)
	}
	if err := cache.Write(0, Float32Tensor(keys[:ctx*row], ctx, hkv, dd),
		Float32Tensor(vals[:ctx*row], ctx, hkv, dd), Int64Tensor(slots), 1, 1); err != nil {
		t.Fatal(err)
	}
	batch := must(NewBatch(be, cache, nil, &BatchDesc{QueryLens: []int32{1}, ContextLens: []int32{ctx}, BlockTables: tables, BlockTableStride: 2}))
	defer batch.Close()
	q := values(h*dd, 12)
	out := make([]float32, h*dd)
	lse := make([]float32, h)
	opts := NewAttentionOptions(h, hkv, dd)
	qt := Float32Tensor(q, 1, h, dd)
	if err := be.Forward(ForwardArgs{Batch: batch, Cache: cache, Options: &opts, Q: qt,
		K: Float32Tensor(keys[ctx*row:], 1, hkv, dd), V: Float32Tensor(vals[ctx*row:], 1, hkv, dd),
		Out: Float32Tensor(out, 1, h, dd), LSE: Float32Tensor(lse, 1, h)}); err != nil {
		t.Fatal(err)
	}
	scale := 1 / math.Sqrt(dd)
	for hh := 0; hh < h; hh++ {
		kh := hh / (h / hkv)
		s := make([]float64, ctx+1)
		m := math.Inf(-1)
		for p := range s {
			for i := 0; i < dd; i++ {
				s[p] += float64(q[hh*dd+i]) * float64(keys[p*row+kh*dd+i])
			}
			s[p] *= scale
			m = math.Max(m, s[p])
		}
		sum := 0.0
		for _, x := range s {
			sum += math.Exp(x - m)
		}
		if math.Abs(float64(lse[hh])-(m+math.Log(sum))) > 1e-5 {
			t.Fatalf("lse head %d", hh)
		}
		for i := 0; i < dd; i++ {
			r := 0.0
			for p := range s {
				r += math.Exp(s[p]-m) / sum * float64(vals[p*row+kh*dd+i])
			}
			if math.Abs(float64(out[hh*dd+i])-r) > 1e-5 {
				t.Fatalf("out head %d dim %d: %v vs %v", hh, i, out[hh*dd+i], r)
			}
		}
	}
	// Refused forward leaves out untouched.
	out2 := make([]float32, h*dd)
	for i := range out2 {
		out2[i] = float32(math.NaN())
	}
	bad := NewAttentionOptions(h, 3, dd)
	wantCode(t, be.Forward(ForwardArgs{Batch: batch, Cache: cache, Options: &bad, Q: qt, Out: Float32Tensor(out2, 1, h, dd)}),
		InvalidArgument)
	for _, x := range out2 {
		if !math.IsNaN(float64(x)) {
			t.Fatal("refused forward wrote out")
		}
	}
	// Merging a state with itself adds ln 2 to lse.
	merged := make([]float32, h*dd)
	mlse := make([]float32, h)
	ot, lt := must(NewTensor(out, Float32, 1, h, dd)), must(NewTensor(lse, Float32, 1, h))
	if err := be.MergeStates(must(NewTensor(merged, Float32, 1, h, dd)), must(NewTensor(mlse, Float32, 1, h)), ot, lt, ot, lt); err != nil {
		t.Fatal(err)
	}
	for i := range merged {
		if math.Abs(float64(merged[i]-out[i])) > 1e-6 {
			t.Fatal("merged out")
		}
	}
	for i := range mlse {
		if math.Abs(float64(mlse[i]-lse[i])-math.Ln2) > 1e-5 {
			t.Fatal("merged lse")
		}
	}
}

func TestTensorChecks(t *testing.T) {
	data := make([]float32, 10)
	_, err := NewTensor(data, Float32, 3, 3)
	wantCode(t, err, BadTensor)
	_, err = NewTensor(data, Float16, 10)
	wantCode(t, err, BadTensor)
	if _, err := NewStridedTensor(data, Float32, []int{2, 3}, []int{4, 1}); err != nil {
		t.Fatal(err)
	}
	_, err = NewStridedTensor(data, Float32, []int{2, 3}, []int{8, 1})
	wantCode(t, err, BadTensor)
	h := must(NewTensor(make([]uint16, 6), BFloat16, 2, 3))
	if h.DType() != DLBFloat16 {
		t.Fatalf("dtype %+v", h.DType())
	}
	for _, dt := range []DType{Float32, Float16, BFloat16, FP8E4M3, FP8E5M2} {
		dl := must(dt.DLPack())
		if back := must(DTypeFromDLPack(dl)); back != dt {
			t.Fatalf("%v round trip", dt)
		}
	}
	_, err = DTypeFromDLPack(DLInt32)
	wantCode(t, err, Unsupported)
}

// Goroutines move between threads: each error must carry its own call's message.
func TestErrorsFromManyGoroutines(t *testing.T) {
	be := cpuBackend(t)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			cache, err := NewKVCache(be, smallDesc(NHD))
			if err != nil {
				t.Error(err)
				return
			}
			defer cache.Close()
			for i := 0; i < 50; i++ {
				bad := int32(100 + g)
				err := cache.CopyBlocks([][2]int32{{0, bad}})
				var e *Error
				if !errors.As(err, &e) || e.Code != OutOfRange || !strings.Contains(e.Msg, fmt.Sprintf("= %d ", bad)) {
					t.Errorf("goroutine %d: %v", g, err)
					return
				}
				if _, err := cache.Desc(); err != nil {
					t.Error(err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
}

// smallDecode is the smallest forward of these tests: one decode token (q of 4 heads x 8, k/v
// of 2) at context 0 in block 3 of a smallDesc(NHD) cache, out filled with NaN. The cache and
// the batch close when the test ends.
type smallDecode struct {
	be         *Backend
	cache      *KVCache
	batch      *Batch
	opts       AttentionOptions
	q, kv, out []float32
}

func newSmallDecode(t *testing.T, seed uint64) *smallDecode {
	t.Helper()
	s := &smallDecode{be: cpuBackend(t)}
	s.cache = must(NewKVCache(s.be, smallDesc(NHD)))
	t.Cleanup(func() { s.cache.Close() })
	s.batch = must(NewBatch(s.be, s.cache, nil, &BatchDesc{QueryLens: []int32{1},
		ContextLens: []int32{0}, BlockTables: []int32{3}, BlockTableStride: 1}))
	t.Cleanup(func() { s.batch.Close() })
	s.q, s.kv = values(4*8, seed), values(2*8, seed+1)
	s.out = make([]float32, 4*8)
	for i := range s.out {
		s.out[i] = float32(math.NaN())
	}
	s.opts = NewAttentionOptions(4, 2, 8)
	return s
}

// args are the forward's arguments over s's tensors.
func (s *smallDecode) args() ForwardArgs {
	return ForwardArgs{Batch: s.batch, Cache: s.cache, Options: &s.opts,
		Q: Float32Tensor(s.q, 1, 4, 8), K: Float32Tensor(s.kv, 1, 2, 8),
		V: Float32Tensor(s.kv, 1, 2, 8), Out: Float32Tensor(s.out, 1, 4, 8)}
}

func TestDeferredTensorErrors(t *testing.T) {
	s := newSmallDecode(t, 40)
	be, cache, batch, q, kv, out := s.be, s.cache, s.batch, s.q, s.kv, s.out
	good := s.args()
	for _, tt := range good.tensors() {
		if err := tt.Err(); err != nil {
			t.Fatal(err)
		}
	}

	// A shape that does not match its slice: the constructor keeps the error, the call returns it
	// and writes nothing (cache and out untouched).
	before := must(cache.ReadBlocks([]int32{3}))
	bad := Float32Tensor(kv, 2, 2, 8)
	e := wantCode(t, bad.Err(), BadTensor)
	if !strings.Contains(e.Msg, "does not match shape") {
		t.Fatalf("message %q", e.Msg)
	}
	args := good
	args.K = bad
	if err := be.Forward(args); err != bad.Err() {
		t.Fatalf("Forward returned %v, want the tensor's own error", err)
	}
	wantCode(t, cache.Write(0, bad, bad, Int64Tensor([]int64{12, 13}), 1, 1), BadTensor)
	wantCode(t, be.MergeStates(Float32Tensor(out, 1, 4, 8), nil, Float32Tensor(q, 1, 4, 8),
		Float32Tensor(make([]float32, 4), 1, 4), Float32Tensor(q, 2, 4, 8), Float32Tensor(make([]float32, 4), 1, 4)), BadTensor)
	wantCode(t, HostTensor(kv, BFloat16, 1, 2, 8).Err(), BadTensor) // float32 slice, bfloat16 dtype
	for _, x := range out {
		if !math.IsNaN(float64(x)) {
			t.Fatal("a refused call wrote out")
		}
	}
	if after := must(cache.ReadBlocks([]int32{3})); string(after) != string(before) {
		t.Fatal("a refused call wrote the cache")
	}

	// The 16-bit constructors pick the dtype; a valid tensor's Err is nil.
	bits := make([]uint16, 2*8)
	if bt := BFloat16Tensor(bits, 1, 2, 8); bt.Err() != nil || bt.DType() != DLBFloat16 {
		t.Fatalf("bfloat16: %v %+v", bt.Err(), bt.DType())
	}
	if ht := Float16Tensor(bits, 1, 2, 8); ht.Err() != nil || ht.DType() != DLFloat16 {
		t.Fatalf("float16: %v %+v", ht.Err(), ht.DType())
	}
	// Required arguments.
	wantCode(t, be.Forward(ForwardArgs{Batch: batch, Cache: cache, Q: good.Q, Out: good.Out}), NullPointer)
	if err := be.Forward(good); err != nil {
		t.Fatal(err)
	}
}

// tensors lists the arguments' tensors.
func (a ForwardArgs) tensors() []*Tensor { return []*Tensor{a.Q, a.K, a.V, a.Out} }

func TestIntsThatDoNotFitInt32AreRefused(t *testing.T) {
	// C takes int32: a Go int beyond it must fail with Overflow naming the field, never reach
	// the library as another number (a layer of 1<<32 would run as layer 0).
	s := newSmallDecode(t, 50)
	be, cache, kv, opts := s.be, s.cache, s.kv, s.opts
	args := s.args()
	before := must(cache.ReadBlocks([]int32{3}))
	args.Layer = 1 << 32
	if e := wantCode(t, be.Forward(args), Overflow); !strings.Contains(e.Msg, "layer = 4294967296") {
		t.Fatalf("message %q", e.Msg)
	}
	wide := opts
	wide.NumHeads = 1<<32 + 4
	args.Layer, args.Options = 0, &wide
	wantCode(t, be.Forward(args), Overflow)
	wantCode(t, cache.Write(1<<32, Float32Tensor(kv, 1, 2, 8), Float32Tensor(kv, 1, 2, 8),
		Int64Tensor([]int64{12}), 1, 1), Overflow)
	if after := must(cache.ReadBlocks([]int32{3})); string(after) != string(before) {
		t.Fatal("a refused call changed the cache")
	}
	d := smallDesc(NHD)
	d.NumBlocks = 1<<32 + 8
	if _, err := NewKVCache(be, d); err == nil {
		t.Fatal("NumBlocks 1<<32+8 made a cache")
	} else if e := wantCode(t, err, Overflow); !strings.Contains(e.Msg, "NumBlocks") {
		t.Fatalf("message %q", e.Msg)
	}
	if _, err := NewBatch(be, cache, nil, &BatchDesc{QueryLens: []int32{1}, ContextLens: []int32{0},
		BlockTables: []int32{3}, BlockTableStride: 1, MaxNumSeqs: 1 << 32}); err == nil {
		t.Fatal("MaxNumSeqs 1<<32 made a batch")
	} else if e := wantCode(t, err, Overflow); !strings.Contains(e.Msg, "MaxNumSeqs") {
		t.Fatalf("message %q", e.Msg)
	}
	if _, err := NewBackendWithOptions("cpu", BackendOptions{NumThreads: 1<<32 + 1}); err == nil {
		t.Fatal("NumThreads 1<<32+1 made a backend")
	} else {
		wantCode(t, err, Overflow)
	}
}

func TestCapabilitiesNameTargetAndSettings(t *testing.T) {
	caps := must(cpuBackend(t).Capabilities())
	if caps.Target == "" || caps.Settings == "" {
		t.Fatalf("target %q, settings %q", caps.Target, caps.Settings)
	}
	// The CPU backend's line names its target and every variable it read.
	if !strings.Contains(caps.Settings, caps.Target) || !strings.Contains(caps.Settings, "PAGEDATTN_CPU_SPIN_US") ||
		strings.Contains(caps.Settings, "\n") {
		t.Fatalf("settings %q (target %q)", caps.Settings, caps.Target)
	}
}

func TestMemoryUsageCountsCachesAndBatches(t *testing.T) {
	const limit = 1 << 30
	be := must(NewBackendWithOptions("cpu", BackendOptions{MemoryLimit: limit}))
	empty := MemoryUsage{MemoryLimit: limit}
	if u := must(be.MemoryUsage()); u != empty {
		t.Fatalf("new backend %+v", u)
	}
	d := smallDesc(NHD)
	cacheBytes := must(d.BytesPerBlock()) * uint64(d.NumBlocks)
	cache := must(NewKVCache(be, d))
	withCache := MemoryUsage{BytesInUse: cacheBytes, MemoryLimit: limit, NumCaches: 1}
	if u := must(be.MemoryUsage()); u != withCache {
		t.Fatalf("with a cache %+v, want %+v", u, withCache)
	}
	batch := must(NewBatch(be, cache, nil, &BatchDesc{QueryLens: []int32{3, 1}, ContextLens: []int32{0, 5},
		BlockTables: []int32{0, 1, 2, 3}, BlockTableStride: 2}))
	info := must(batch.Info())
	// Default capacities: the table width passed, and what it addresses (2 blocks of 4).
	if info.MaxBlocksPerSeq != 2 || info.MaxSeqLenCapacity != 8 || info.MaxNumEncoderTokens != 0 {
		t.Fatalf("batch capacities %+v", info)
	}
	if info.HostBytes == 0 || info.WorkspaceBytes == 0 {
		t.Fatalf("batch info %+v", info)
	}
	withBatch := MemoryUsage{BytesInUse: cacheBytes + info.HostBytes + info.WorkspaceBytes, MemoryLimit: limit,
		NumCaches: 1, NumBatches: 1}
	if u := must(be.MemoryUsage()); u != withBatch {
		t.Fatalf("with a batch %+v, want %+v", u, withBatch)
	}
	// The sizes follow the capacities, so a smaller step keeps them.
	if err := batch.Update(&BatchDesc{QueryLens: []int32{1}, ContextLens: []int32{2}, BlockTables: []int32{4, 0},
		BlockTableStride: 2}); err != nil {
		t.Fatal(err)
	}
	if after := must(batch.Info()); after.HostBytes != info.HostBytes || after.WorkspaceBytes != info.WorkspaceBytes {
		t.Fatalf("after update %+v, before %+v", after, info)
	}
	must(0, batch.Close())
	if u := must(be.MemoryUsage()); u != withCache {
		t.Fatalf("batch closed %+v, want %+v", u, withCache)
	}
	must(0, cache.Close())
	if u := must(be.MemoryUsage()); u != empty {
		t.Fatalf("all closed %+v", u)
	}
	must(0, be.Close())
	_, err := be.MemoryUsage()
	wantCode(t, err, InvalidHandle)
}

// logRecorder collects messages from the log callback (which may run on any goroutine).
type logRecorder struct {
	mu   sync.Mutex
	msgs []string // "LEVEL: message"
}

func (r *logRecorder) record(level LogLevel, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, level.String()+": "+msg)
}

func (r *logRecorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs...)
}

func (r *logRecorder) has(prefix, part string) bool {
	for _, m := range r.snapshot() {
		if strings.HasPrefix(m, prefix) && strings.Contains(m, part) {
			return true
		}
	}
	return false
}

func TestLogCallback(t *testing.T) {
	t.Cleanup(func() { _ = SetLogCallback(nil, LogError) })
	var rec logRecorder
	must(0, SetLogCallback(rec.record, LogInfo))

	_, err := NewBackend("no-such-backend")
	e := wantCode(t, err, UnknownBackend)
	be := cpuBackend(t)
	caps := must(be.Capabilities())
	cache := must(NewKVCache(be, smallDesc(NHD))) // DEBUG: below the level set
	if !rec.has("ERROR: PAGEDATTN_ERROR_UNKNOWN_BACKEND: "+e.Msg, "") {
		t.Fatalf("no ERROR line for the failed call in %q", rec.snapshot())
	}
	if !rec.has("INFO: cpu: backend created", caps.Settings) {
		t.Fatalf("no INFO line for the backend in %q", rec.snapshot())
	}
	if rec.has("DEBUG", "") {
		t.Fatalf("DEBUG lines at level INFO: %q", rec.snapshot())
	}

	// Bad levels are refused and keep the callback; 1<<32+1 would reach C as LogInfo.
	wantCode(t, SetLogCallback(rec.record, LogLevel(3)), InvalidArgument)
	wantCode(t, SetLogCallback(rec.record, LogLevel(1<<32+1)), Overflow)
	_, err = NewBackend("still-logged")
	wantCode(t, err, UnknownBackend)
	if !rec.has("ERROR", "still-logged") {
		t.Fatalf("callback lost after a refused level: %q", rec.snapshot())
	}

	// At DEBUG the cache's sizes come too.
	var debug logRecorder
	must(0, SetLogCallback(debug.record, LogDebug))
	must(0, cache.Close())
	if !debug.has("DEBUG", "cache destroyed") {
		t.Fatalf("no DEBUG line for the cache in %q", debug.snapshot())
	}

	// Replacing the callback from inside it is refused (without deadlock); a panic in it is
	// recovered, and the call being logged reports its own error as usual.
	inner := make(chan error, 16)
	must(0, SetLogCallback(func(LogLevel, string) {
		select {
		case inner <- SetLogCallback(nil, LogError):
		default:
		}
		panic("a panic in the log callback (expected by the test)")
	}, LogError))
	_, err = NewBackend("no-such-backend")
	wantCode(t, err, UnknownBackend)
	select {
	case err := <-inner:
		wantCode(t, err, InvalidArgument)
	default:
		t.Fatal("the callback did not run")
	}

	// Removed: nothing more arrives.
	must(0, SetLogCallback(nil, LogError))
	n, m := len(rec.snapshot()), len(debug.snapshot())
	_, _ = NewBackend("no-such-backend")
	must(0, must(NewKVCache(be, smallDesc(NHD))).Close())
	if len(rec.snapshot()) != n || len(debug.snapshot()) != m || len(inner) != 0 {
		t.Fatal("a removed callback was called")
	}
	if LogInfo.String() != "INFO" || LogLevel(7).String() != "LogLevel(7)" {
		t.Fatal("LogLevel.String")
	}
}

func TestLogCallbackReplacedWhileGoroutinesLog(t *testing.T) {
	// Once SetLogCallback returns, the func it replaced is never called again: each func checks
	// that it is still allowed, and is disallowed right after its replacement is set.
	t.Cleanup(func() { _ = SetLogCallback(nil, LogError) })
	const funcs = 40
	var allowed [funcs]bool // guarded by mu
	var calls [funcs]int    // guarded by mu
	var mu sync.Mutex
	var violations []int
	sink := func(i int) func(LogLevel, string) {
		return func(LogLevel, string) {
			mu.Lock()
			defer mu.Unlock()
			calls[i]++
			if !allowed[i] {
				violations = append(violations, i)
			}
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, _ = NewBackend("no-such-backend")
			}
		}()
	}
	prev := -1
	for i := 0; i < funcs; i++ {
		mu.Lock()
		allowed[i] = true
		mu.Unlock()
		if err := SetLogCallback(sink(i), LogError); err != nil {
			t.Error(err)
		}
		if prev >= 0 {
			mu.Lock()
			allowed[prev] = false
			mu.Unlock()
		}
		prev = i
		// Replace each func only once it has run, so that replacements meet calls in flight.
		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			ran := calls[i] > 0
			mu.Unlock()
			if ran {
				break
			}
			if time.Now().After(deadline) {
				close(stop)
				wg.Wait()
				t.Fatalf("func %d never ran", i)
			}
			runtime.Gosched()
		}
	}
	must(0, SetLogCallback(nil, LogError))
	mu.Lock()
	allowed[prev] = false
	mu.Unlock()
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(violations) != 0 {
		t.Fatalf("replaced funcs called afterwards: %v", violations)
	}
}
