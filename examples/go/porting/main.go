// Command porting turns vLLM's or FlashInfer's attention metadata into a pagedattn batch, in Go.
//
// An engine that fills vLLM's attention metadata or calls FlashInfer's plan already holds every
// number a pagedattn batch needs (docs/porting.md). Here each step's metadata is written the
// way each of them holds it; fromVLLM and fromFlashInfer turn it into a pagedattn.BatchDesc, the
// two conversions are checked to agree, and the forward's output is checked against a float64
// reference:
//
//  1. prefill: three prompts, nothing cached (NewBatch);
//  2. decode: one token per sequence (the same batch, Update with its default capacities);
//  3. chunked prefill: new chunks after cached tokens, next to a decode (a prefix-cache hit is
//     described the same way);
//  4. cross attention (encoder-decoder): decoder queries over the encoder's keys, held in a
//     cross cache through a second set of block tables.
//
// Run from examples/go: go run ./porting
package main

import (
	"fmt"
	"math"
	"os"
	"reflect"

	"github.com/pagedattn/pagedattn/bindings/go/pagedattn"
)

const (
	numHeads   = 2
	numKVHeads = 1 // GQA: both query heads share one KV head
	headSize   = 16
	blockSize  = 4
	numBlocks  = 32
	maxBlocks  = 4 // the engine's table width: sequences of up to 16 tokens
	qRow       = numHeads * headSize
	kvRow      = numKVHeads * headSize
	tolerance  = 1e-4
)

// ---- the conversions ------------------------------------------------------------------------

// vllmMeta is one step as vLLM's FlashAttentionMetadata holds it.
type vllmMeta struct {
	SeqLens       []int32   // tokens per sequence, this step's included
	QueryStartLoc []int32   // num_seqs + 1 cumulative offsets of the step's tokens
	BlockTable    [][]int32 // rows padded to a common width
	SlotMapping   []int64   // optional
}

// flatten turns padded rows into a row-major table and its width.
func flatten(rows [][]int32) ([]int32, int) {
	width := 0
	if len(rows) > 0 {
		width = len(rows[0])
	}
	flat := make([]int32, 0, len(rows)*width)
	for _, r := range rows {
		flat = append(flat, r...)
	}
	return flat, width
}

// counts turns num_seqs + 1 cumulative offsets into one count per sequence.
func counts(indptr []int32) []int32 {
	n := make([]int32, len(indptr)-1)
	for i := range n {
		n[i] = indptr[i+1] - indptr[i]
	}
	return n
}

func fromVLLM(m vllmMeta) *pagedattn.BatchDesc {
	queryLens := counts(m.QueryStartLoc)
	// SeqLens includes this step's tokens; pagedattn wants the tokens cached BEFORE the step.
	// The classic mistake, ContextLens: m.SeqLens, raises no error (every value is in range)
	// but shifts each query query_len positions late, onto keys that do not exist yet.
	contextLens := make([]int32, len(m.SeqLens))
	for i := range contextLens {
		contextLens[i] = m.SeqLens[i] - queryLens[i]
	}
	tables, width := flatten(m.BlockTable) // padding is not read
	// SlotMapping is optional: pagedattn computes the same slots from the tables. Pass vLLM's
	// only where it differs, e.g. -1 for padding tokens. Capacities stay 0: what this step's
	// sizes and tables address.
	return &pagedattn.BatchDesc{QueryLens: queryLens, ContextLens: contextLens,
		BlockTables: tables, BlockTableStride: width, SlotMapping: m.SlotMapping}
}

// crossFromVLLM adds vLLM's encoder-decoder fields to a batch.
func crossFromVLLM(d *pagedattn.BatchDesc, encoderSeqLens []int32, crossBlockTables [][]int32) *pagedattn.BatchDesc {
	d.EncoderLens = encoderSeqLens
	d.CrossBlockTables, d.CrossBlockTableStride = flatten(crossBlockTables)
	return d
}

// pagedKV is FlashInfer's CSR page list.
type pagedKV struct {
	Indptr, Indices, LastPageLen []int32
}

