// Command mla runs one multi-head latent attention (MLA) decode step from Go, DeepSeek-V3-like:
// 16 query heads (one tensor-parallel shard of 128), latent rows of 576 = 512 (kv_lora_rank) +
// 64 (rotary key), blocks of 64 tokens, bfloat16. Four sequences already have 300, 17, 1000 and
// 64 tokens in a latent cache (shuffled block tables); this step writes each one's new row with
// WriteLatent (vLLM's concat_and_cache_mla), runs ForwardMLA in the absorbed form (q_nope already
// multiplied by W_UK, plus q_pe) and checks the output against a float64 reference.
//
// Run from examples/go: go run ./mla [backend]
package main

import (
	"fmt"
	"math"
	"os"

	"github.com/pagedattn/pagedattn/bindings/go/pagedattn"
)

const (
	numHeads   = 16
	kvLoraRank = 512
	ropeDim    = 64
	row        = kvLoraRank + ropeDim // 576
	blockSize  = 64
	tolerance  = 2e-2 // bfloat16
)

// rng is xorshift64: values in [-1, 1) and shuffles.
type rng uint64

func (r *rng) next() uint64 {
	*r ^= *r << 13
	*r ^= *r >> 7
	*r ^= *r << 17
	return uint64(*r)
}

// bf16 returns n values in [-1, 1) as bfloat16 bits.
func (r *rng) bf16(n int) []uint16 {
	out := make([]uint16, n)
	for i := range out {
		out[i] = pagedattn.BFloat16FromFloat32(float32(r.next()>>40)/16777216*2 - 1)
	}
	return out
}

