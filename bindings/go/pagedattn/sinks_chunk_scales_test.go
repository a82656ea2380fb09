package pagedattn

// Attention sinks, chunked local attention and per-KV-head fp8 scales (the 0.2 options) against a
// float64 reference, their refusals, the feature bits, and batches in the SEQ length form.

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

const (
	scH, scHKV, scD, scBS, scNB = 4, 2, 16, 4, 32
)

// sceneMix is a decode / chunked prefill / idle / prefill mix: {query_len, context_len}.
var sceneMix = [][2]int{{1, 20}, {6, 9}, {0, 3}, {5, 0}, {1, 13}}

// scene holds sequences with every token's K/V, their block tables and the step's q/k/v.
type scene struct {
	lens       [][2]int
	tables     []int32
	stride     int
	keys, vals [][]float32 // per sequence: [context + query][scHKV][scD]
	q, k, v    []float32
}

// exactFP8 returns multiples of 1/8 in [-7/8, 7/8]: x / s is exact in e4m3 and e5m2 for a
// power-of-two s, so an fp8 cache holds x exactly and the reference needs no fp8 rounding.
func exactFP8(n int, seed uint64) []float32 {
	out := values(n, seed)
	for i, x := range out {
		out[i] = float32(math.Max(-7, math.Min(7, math.Round(float64(x)*8)))) / 8
	}
	return out
}

func newScene(lens [][2]int, seed uint64, exact bool) *scene {
	gen := values
	if exact {
		gen = exactFP8
	}
	s := &scene{lens: lens, stride: 1}
	for _, l := range lens {
		if n := (l[0] + l[1] + scBS - 1) / scBS; n > s.stride {
			s.stride = n
		}
	}
	// Blocks handed out in reverse order, so that tables are not the identity.
	next := scNB
	s.tables = make([]int32, len(lens)*s.stride)
	row := scHKV * scD
	for i, l := range lens {
		for b := 0; b < (l[0]+l[1]+scBS-1)/scBS; b++ {
			next--
			s.tables[i*s.stride+b] = int32(next)
		}
		n := (l[0] + l[1]) * row
		s.keys = append(s.keys, gen(n, seed+2*uint64(i)))
		s.vals = append(s.vals, gen(n, seed+2*uint64(i)+1))
		s.k = append(s.k, s.keys[i][l[1]*row:]...)
		s.v = append(s.v, s.vals[i][l[1]*row:]...)
	}
	s.q = values(s.tokens()*scH*scD, seed+100)
	return s
}

func (s *scene) tokens() int {
	t := 0
	for _, l := range s.lens {
		t += l[0]
	}
	return t
}

func (s *scene) slot(seq, pos int) int64 {
	return int64(s.tables[seq*s.stride+pos/scBS])*scBS + int64(pos%scBS)
}

// context returns the contexts' K/V rows and their slots.
func (s *scene) context() (k, v []float32, slots []int64) {
	row := scHKV * scD
	for i, l := range s.lens {
		k = append(k, s.keys[i][:l[1]*row]...)
		v = append(v, s.vals[i][:l[1]*row]...)
		for p := 0; p < l[1]; p++ {
			slots = append(slots, s.slot(i, p))
		}
	}
	return k, v, slots
}

func (s *scene) cache(t *testing.T, be *Backend, dt DType) *KVCache {
	c := must(NewKVCache(be, CacheDesc{NumLayers: 1, NumBlocks: scNB, BlockSize: scBS, NumKVHeads: scHKV, HeadSize: scD, DType: dt}))
	t.Cleanup(func() { c.Close() })
	return c
}

// writeContext stores the contexts with the scalar scales 1.
func (s *scene) writeContext(t *testing.T, c *KVCache) {
	k, v, slots := s.context()
	n := len(slots)
	if err := c.Write(0, Float32Tensor(k, n, scHKV, scD), Float32Tensor(v, n, scHKV, scD), Int64Tensor(slots), 1, 1); err != nil {
		t.Fatal(err)
	}
}

func (s *scene) lensContext() (q, c []int32) {
	for _, l := range s.lens {
		q = append(q, int32(l[0]))
		c = append(c, int32(l[1]))
	}
	return q, c
}

func (s *scene) lensSeq() (seqLens, starts []int32) {
	starts = []int32{0}
	for _, l := range s.lens {
		seqLens = append(seqLens, int32(l[0]+l[1]))
		starts = append(starts, starts[len(starts)-1]+int32(l[0]))
	}
	return seqLens, starts
}