// lensAndTables returns the tokens of each sequence and its block table padded to width.
func (kv pagedKV) lensAndTables(pageSize int32, width int) ([]int32, []int32) {
	n := len(kv.Indptr) - 1
	lens, tables := make([]int32, n), make([]int32, n*width)
	for i := 0; i < n; i++ {
		pages := kv.Indices[kv.Indptr[i]:kv.Indptr[i+1]]
		// Full pages, then the last one's tokens; a sequence without pages holds no token.
		if len(pages) > 0 {
			lens[i] = int32(len(pages)-1)*pageSize + kv.LastPageLen[i]
		}
		copy(tables[i*width:], pages)
	}
	return lens, tables
}

func fromFlashInfer(qoIndptr []int32, kv pagedKV, pageSize int32, width int) *pagedattn.BatchDesc {
	queryLens := counts(qoIndptr)
	kvLens, tables := kv.lensAndTables(pageSize, width)
	// FlashInfer's pages already hold this step's tokens (append_paged_kv_cache ran first).
	contextLens := make([]int32, len(kvLens))
	for i := range contextLens {
		contextLens[i] = kvLens[i] - queryLens[i]
	}
	return &pagedattn.BatchDesc{QueryLens: queryLens, ContextLens: contextLens,
		BlockTables: tables, BlockTableStride: width}
}

// crossFromFlashInfer adds the pages of a cross (non-causal) plan over the encoder to a batch.
// Their token count is the encoder length itself: no decoder token to subtract.
func crossFromFlashInfer(d *pagedattn.BatchDesc, kv pagedKV, pageSize int32, width int) *pagedattn.BatchDesc {
	d.EncoderLens, d.CrossBlockTables = kv.lensAndTables(pageSize, width)
	d.CrossBlockTableStride = width
	return d
}

// sameBatch reports whether two conversions describe the same batch (slot mappings aside).
func sameBatch(a, b *pagedattn.BatchDesc) bool {
	x, y := *a, *b
	x.SlotMapping, y.SlotMapping = nil, nil
	return reflect.DeepEqual(x, y)
}

// ---- the model and the reference ------------------------------------------------------------

// rng is xorshift32: the model's projections, reproducible.
type rng uint32

// values returns n values in [-1, 1).
func (r *rng) values(n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		*r ^= *r << 13
		*r ^= *r >> 17
		*r ^= *r << 5
		out[i] = float32(*r>>8)/16777216.0*2 - 1
	}
	return out
}

// tokens holds every token of three sequences by position: keys, values, queries, row-major.
type tokens struct {
	k, v, q [3][]float32
}

func newTokens(r *rng, n int) *tokens {
	t := &tokens{}
	for s := 0; s < 3; s++ {
		t.k[s], t.v[s], t.q[s] = r.values(n*kvRow), r.values(n*kvRow), r.values(n*qRow)
	}
	return t
}

// gather returns rows cached[s] .. cached[s]+n[s]-1 of each sequence, one sequence after
// another (the order of query_start_loc).
func gather(seqs [3][]float32, row int, cached, n [3]int) []float32 {
	var out []float32
	for s := range seqs {
		out = append(out, seqs[s][cached[s]*row:(cached[s]+n[s])*row]...)
	}
	return out
}

// attend is the float64 softmax(q k^T / sqrt(D)) v of one token over keys/values [n][Hkv][D].
func attend(q, keys, values []float32) []float64 {
	n := len(keys) / kvRow
	out := make([]float64, qRow)
	for h := 0; h < numHeads; h++ {
		kvh := h / (numHeads / numKVHeads)
		scores := make([]float64, n)
		mx := math.Inf(-1)
		for t := range scores {
			dot := 0.0
			for d := 0; d < headSize; d++ {
				dot += float64(q[h*headSize+d]) * float64(keys[t*kvRow+kvh*headSize+d])
			}
			scores[t] = dot / math.Sqrt(headSize)
			mx = math.Max(mx, scores[t])
		}
		sum := 0.0
		for t := range scores {
			scores[t] = math.Exp(scores[t] - mx)
			sum += scores[t]
		}
		for t, w := range scores {
			for d := 0; d < headSize; d++ {
				out[h*headSize+d] += w / sum * float64(values[t*kvRow+kvh*headSize+d])
			}
		}
	}
	return out
}