func run(backendName string) error {
	contextLens := []int32{300, 17, 1000, 64}
	n := len(contextLens)
	// DeepSeek V3's softmax scale: mscale^2 / sqrt(qk_nope_head_dim + qk_rope_head_dim), with
	// mscale = 0.1 * ln(40) + 1 (YaRN, factor 40).
	mscale := 0.1*math.Log(40) + 1
	scale := float32(mscale * mscale / math.Sqrt(192))
	fmt.Printf("pagedattn %s, backend %s\n", pagedattn.LibraryVersionString(), backendName)

	backend, err := pagedattn.NewBackend(backendName)
	if err != nil {
		return err
	}
	defer backend.Close()
	caps, err := backend.Capabilities()
	if err != nil {
		return err
	}
	if caps.Device.Type != pagedattn.CPU {
		return fmt.Errorf("backend %s computes on %+v; this example uses host memory", caps.Name, caps.Device)
	}
	if !caps.Features.Has(pagedattn.FeatureMLA) || !caps.SupportsLatentSize(row) {
		return fmt.Errorf("backend %s has no MLA with rows of %d", caps.Name, row)
	}

	// Shuffled block tables, each sized for the sequence with this step's token.
	r := rng(0x20240517_9E3779B9)
	stride, numBlocks := 0, 8
	need := make([]int, n)
	for s, c := range contextLens {
		need[s] = (int(c) + blockSize) / blockSize
		numBlocks += need[s]
		if need[s] > stride {
			stride = need[s]
		}
	}
	free := make([]int32, numBlocks)
	for i := range free {
		free[i] = int32(i)
	}
	for i := numBlocks - 1; i > 0; i-- {
		j := int(r.next() % uint64(i+1))
		free[i], free[j] = free[j], free[i]
	}
	tables := make([]int32, n*stride)
	for s := range need {
		copy(tables[s*stride:], free[:need[s]])
		free = free[need[s]:]
	}
	slot := func(s, p int) int64 { return int64(tables[s*stride+p/blockSize])*blockSize + int64(p%blockSize) }

	// Every latent row of every sequence: the context plus the new token.
	rows := make([][]uint16, n)
	for s, c := range contextLens {
		rows[s] = r.bf16((int(c) + 1) * row)
	}

	cache, err := pagedattn.NewKVCache(backend, pagedattn.CacheDesc{NumLayers: 1, NumBlocks: numBlocks,
		BlockSize: blockSize, NumKVHeads: 1, HeadSize: row, DType: pagedattn.BFloat16, Flags: pagedattn.CacheLatent})
	if err != nil {
		return err
	}
	defer cache.Close()

	// Earlier steps stored the context: kvC [T, 512] and kPE [T, 1, 64], vLLM's shapes.
	var kvC, kPE []uint16
	var slots []int64
	for s, c := range contextLens {
		for p := 0; p < int(c); p++ {
			kvC = append(kvC, rows[s][p*row:p*row+kvLoraRank]...)
			kPE = append(kPE, rows[s][p*row+kvLoraRank:(p+1)*row]...)
			slots = append(slots, slot(s, p))
		}
	}
	if err := cache.WriteLatent(0, pagedattn.BFloat16Tensor(kvC, len(slots), kvLoraRank),
		pagedattn.BFloat16Tensor(kPE, len(slots), 1, ropeDim), pagedattn.Int64Tensor(slots), 1); err != nil {
		return err
	}

	// This step: each sequence's new row goes in first (whole rows, no kPE), then the attention
	// reads it with the context.
	var fresh []uint16
	var freshSlots []int64
	for s, c := range contextLens {
		fresh = append(fresh, rows[s][int(c)*row:]...)
		freshSlots = append(freshSlots, slot(s, int(c)))
	}
	if err := cache.WriteLatent(0, pagedattn.BFloat16Tensor(fresh, n, row), nil, pagedattn.Int64Tensor(freshSlots), 1); err != nil {
		return err
	}
	q := r.bf16(n * numHeads * row)
	var qNope, qPE []uint16
	for i := 0; i < len(q); i += row {
		qNope = append(qNope, q[i:i+kvLoraRank]...)
		qPE = append(qPE, q[i+kvLoraRank:i+row]...)
	}
	queryLens := make([]int32, n)
	for i := range queryLens {
		queryLens[i] = 1
	}
	batch, err := pagedattn.NewBatch(backend, cache, nil, &pagedattn.BatchDesc{QueryLens: queryLens,
		ContextLens: contextLens, BlockTables: tables, BlockTableStride: stride})
	if err != nil {
		return err
	}
	defer batch.Close()
	opts := pagedattn.NewMLAOptions(numHeads, row)
	opts.Scale = scale
	out := make([]uint16, n*numHeads*kvLoraRank)
	err = backend.ForwardMLA(pagedattn.MLAForwardArgs{
		Batch:   batch,
		Cache:   cache,
		Options: &opts,
		QNope:   pagedattn.BFloat16Tensor(qNope, n, numHeads, kvLoraRank),
		QPE:     pagedattn.BFloat16Tensor(qPE, n, numHeads, ropeDim),
		Out:     pagedattn.BFloat16Tensor(out, n, numHeads, kvLoraRank),
	})
	if err != nil {
		return err
	}
	fmt.Printf("out: %d tokens x %d heads x %d values (bfloat16)\n", n, numHeads, kvLoraRank)

	// float64 reference: each key's row is the key (all 576 values) and the value (first 512).
	got := pagedattn.FromBFloat16(out)
	qf := pagedattn.FromBFloat16(q)
	maxErr, maxRef := 0.0, 0.0
	for s, c := range contextLens {
		keys := pagedattn.FromBFloat16(rows[s])
		keys = keys[:(int(c)+1)*row]
		for h := 0; h < numHeads; h++ {
			qh := qf[(s*numHeads+h)*row:][:row]
			w := make([]float64, int(c)+1)
			mx := math.Inf(-1)
			for p := range w {
				dot := 0.0
				for e := 0; e < row; e++ {
					dot += float64(qh[e]) * float64(keys[p*row+e])
				}
				w[p] = dot * float64(scale)
				mx = math.Max(mx, w[p])
			}
			sum := 0.0
			for p := range w {
				w[p] = math.Exp(w[p] - mx)
				sum += w[p]
			}
			for e := 0; e < kvLoraRank; e++ {
				ref := 0.0
				for p := range w {
					ref += w[p] * float64(keys[p*row+e])
				}
				ref /= sum
				d := math.Abs(ref - float64(got[(s*numHeads+h)*kvLoraRank+e]))
				if math.IsNaN(d) || d > maxErr {
					maxErr = d // NaN propagates as a failure
				}
				maxRef = math.Max(maxRef, math.Abs(ref))
			}
		}
	}
	rel := maxErr / maxRef
	fmt.Printf("max relative error %.3g (bfloat16 tolerance %g)\n", rel, tolerance)
	if math.IsNaN(rel) || rel > tolerance {
		return fmt.Errorf("output differs from the float64 reference")
	}
	fmt.Println("ok")
	return nil
}

func main() {
	name := "cpu"
	if len(os.Args) > 1 {
		name = os.Args[1]
	}
	if err := run(name); err != nil {
		fmt.Fprintln(os.Stderr, "FAILED:", err)
		os.Exit(1)
	}
}