func (s *scene) batch(t *testing.T, be *Backend, c *KVCache) *Batch {
	q, cl := s.lensContext()
	b := must(NewBatch(be, c, nil, &BatchDesc{QueryLens: q, ContextLens: cl, BlockTables: s.tables, BlockTableStride: s.stride}))
	t.Cleanup(func() { b.Close() })
	return b
}

// forward runs one decoder forward with the step's k/v; it returns out and lse.
func (s *scene) forward(be *Backend, b *Batch, c *KVCache, o *AttentionOptions) ([]float32, []float32, error) {
	t := s.tokens()
	out := make([]float32, t*scH*scD)
	lse := make([]float32, t*scH)
	err := be.Forward(ForwardArgs{Batch: b, Cache: c, Options: o, Q: Float32Tensor(s.q, t, scH, scD),
		K: Float32Tensor(s.k, t, scHKV, scD), V: Float32Tensor(s.v, t, scHKV, scD),
		Out: Float32Tensor(out, t, scH, scD), LSE: Float32Tensor(lse, t, scH)})
	return out, lse, err
}

// reference is float64 decoder attention with optional sinks and attention chunk: out and lse.
func (s *scene) reference(sinks []float32, chunk int) ([]float64, []float64) {
	return s.referenceMasked(sinks, chunk, nil)
}

// referenceMasked is reference with tree masks: masks[i] is nil (causal) or sequence i's q x q
// row-major matrix (m[r*q+j]: new token r sees new token j; the context stays visible). masks
// may be nil (no masks).
func (s *scene) referenceMasked(sinks []float32, chunk int, masks [][]bool) ([]float64, []float64) {
	t, row, scale := s.tokens(), scHKV*scD, 1/math.Sqrt(scD)
	out := make([]float64, t*scH*scD)
	lse := make([]float64, t*scH)
	r := 0
	for i, l := range s.lens {
		for j := 0; j < l[0]; j++ {
			p := l[1] + j
			var pos []int
			for k := 0; k <= p; k++ {
				if chunk > 0 && k/chunk != p/chunk {
					continue
				}
				if masks != nil && masks[i] != nil && k >= l[1] && !masks[i][j*l[0]+k-l[1]] {
					continue
				}
				pos = append(pos, k)
			}
			for h := 0; h < scH; h++ {
				kh := h / (scH / scHKV)
				sc := make([]float64, len(pos))
				m := math.Inf(-1)
				if sinks != nil {
					m = float64(sinks[h])
				}
				sink := m
				for n, k := range pos {
					dot := 0.0
					for e := 0; e < scD; e++ {
						dot += float64(s.q[(r*scH+h)*scD+e]) * float64(s.keys[i][k*row+kh*scD+e])
					}
					sc[n] = dot * scale
					m = math.Max(m, sc[n])
				}
				total := math.Exp(sink - m)
				for n := range sc {
					sc[n] = math.Exp(sc[n] - m)
					total += sc[n]
				}
				for e := 0; e < scD; e++ {
					acc := 0.0
					for n, k := range pos {
						acc += sc[n] * float64(s.vals[i][k*row+kh*scD+e])
					}
					out[(r*scH+h)*scD+e] = acc / total
				}
				lse[r*scH+h] = m + math.Log(total)
			}
			r++
		}
	}
	return out, lse
}

// relErr is max|got - want| / max|want|.
func relErr(got []float32, want []float64) float64 {
	worst, top := 0.0, 1e-30
	for i, w := range want {
		worst = math.Max(worst, math.Abs(float64(got[i])-w))
		top = math.Max(top, math.Abs(w))
	}
	return worst / top
}

func maxAbsDiff(got []float32, want []float64) float64 {
	worst := 0.0
	for i, w := range want {
		worst = math.Max(worst, math.Abs(float64(got[i])-w))
	}
	return worst
}

func TestCapabilitiesAnnounceTheNewOptions(t *testing.T) {
	caps := must(cpuBackend(t).Capabilities())
	for _, f := range []Features{FeatureSinks, FeatureChunkedLocal, FeatureHeadScales} {
		if !caps.Features.Has(f) {
			t.Errorf("feature %#x missing", f)
		}
	}
	if FeatureSinks != 1<<12 || FeatureChunkedLocal != 1<<13 || FeatureHeadScales != 1<<14 {
		t.Fatal("feature bits differ from backend.h")
	}
}