// reference attends every row of a step: the token at position t of sequence s sees the first
// see(s, t) keys of keys[s] (t+1 for causal self attention, all encoder tokens for cross).
func reference(q [3][]float32, keys, values [3][]float32, cached, n [3]int, see func(s, t int) int) []float64 {
	var out []float64
	for s := 0; s < 3; s++ {
		for t := cached[s]; t < cached[s]+n[s]; t++ {
			m := see(s, t) * kvRow
			out = append(out, attend(q[s][t*qRow:(t+1)*qRow], keys[s][:m], values[s][:m])...)
		}
	}
	return out
}

func check(name string, out []float32, want []float64) error {
	maxErr := 0.0
	for i := range want {
		e := math.Abs(float64(out[i]) - want[i])
		if math.IsNaN(e) || e > maxErr {
			maxErr = e // NaN propagates as a failure
		}
	}
	fmt.Printf("%s: max |out - ref| = %.2e\n", name, maxErr)
	if math.IsNaN(maxErr) || maxErr > tolerance || len(out) != len(want) {
		return fmt.Errorf("%s: output differs from the float64 reference (%.3g)", name, maxErr)
	}
	return nil
}

// forward runs one layer over the step's rows; k and v nil when the cache already holds them.
func forward(be *pagedattn.Backend, batch *pagedattn.Batch, cache *pagedattn.KVCache,
	opts pagedattn.AttentionOptions, q, k, v []float32) ([]float32, error) {
	rows := len(q) / qRow
	out := make([]float32, len(q))
	args := pagedattn.ForwardArgs{Batch: batch, Cache: cache, Options: &opts,
		Q:   pagedattn.Float32Tensor(q, rows, numHeads, headSize),
		Out: pagedattn.Float32Tensor(out, rows, numHeads, headSize)}
	if k != nil {
		args.K = pagedattn.Float32Tensor(k, len(k)/kvRow, numKVHeads, headSize)
		args.V = pagedattn.Float32Tensor(v, len(v)/kvRow, numKVHeads, headSize)
	}
	return out, be.Forward(args)
}

// ---- decoder steps: prefill, decode, chunked prefill ----------------------------------------

// step is one step as vLLM and FlashInfer hold it; newTokens is the engine's own count of each
// sequence's new tokens.
type step struct {
	name      string
	newTokens [3]int
	vllm      vllmMeta
	qoIndptr  []int32
	pagedKV   pagedKV
}

// Block size 4; blocks allocated as the sequences grow, in no particular order.
var selfSteps = []step{
	{name: "prefill", newTokens: [3]int{5, 3, 7},
		vllm: vllmMeta{SeqLens: []int32{5, 3, 7}, QueryStartLoc: []int32{0, 5, 8, 15},
			BlockTable:  [][]int32{{13, 2, 0, 0}, {5, 0, 0, 0}, {22, 16, 0, 0}},
			SlotMapping: []int64{52, 53, 54, 55, 8, 20, 21, 22, 88, 89, 90, 91, 64, 65, 66}},
		qoIndptr: []int32{0, 5, 8, 15},
		pagedKV:  pagedKV{Indptr: []int32{0, 2, 3, 5}, Indices: []int32{13, 2, 5, 22, 16}, LastPageLen: []int32{1, 3, 3}}},
	{name: "decode", newTokens: [3]int{1, 1, 1},
		vllm: vllmMeta{SeqLens: []int32{6, 4, 8}, QueryStartLoc: []int32{0, 1, 2, 3},
			BlockTable: [][]int32{{13, 2, 0, 0}, {5, 0, 0, 0}, {22, 16, 0, 0}}},
		qoIndptr: []int32{0, 1, 2, 3},
		pagedKV:  pagedKV{Indptr: []int32{0, 2, 3, 5}, Indices: []int32{13, 2, 5, 22, 16}, LastPageLen: []int32{2, 4, 4}}},
	{name: "chunked prefill", newTokens: [3]int{4, 4, 1},
		vllm: vllmMeta{SeqLens: []int32{10, 8, 9}, QueryStartLoc: []int32{0, 4, 8, 9},
			BlockTable: [][]int32{{13, 2, 27, 0}, {5, 30, 0, 0}, {22, 16, 9, 0}}},
		qoIndptr: []int32{0, 4, 8, 9},
		pagedKV: pagedKV{Indptr: []int32{0, 3, 5, 8}, Indices: []int32{13, 2, 27, 5, 30, 22, 16, 9},
			LastPageLen: []int32{2, 4, 1}}},
}

