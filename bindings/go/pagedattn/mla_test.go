package pagedattn

// Multi-head latent attention (MLA, docs/semantics.md section 8): latent caches, WriteLatent and
// ForwardMLA against a float64 reference, the refusals between plain and latent caches, and the
// feature bit and capabilities field that announce them.

import (
	"fmt"
	"math"
	"syscall"
	"testing"
	"unsafe"
)

// DeepSeek V3's shape: 16 heads (one tensor-parallel shard), rows of 512 + 64.
const mlaH, mlaD, mlaR = 16, 576, 512

// mlaData is host data of one dtype (Float32 or BFloat16) with its tensor.
type mlaData struct {
	f32  []float32
	bf16 []uint16
}

func newMLAData(dt DType, x []float32) *mlaData {
	if dt == BFloat16 {
		return &mlaData{bf16: ToBFloat16(x)}
	}
	return &mlaData{f32: append([]float32(nil), x...)}
}

func (d *mlaData) tensor(shape ...int) *Tensor {
	if d.bf16 != nil {
		return BFloat16Tensor(d.bf16, shape...)
	}
	return Float32Tensor(d.f32, shape...)
}

func (d *mlaData) float64s() []float64 {
	src := d.f32
	if d.bf16 != nil {
		src = FromBFloat16(d.bf16)
	}
	out := make([]float64, len(src))
	for i, x := range src {
		out[i] = float64(x)
	}
	return out
}

// mlaRound returns the values dtype dt holds of x.
func mlaRound(dt DType, x []float32) []float32 {
	if dt == BFloat16 {
		return FromBFloat16(ToBFloat16(x))
	}
	return x
}

func mlaTolerance(dt DType) float64 {
	if dt == BFloat16 {
		return 2e-2
	}
	return 1e-5
}

// mlaColumns returns columns [from, to) of a row-major [rows, mlaD] matrix.
func mlaColumns(x []float32, from, to int) []float32 {
	var out []float32
	for r := 0; r+mlaD <= len(x); r += mlaD {
		out = append(out, x[r+from:r+to]...)
	}
	return out
}

// mlaStep holds random latent rows of a few sequences in a latent cache with shuffled block
// tables. The context rows go in through the two-tensor form of WriteLatent (kvC, kPE), the
// step's new rows through the whole-row form (kPE nil), as an engine writes them before the
// forward.
type mlaStep struct {
	dt     DType
	lens   [][2]int // {query, context}
	tables []int32
	stride int
	rows   [][]float32 // per sequence: [context + query][mlaD], the values the cache holds
	q      []float32   // [T][mlaH][mlaD], the values the query tensors hold
	cache  *KVCache
}