func TestSinksAndAttentionChunkMatchTheReference(t *testing.T) {
	be := cpuBackend(t)
	s := newScene(sceneMix, 1, false)
	sinks := values(scH, 7)
	for i := range sinks {
		sinks[i] = 1 + 3*sinks[i] // in [-2, 4)
	}
	for _, tc := range []struct {
		sinks bool
		chunk int
	}{{true, 0}, {false, 4}, {false, 7}, {true, 5}, {false, 0}} {
		c := s.cache(t, be, Float32)
		s.writeContext(t, c)
		b := s.batch(t, be, c)
		o := NewAttentionOptions(scH, scHKV, scD)
		o.AttentionChunk = tc.chunk
		var refSinks []float32
		if tc.sinks {
			o.Sinks, refSinks = Float32Tensor(sinks, scH), sinks
		}
		out, lse, err := s.forward(be, b, c, &o)
		if err != nil {
			t.Fatal(err)
		}
		want, wantLSE := s.reference(refSinks, tc.chunk)
		if e := relErr(out, want); e > 1e-5 {
			t.Errorf("sinks %v chunk %d: rel err %g", tc.sinks, tc.chunk, e)
		}
		if e := maxAbsDiff(lse, wantLSE); e > 1e-5 {
			t.Errorf("sinks %v chunk %d: lse err %g", tc.sinks, tc.chunk, e)
		}
		plain, _ := s.reference(nil, 0)
		if (tc.sinks || tc.chunk > 0) && relErr(out, plain) < 1e-3 {
			t.Errorf("sinks %v chunk %d: the option made no difference", tc.sinks, tc.chunk)
		}
	}
}

func fp8Decode(b byte, dt DType) float64 {
	ebits, mbits := 4, 3
	if dt == FP8E5M2 {
		ebits, mbits = 5, 2
	}
	bias := 1<<(ebits-1) - 1
	e := int(b>>mbits) & (1<<ebits - 1)
	m := float64(int(b)&(1<<mbits-1)) / float64(int(1)<<mbits)
	mag := (1 + m) * math.Pow(2, float64(e-bias))
	if e == 0 {
		mag = m * math.Pow(2, float64(1-bias))
	}
	if b&0x80 != 0 {
		return -mag
	}
	return mag
}

func TestHeadScalesWriteAndForwardMatchTheReference(t *testing.T) {
	be := cpuBackend(t)
	s := newScene(sceneMix, 2, true)
	khs, vhs := []float32{0.25, 4}, []float32{2, 0.5}
	kt, vt := Float32Tensor(khs, scHKV), Float32Tensor(vhs, scHKV)
	for _, dt := range []DType{FP8E4M3, FP8E5M2} {
		c := s.cache(t, be, dt)
		k, v, slots := s.context()
		n := len(slots)
		if err := c.WriteScaled(0, Float32Tensor(k, n, scHKV, scD), Float32Tensor(v, n, scHKV, scD), Int64Tensor(slots), kt, vt); err != nil {
			t.Fatal(err)
		}
		// The cache holds fp8(x / scale[h]): check the first context token of the first sequence.
		raw := must(c.ReadBlocks([]int32{s.tables[0]}))
		side := scBS * scHKV * scD
		for h := 0; h < scHKV; h++ {
			for e := 0; e < scD; e++ {
				if got, want := fp8Decode(raw[h*scD+e], dt), float64(k[h*scD+e]/khs[h]); got != want {
					t.Fatalf("%v K head %d: %g, want %g", dt, h, got, want)
				}
				if got, want := fp8Decode(raw[side+h*scD+e], dt), float64(v[h*scD+e]/vhs[h]); got != want {
					t.Fatalf("%v V head %d: %g, want %g", dt, h, got, want)
				}
			}
		}
		// The step's tokens are written with the per-head scales too, then read back through them.
		b := s.batch(t, be, c)
		o := NewAttentionOptions(scH, scHKV, scD)
		o.KHeadScales, o.VHeadScales = kt, vt
		out, lse, err := s.forward(be, b, c, &o)
		if err != nil {
			t.Fatal(err)
		}
		want, wantLSE := s.reference(nil, 0)
		// fp8 caches may compute in bfloat16 (docs/semantics.md section 7): the fp8 tolerance.
		if e := relErr(out, want); e > 6e-2 {
			t.Errorf("%v: rel err %g", dt, e)
		}
		if e := maxAbsDiff(lse, wantLSE); e > 6e-2 {
			t.Errorf("%v: lse err %g", dt, e)
		}
		// Read with the scalar scales (1) instead, the cache gives another result.
		plain := NewAttentionOptions(scH, scHKV, scD)
		plain.WriteKV = false
		tok := s.tokens()
		wrong := make([]float32, tok*scH*scD)
		if err := be.Forward(ForwardArgs{Batch: b, Cache: c, Options: &plain, Q: Float32Tensor(s.q, tok, scH, scD),
			Out: Float32Tensor(wrong, tok, scH, scD)}); err != nil {
			t.Fatal(err)
		}
		if relErr(wrong, want) < 0.5 {
			t.Errorf("%v: the per-head scales made no difference", dt)
		}
	}
}