func selfAttention(be *pagedattn.Backend, r *rng) error {
	model := newTokens(r, maxBlocks*blockSize)
	cache, err := pagedattn.NewKVCache(be, pagedattn.CacheDesc{NumLayers: 1, NumBlocks: numBlocks,
		BlockSize: blockSize, NumKVHeads: numKVHeads, HeadSize: headSize, DType: pagedattn.Float32})
	if err != nil {
		return err
	}
	defer cache.Close()
	// WriteKV (the default) stores k/v at their slots first, like vLLM's reshape_and_cache. An
	// engine that already wrote them (FlashInfer's append_paged_kv_cache) sets WriteKV false.
	opts := pagedattn.NewAttentionOptions(numHeads, numKVHeads, headSize)
	var cached [3]int // the engine's own count of each sequence's cached tokens
	var batch *pagedattn.Batch
	for _, st := range selfSteps {
		desc := fromVLLM(st.vllm)
		if !sameBatch(desc, fromFlashInfer(st.qoIndptr, st.pagedKV, blockSize, maxBlocks)) {
			return fmt.Errorf("%s: the vLLM and FlashInfer conversions differ", st.name)
		}
		if batch == nil {
			if batch, err = pagedattn.NewBatch(be, cache, nil, desc); err != nil {
				return err
			}
			defer batch.Close()
			slots, err := batch.SlotMapping()
			if err != nil {
				return err
			}
			if !reflect.DeepEqual(slots, desc.SlotMapping) {
				return fmt.Errorf("the library's slots %v differ from vLLM's", slots)
			}
		} else if err := batch.Update(desc); err != nil {
			// Capacities default to what the first step's tables address (maxBlocks blocks, 16
			// tokens per sequence), so later steps update the planned batch in place.
			return err
		}
		q := gather(model.q, qRow, cached, st.newTokens)
		k := gather(model.k, kvRow, cached, st.newTokens)
		v := gather(model.v, kvRow, cached, st.newTokens)
		out, err := forward(be, batch, cache, opts, q, k, v)
		if err != nil {
			return err
		}
		// Causal: the token at position t sees its sequence's positions 0..t.
		want := reference(model.q, model.k, model.v, cached, st.newTokens, func(_, t int) int { return t + 1 })
		name := fmt.Sprintf("%-16s context_lens %v query_lens %v", st.name, desc.ContextLens, desc.QueryLens)
		if err := check(name, out, want); err != nil {
			return err
		}
		for s := range cached {
			cached[s] += st.newTokens[s]
		}
	}
	return nil
}

// ---- cross attention (encoder-decoder) ------------------------------------------------------

// Three decoder sequences over encoder outputs of 6, 3 and 5 tokens. The decoder's own keys live
// in a self-attention cache, the encoder's in a cross cache (it may be the same cache).
var (
	encoderLens  = []int32{6, 3, 5}
	crossTables  = [][]int32{{7, 3}, {12, 0}, {1, 14}}
	crossPagedKV = pagedKV{Indptr: []int32{0, 2, 3, 5}, Indices: []int32{7, 3, 12, 1, 14}, LastPageLen: []int32{2, 3, 1}}
	crossSteps   = []step{
		{name: "first step", newTokens: [3]int{2, 1, 3},
			vllm: vllmMeta{SeqLens: []int32{2, 1, 3}, QueryStartLoc: []int32{0, 2, 3, 6},
				BlockTable: [][]int32{{3, 0}, {9, 0}, {6, 0}}},
			qoIndptr: []int32{0, 2, 3, 6},
			pagedKV:  pagedKV{Indptr: []int32{0, 1, 2, 3}, Indices: []int32{3, 9, 6}, LastPageLen: []int32{2, 1, 3}}},
		{name: "decode", newTokens: [3]int{1, 1, 1},
			vllm: vllmMeta{SeqLens: []int32{3, 2, 4}, QueryStartLoc: []int32{0, 1, 2, 3},
				BlockTable: [][]int32{{3, 0}, {9, 0}, {6, 0}}},
			qoIndptr: []int32{0, 1, 2, 3},
			pagedKV:  pagedKV{Indptr: []int32{0, 1, 2, 3}, Indices: []int32{3, 9, 6}, LastPageLen: []int32{3, 2, 4}}},
	}
)