func newMLAStep(t *testing.T, be *Backend, dt DType, lens [][2]int, bs int, seed uint64, kPE3D bool) *mlaStep {
	t.Helper()
	s := &mlaStep{dt: dt, lens: lens, stride: 1}
	nb := 3
	for _, l := range lens {
		n := (l[0] + l[1] + bs - 1) / bs
		nb += n
		if n > s.stride {
			s.stride = n
		}
	}
	// A shuffle of the block ids (Fisher-Yates over a xorshift stream).
	ids := make([]int32, nb)
	for i := range ids {
		ids[i] = int32(i)
	}
	r := seed*0x9E3779B97F4A7C15 | 1
	for i := nb - 1; i > 0; i-- {
		r ^= r << 13
		r ^= r >> 7
		r ^= r << 17
		j := int(r % uint64(i+1))
		ids[i], ids[j] = ids[j], ids[i]
	}
	s.tables = make([]int32, len(lens)*s.stride)
	at := 0
	for i, l := range lens {
		n := (l[0] + l[1] + bs - 1) / bs
		copy(s.tables[i*s.stride:], ids[at:at+n])
		at += n
	}
	var err error
	s.cache, err = NewKVCache(be, CacheDesc{NumLayers: 2, NumBlocks: nb, BlockSize: bs, NumKVHeads: 1,
		HeadSize: mlaD, DType: dt, Flags: CacheLatent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.cache.Close() })
	slot := func(i, p int) int64 { return int64(s.tables[i*s.stride+p/bs])*int64(bs) + int64(p%bs) }
	var ctx, fresh []float32
	var ctxSlots []int64
	var freshSlots []int32
	for i, l := range lens {
		rows := mlaRound(dt, values((l[0]+l[1])*mlaD, seed+uint64(i)))
		s.rows = append(s.rows, rows)
		ctx = append(ctx, rows[:l[1]*mlaD]...)
		fresh = append(fresh, rows[l[1]*mlaD:]...)
		for p := 0; p < l[1]+l[0]; p++ {
			if p < l[1] {
				ctxSlots = append(ctxSlots, slot(i, p))
			} else {
				freshSlots = append(freshSlots, int32(slot(i, p)))
			}
		}
	}
	nc, nn := len(ctxSlots), len(freshSlots)
	kpe := newMLAData(dt, mlaColumns(ctx, mlaR, mlaD)).tensor(nc, mlaD-mlaR)
	if kPE3D {
		kpe = newMLAData(dt, mlaColumns(ctx, mlaR, mlaD)).tensor(nc, 1, mlaD-mlaR)
	}
	if err := s.cache.WriteLatent(1, newMLAData(dt, mlaColumns(ctx, 0, mlaR)).tensor(nc, mlaR), kpe,
		Int64Tensor(ctxSlots), 1); err != nil {
		t.Fatal(err)
	}
	if err := s.cache.WriteLatent(1, newMLAData(dt, fresh).tensor(nn, mlaD), nil, Int32Tensor(freshSlots), 1,
		OnStream(nil)); err != nil {
		t.Fatal(err)
	}
	s.q = mlaRound(dt, values(s.tokens()*mlaH*mlaD, seed+100))
	return s
}

func (s *mlaStep) tokens() int {
	n := 0
	for _, l := range s.lens {
		n += l[0]
	}
	return n
}