func TestEqualHeadScalesStoreWhatAScalarScaleStores(t *testing.T) {
	be := cpuBackend(t)
	s := newScene([][2]int{{1, 16}}, 3, false)
	k, v, slots := s.context()
	kt, vt, st := Float32Tensor(k, 16, scHKV, scD), Float32Tensor(v, 16, scHKV, scD), Int64Tensor(slots)
	scalar := s.cache(t, be, FP8E4M3)
	if err := scalar.Write(0, kt, vt, st, 0.003, 1); err != nil {
		t.Fatal(err)
	}
	perHead := s.cache(t, be, FP8E4M3)
	// Through a call option; a nil side has scale 1.
	if err := perHead.WriteScaled(0, kt, vt, st, Float32Tensor([]float32{0.003, 0.003}, scHKV), nil, OnStream(nil)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(must(readAll(scalar)), must(readAll(perHead))) {
		t.Fatal("equal per-head scales stored other bytes than the scalar scale")
	}
}

func TestNewOptionRefusalsWriteNothing(t *testing.T) {
	be := cpuBackend(t)
	s := newScene([][2]int{{1, 5}, {2, 0}}, 4, false)
	c := s.cache(t, be, FP8E4M3)
	b := s.batch(t, be, c)
	before := must(readAll(c))
	short := Float32Tensor(make([]float32, scH-1), scH-1)
	zero := Float32Tensor([]float32{1, 0}, scHKV)
	cases := []struct {
		set  func(o *AttentionOptions)
		code Code
	}{
		{func(o *AttentionOptions) { o.Sinks = short }, BadTensor},
		{func(o *AttentionOptions) { o.AttentionChunk, o.Type = 4, Encoder }, InvalidArgument},
		{func(o *AttentionOptions) { o.AttentionChunk = -1 }, InvalidArgument},
		{func(o *AttentionOptions) { o.KHeadScales = zero }, InvalidArgument},
		{func(o *AttentionOptions) { o.VHeadScales = short }, BadTensor},
		{func(o *AttentionOptions) { o.AttentionChunk = math.MaxInt32 + 1 }, Overflow},
		{func(o *AttentionOptions) { o.Sinks = Float32Tensor(make([]float32, 2), 3) }, BadTensor}, // deferred tensor error
	}
	for i, tc := range cases {
		o := NewAttentionOptions(scH, scHKV, scD)
		tc.set(&o)
		out, _, err := s.forward(be, b, c, &o)
		wantCode(t, err, tc.code)
		for _, x := range out {
			if x != 0 {
				t.Fatalf("case %d: a refused forward wrote out", i)
			}
		}
	}
	row := values(scHKV*scD, 5)
	rt := Float32Tensor(row, 1, scHKV, scD)
	wantCode(t, c.WriteScaled(0, rt, rt, Int64Tensor([]int64{3}), nil, zero), InvalidArgument)
	wantCode(t, c.WriteScaled(0, rt, rt, Int64Tensor([]int64{3}), short, nil), BadTensor)
	wantCode(t, c.WriteScaled(0, nil, rt, Int64Tensor([]int64{3}), nil, nil), NullPointer)
	if !bytes.Equal(before, must(readAll(c))) {
		t.Fatal("a refused call changed the cache")
	}
}

func TestSeqFormPlansTheSameBatch(t *testing.T) {
	be := cpuBackend(t)
	s := newScene(sceneMix, 8, false)
	c := s.cache(t, be, Float32)
	s.writeContext(t, c)
	byContext := s.batch(t, be, c)
	seqLens, starts := s.lensSeq()
	desc := BatchDesc{SeqLens: seqLens, QueryStartLoc: starts, BlockTables: s.tables, BlockTableStride: s.stride}
	bySeq := must(NewBatch(be, c, nil, &desc))
	defer bySeq.Close()
	if got := must(bySeq.QueryStart()); !equalI32(got, starts) {
		t.Fatalf("query start %v, want %v", got, starts)
	}
	planned := must(byContext.SlotMapping())
	if got := must(bySeq.SlotMapping()); !equalI64(got, planned) {
		t.Fatalf("slot mapping %v, want %v", got, planned)
	}
	if must(bySeq.Info()) != must(byContext.Info()) {
		t.Fatal("the two forms planned different batches")
	}
	o := NewAttentionOptions(scH, scHKV, scD)
	o.WriteKV = false
	tok := s.tokens()
	outs := [2][]float32{make([]float32, tok*scH*scD), make([]float32, tok*scH*scD)}
	for i, b := range []*Batch{byContext, bySeq} {
		if err := be.Forward(ForwardArgs{Batch: b, Cache: c, Options: &o, Q: Float32Tensor(s.q, tok, scH, scD),
			Out: Float32Tensor(outs[i], tok, scH, scD)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range outs[0] {
		if math.Float32bits(outs[0][i]) != math.Float32bits(outs[1][i]) {
			t.Fatalf("out[%d] differs between the forms", i)
		}
	}
	// Updates take either form; a caller slot mapping is sized by QueryStartLoc's last entry.
	q, cl := s.lensContext()
	if err := bySeq.Update(&BatchDesc{QueryLens: q, ContextLens: cl, BlockTables: s.tables, BlockTableStride: s.stride}); err != nil {
		t.Fatal(err)
	}
	withSlots := desc
	withSlots.SlotMapping = planned
	if err := bySeq.Update(&withSlots); err != nil {
		t.Fatal(err)
	}
	withSlots.SlotMapping = planned[1:]
	wantCode(t, bySeq.Update(&withSlots), InvalidArgument)
}

func TestSeqFormMistakesAreRefused(t *testing.T) {
	be := cpuBackend(t)
	s := newScene([][2]int{{1, 5}, {2, 0}}, 9, false)
	c := s.cache(t, be, Float32)
	seq := BatchDesc{SeqLens: []int32{6, 2}, QueryStartLoc: []int32{0, 1, 3}, BlockTables: s.tables, BlockTableStride: s.stride}
	b := must(NewBatch(be, c, nil, &seq))
	b.Close()
	edit := func(f func(d *BatchDesc)) *BatchDesc {
		d := seq
		f(&d)
		return &d
	}
	bindingSide := []*BatchDesc{
		edit(func(d *BatchDesc) { d.QueryLens, d.ContextLens = []int32{1, 2}, []int32{5, 0} }), // both forms
		edit(func(d *BatchDesc) { d.QueryStartLoc = nil }),                                     // SeqLens alone
		edit(func(d *BatchDesc) { d.SeqLens = nil }),                                           // QueryStartLoc alone
		edit(func(d *BatchDesc) { d.QueryStartLoc = []int32{0, 1} }),                           // num_seqs + 1 entries
	}
	for i, d := range bindingSide {
		e := wantCode(t, batchErr(NewBatch(be, c, nil, d)), InvalidArgument)
		if !strings.HasPrefix(e.Msg, "pagedattn (Go)") {
			t.Errorf("case %d: %s", i, e.Msg)
		}
	}
	librarySide := []*BatchDesc{
		edit(func(d *BatchDesc) { d.QueryStartLoc = []int32{1, 1, 3} }), // [0] != 0
		edit(func(d *BatchDesc) { d.QueryStartLoc = []int32{0, 2, 1} }), // decreasing
		edit(func(d *BatchDesc) { d.SeqLens = []int32{6, 1} }),          // below the query length
	}
	for i, d := range librarySide {
		e := wantCode(t, batchErr(NewBatch(be, c, nil, d)), InvalidArgument)
		if !strings.Contains(e.Msg, "query_start_loc") && !strings.Contains(e.Msg, "seq_lens") {
			t.Errorf("case %d: %s", i, e.Msg)
		}
	}
}

// batchErr returns the error of a (batch, error) pair, closing a batch that was made.
func batchErr(b *Batch, err error) error {
	if b != nil {
		b.Close()
	}
	return err
}

func equalI32(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func equalI64(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