func crossAttention(be *pagedattn.Backend, r *rng) error {
	model := newTokens(r, 2*blockSize) // the decoder's own tokens
	var encK, encV [3][]float32        // the encoder's output
	for s, n := range encoderLens {
		encK[s] = r.values(int(n) * kvRow)
	}
	for s, n := range encoderLens {
		encV[s] = r.values(int(n) * kvRow)
	}
	geometry := pagedattn.CacheDesc{NumLayers: 1, NumBlocks: 16, BlockSize: blockSize,
		NumKVHeads: numKVHeads, HeadSize: headSize, DType: pagedattn.Float32}
	cache, err := pagedattn.NewKVCache(be, geometry)
	if err != nil {
		return err
	}
	defer cache.Close()
	xcache, err := pagedattn.NewKVCache(be, geometry)
	if err != nil {
		return err
	}
	defer xcache.Close()
	selfOpts := pagedattn.NewAttentionOptions(numHeads, numKVHeads, headSize)
	crossOpts := selfOpts
	crossOpts.Type = pagedattn.Cross
	var cached [3]int
	var batch *pagedattn.Batch
	for i, st := range crossSteps {
		// Each step repeats the encoder fields, as vLLM's metadata does.
		desc := crossFromVLLM(fromVLLM(st.vllm), encoderLens, crossTables)
		fi := crossFromFlashInfer(fromFlashInfer(st.qoIndptr, st.pagedKV, blockSize, 2), crossPagedKV, blockSize, 2)
		if !sameBatch(desc, fi) {
			return fmt.Errorf("cross %s: the vLLM and FlashInfer conversions differ", st.name)
		}
		if batch == nil {
			if batch, err = pagedattn.NewBatch(be, cache, xcache, desc); err != nil {
				return err
			}
			defer batch.Close()
		} else if err := batch.Update(desc); err != nil {
			return err
		}
		q := gather(model.q, qRow, cached, st.newTokens)
		k := gather(model.k, kvRow, cached, st.newTokens)
		v := gather(model.v, kvRow, cached, st.newTokens)
		// The decoder layer's self attention: causal, over the self-attention cache.
		out, err := forward(be, batch, cache, selfOpts, q, k, v)
		if err != nil {
			return err
		}
		want := reference(model.q, model.k, model.v, cached, st.newTokens, func(_, t int) int { return t + 1 })
		if err := check(fmt.Sprintf("cross %-10s self attention ", st.name), out, want); err != nil {
			return err
		}
		// Its cross attention (one q for both here, for brevity). At a sequence's first step
		// (context_len 0) the forward stores the encoder's k/v, whose rows are the encoder
		// tokens of those sequences in sequence order; later steps only read them.
		if i == 0 {
			ek := append(append(append([]float32{}, encK[0]...), encK[1]...), encK[2]...)
			ev := append(append(append([]float32{}, encV[0]...), encV[1]...), encV[2]...)
			out, err = forward(be, batch, xcache, crossOpts, q, ek, ev)
		} else {
			readOnly := crossOpts
			readOnly.WriteKV = false
			out, err = forward(be, batch, xcache, readOnly, q, nil, nil)
		}
		if err != nil {
			return err
		}
		// Not causal: every decoder token sees all of its sequence's encoder tokens.
		want = reference(model.q, encK, encV, cached, st.newTokens, func(s, _ int) int { return int(encoderLens[s]) })
		if err := check(fmt.Sprintf("cross %-10s cross attention", st.name), out, want); err != nil {
			return err
		}
		for s := range cached {
			cached[s] += st.newTokens[s]
		}
	}
	return nil
}

func run() error {
	fmt.Printf("pagedattn %s, backend cpu\n", pagedattn.LibraryVersionString())
	be, err := pagedattn.NewBackend("cpu")
	if err != nil {
		return err
	}
	defer be.Close()
	r := rng(2024)
	if err := selfAttention(be, &r); err != nil {
		return err
	}
	return crossAttention(be, &r)
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "FAILED:", err)
		os.Exit(1)
	}
	fmt.Println("ok")
}