func (s *mlaStep) batch(t *testing.T, be *Backend) *Batch {
	t.Helper()
	var ql, cl []int32
	for _, l := range s.lens {
		ql = append(ql, int32(l[0]))
		cl = append(cl, int32(l[1]))
	}
	b, err := NewBatch(be, s.cache, nil, &BatchDesc{QueryLens: ql, ContextLens: cl, BlockTables: s.tables,
		BlockTableStride: s.stride})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// qParts splits the query into q_nope [T, H, R] and q_pe [T, H, D-R].
func (s *mlaStep) qParts() (*mlaData, *mlaData) {
	var nope, pe []float32
	for r := 0; r < len(s.q); r += mlaD {
		nope = append(nope, s.q[r:r+mlaR]...)
		pe = append(pe, s.q[r+mlaR:r+mlaD]...)
	}
	return newMLAData(s.dt, nope), newMLAData(s.dt, pe)
}

// reference computes out [T][H][R] and lse [T][H] in float64: each key's row is its key (all D
// values) and its value (the first R).
func (s *mlaStep) reference(scale float64) ([]float64, []float64) {
	if scale == 0 {
		scale = 1 / math.Sqrt(mlaD)
	}
	T := s.tokens()
	out := make([]float64, T*mlaH*mlaR)
	lse := make([]float64, T*mlaH)
	tok := 0
	for i, l := range s.lens {
		rows := s.rows[i]
		for j := 0; j < l[0]; j++ {
			n := l[1] + j + 1
			for h := 0; h < mlaH; h++ {
				q := s.q[(tok*mlaH+h)*mlaD:][:mlaD]
				sc := make([]float64, n)
				m := math.Inf(-1)
				for p := range sc {
					var dot float64
					for e := 0; e < mlaD; e++ {
						dot += float64(q[e]) * float64(rows[p*mlaD+e])
					}
					sc[p] = dot * scale
					m = math.Max(m, sc[p])
				}
				var sum float64
				o := out[(tok*mlaH+h)*mlaR:][:mlaR]
				for p, x := range sc {
					w := math.Exp(x - m)
					sum += w
					for e := range o {
						o[e] += w * float64(rows[p*mlaD+e])
					}
				}
				for e := range o {
					o[e] /= sum
				}
				lse[tok*mlaH+h] = m + math.Log(sum)
			}
			tok++
		}
	}
	return out, lse
}

func mlaRelErr(got, want []float64) float64 {
	var maxRef, maxDiff float64
	for i := range want {
		if math.IsNaN(got[i]) {
			return math.Inf(1)
		}
		maxRef = math.Max(maxRef, math.Abs(want[i]))
		maxDiff = math.Max(maxDiff, math.Abs(got[i]-want[i]))
	}
	return maxDiff / math.Max(maxRef, 1e-30)
}

// run calls ForwardMLA with the query split in two on layer 1; it returns out and lse.
func (s *mlaStep) run(t *testing.T, be *Backend, opts *AttentionOptions) ([]float64, []float32) {
	t.Helper()
	T := s.tokens()
	nope, pe := s.qParts()
	out := newMLAData(s.dt, make([]float32, T*mlaH*mlaR))
	lse := make([]float32, T*mlaH)
	err := be.ForwardMLA(MLAForwardArgs{Batch: s.batch(t, be), Cache: s.cache, Layer: 1, Options: opts,
		QNope: nope.tensor(T, mlaH, mlaR), QPE: pe.tensor(T, mlaH, mlaD-mlaR), Out: out.tensor(T, mlaH, mlaR),
		LSE: Float32Tensor(lse, T, mlaH)})
	if err != nil {
		t.Fatal(err)
	}
	return out.float64s(), lse
}

func TestMLAFeatureBitAndLatentSizes(t *testing.T) {
	caps := must(cpuBackend(t).Capabilities())
	if FeatureMLA != 1<<16 || !caps.Features.Has(FeatureMLA) {
		t.Fatalf("features %#x", caps.Features)
	}
	if !caps.SupportsLatentSize(mlaD) || caps.SupportsLatentSize(mlaD+8) || caps.SupportsLatentSize(0) {
		t.Fatalf("latent sizes %#x", caps.LatentSizes)
	}
}

func TestMLADecodeMatchesReference(t *testing.T) {
	be := cpuBackend(t)
	for _, c := range []struct {
		dt DType
		bs int
	}{{Float32, 16}, {BFloat16, 64}, {BFloat16, 16}, {Float32, 64}} {
		t.Run(fmt.Sprintf("%v/bs%d", c.dt, c.bs), func(t *testing.T) {
			s := newMLAStep(t, be, c.dt, [][2]int{{1, 37}, {1, 5}, {1, 130}, {1, 64}}, c.bs, 60+uint64(c.bs), c.bs == 64)
			opts := NewMLAOptions(mlaH, mlaD)
			out, lse := s.run(t, be, &opts)
			want, wantLSE := s.reference(0)
			if e := mlaRelErr(out, want); e > mlaTolerance(c.dt) {
				t.Fatalf("relative error %g", e)
			}
			for i, w := range wantLSE {
				if math.Abs(float64(lse[i])-w) > 1e-5+math.Max(mlaTolerance(c.dt), 1e-5)*math.Abs(w) {
					t.Fatalf("lse[%d] = %v, want %v", i, lse[i], w)
				}
			}
		})
	}
}

func TestMLAPrefillAndChunkedPrefillMatchReference(t *testing.T) {
	be := cpuBackend(t)
	// A fresh prompt, a decode and a chunk of a prompt with context, in one step.
	for _, dt := range []DType{Float32, BFloat16} {
		s := newMLAStep(t, be, dt, [][2]int{{9, 0}, {1, 40}, {20, 13}}, 16, 70, false)
		opts := NewMLAOptions(mlaH, mlaD)
		opts.Scale = 0.1352
		out, _ := s.run(t, be, &opts)
		want, _ := s.reference(float64(float32(0.1352)))
		if e := mlaRelErr(out, want); e > mlaTolerance(dt) {
			t.Fatalf("%v: relative error %g", dt, e)
		}
	}
}

func TestMLAWholeQueryRows(t *testing.T) {
	be := cpuBackend(t)
	s := newMLAStep(t, be, Float32, [][2]int{{1, 50}, {3, 17}}, 64, 71, false)
	T := s.tokens()
	opts := NewMLAOptions(mlaH, mlaD)
	out := make([]float32, T*mlaH*mlaR)
	batch := s.batch(t, be)
	if err := be.ForwardMLA(MLAForwardArgs{Batch: batch, Cache: s.cache, Layer: 1, Options: &opts,
		QNope: Float32Tensor(s.q, T, mlaH, mlaD), Out: Float32Tensor(out, T, mlaH, mlaR)}); err != nil {
		t.Fatal(err)
	}
	got := make([]float64, len(out))
	for i, x := range out {
		got[i] = float64(x)
	}
	want, _ := s.reference(0)
	if e := mlaRelErr(got, want); e > 1e-5 {
		t.Fatalf("relative error %g", e)
	}
	// Layer 0 holds no rows: the cache is written per layer.
	if err := be.ForwardMLA(MLAForwardArgs{Batch: batch, Cache: s.cache, Options: &opts,
		QNope: Float32Tensor(s.q, T, mlaH, mlaD), Out: Float32Tensor(out, T, mlaH, mlaR)}); err != nil {
		t.Fatal(err)
	}
	for _, x := range out {
		if x != 0 {
			t.Fatalf("layer 0 gave %v", x)
		}
	}
}

func TestMLALatentCacheGeometryAndWrap(t *testing.T) {
	be := cpuBackend(t)
	d := CacheDesc{NumLayers: 3, NumBlocks: 1, BlockSize: 16, NumKVHeads: 1, HeadSize: mlaD, DType: BFloat16,
		Flags: CacheLatent}
	if !d.Latent() || must(d.BytesPerBlock()) != 3*16*mlaD*2 { // one row per slot, no V
		t.Fatalf("latent bytes per block %d", must(d.BytesPerBlock()))
	}
	plain := d
	plain.Flags = 0
	if must(plain.BytesPerBlock()) != 2*3*16*mlaD*2 {
		t.Fatal("plain bytes per block")
	}
	// A wrapped latent cache without V pointers, over memory Go does not manage.
	wd := CacheDesc{NumLayers: 1, NumBlocks: 4, BlockSize: 16, NumKVHeads: 1, HeadSize: mlaD, DType: Float32,
		Flags: CacheLatent}
	mem := must(syscall.Mmap(-1, 0, 4*16*mlaD*4, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE))
	defer syscall.Munmap(mem)
	cache := must(WrapKVCache(be, wd, []unsafe.Pointer{unsafe.Pointer(&mem[0])}, nil, [3]int64{}, HostDevice))
	if !must(cache.Desc()).Latent() {
		t.Fatal("wrapped cache is not latent")
	}
	rows := values(3*mlaD, 72)
	slots := []int64{2*16 + 5, 7, 3 * 16}
	if err := cache.WriteLatent(0, Float32Tensor(mlaColumns(rows, 0, mlaR), 3, mlaR),
		Float32Tensor(mlaColumns(rows, mlaR, mlaD), 3, mlaD-mlaR), Int64Tensor(slots), 1); err != nil {
		t.Fatal(err)
	}
	if err := cache.Close(); err != nil {
		t.Fatal(err)
	}
	got := unsafe.Slice((*float32)(unsafe.Pointer(&mem[0])), 4*16*mlaD)
	for i, slot := range slots {
		for e := 0; e < mlaD; e++ {
			if got[int(slot)*mlaD+e] != rows[i*mlaD+e] {
				t.Fatalf("row %d element %d", i, e)
			}
		}
	}
	// A plain cache still needs its V pointers.
	wd.Flags = 0
	_, err := WrapKVCache(be, wd, []unsafe.Pointer{unsafe.Pointer(&mem[0])}, nil, [3]int64{}, HostDevice)
	wantCode(t, err, InvalidArgument)
}

func TestMLAPlainAndLatentCachesRefuseEachOthersCalls(t *testing.T) {
	be := cpuBackend(t)
	s := newMLAStep(t, be, Float32, [][2]int{{1, 20}}, 16, 73, false)
	q := make([]float32, mlaH*mlaD)
	kv := make([]float32, mlaD)
	// A latent cache in the plain Forward and the plain Write.
	out := make([]float32, mlaH*mlaD)
	for i := range out {
		out[i] = 7
	}
	opts := NewAttentionOptions(mlaH, 1, mlaD)
	opts.WriteKV = false
	err := be.Forward(ForwardArgs{Batch: s.batch(t, be), Cache: s.cache, Layer: 1, Options: &opts,
		Q: Float32Tensor(q, 1, mlaH, mlaD), Out: Float32Tensor(out, 1, mlaH, mlaD)})
	wantCode(t, err, InvalidArgument)
	for _, x := range out {
		if x != 7 {
			t.Fatal("a refused forward wrote out")
		}
	}
	kvT := Float32Tensor(kv, 1, 1, mlaD)
	wantCode(t, s.cache.Write(1, kvT, kvT, Int64Tensor([]int64{0}), 1, 1), InvalidArgument)
	// A plain cache (one KV head of 64, rows that would be 32 + 32) in ForwardMLA and WriteLatent.
	plain := must(NewKVCache(be, CacheDesc{NumLayers: 1, NumBlocks: 4, BlockSize: 16, NumKVHeads: 1, HeadSize: 64,
		DType: Float32}))
	defer plain.Close()
	batch := must(NewBatch(be, plain, nil, &BatchDesc{QueryLens: []int32{1}, ContextLens: []int32{20},
		BlockTables: []int32{2, 0}, BlockTableStride: 2}))
	defer batch.Close()
	half := make([]float32, mlaH*32)
	small := make([]float32, mlaH*32)
	for i := range small {
		half[i], small[i] = 1, 7
	}
	mopts := NewMLAOptions(mlaH, 64)
	err = be.ForwardMLA(MLAForwardArgs{Batch: batch, Cache: plain, Options: &mopts, QNope: Float32Tensor(half, 1, mlaH, 32),
		QPE: Float32Tensor(half, 1, mlaH, 32), Out: Float32Tensor(small, 1, mlaH, 32)})
	wantCode(t, err, InvalidArgument)
	for _, x := range small {
		if x != 7 {
			t.Fatal("a refused MLA forward wrote out")
		}
	}
	row := Float32Tensor(half[:32], 1, 32)
	wantCode(t, plain.WriteLatent(0, row, row, Int64Tensor([]int64{0}), 1), InvalidArgument)
}

func TestMLAArgumentChecks(t *testing.T) {
	be := cpuBackend(t)
	s := newMLAStep(t, be, Float32, [][2]int{{1, 3}}, 16, 74, false)
	rows := make([]float32, 2*mlaD)
	whole := Float32Tensor(rows, 2, mlaD)
	wantCode(t, s.cache.WriteLatent(0, whole, nil, Int64Tensor([]int64{0, 10000}), 1), OutOfRange)
	wantCode(t, s.cache.WriteLatent(1<<32, whole, nil, Int64Tensor([]int64{0, 1}), 1), Overflow)
	wantCode(t, s.cache.WriteLatent(0, nil, nil, Int64Tensor([]int64{0, 1}), 1), NullPointer)
	// A tensor whose shape does not fit its slice is reported before the library is called.
	wantCode(t, s.cache.WriteLatent(0, Float32Tensor(rows, 3, mlaD), nil, Int64Tensor([]int64{0, 1}), 1), BadTensor)
	opts := NewMLAOptions(mlaH, mlaD)
	err := be.ForwardMLA(MLAForwardArgs{Batch: s.batch(t, be), Cache: s.cache, Options: &opts, QNope: whole})
	wantCode(t, err, NullPointer)
	closed := must(NewBackend("cpu"))
	closed.Close()
	out := make([]float32, mlaH*mlaR)
	err = closed.ForwardMLA(MLAForwardArgs{Batch: s.batch(t, be), Cache: s.cache, Options: &opts,
		QNope: Float32Tensor(s.q, 1, mlaH, mlaD), Out: Float32Tensor(out, 1, mlaH, mlaR)})
	wantCode(t, err, InvalidHandle)
}
