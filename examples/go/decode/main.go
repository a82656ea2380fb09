// Command decode runs one decode step over a paged KV cache from Go: the same step as
// examples/c/decode.c. Three sequences already have 5, 17 and 40 tokens in the cache
// (non-contiguous block tables); this step adds one token to each, runs the attention layer and
// checks the output against a float64 reference.
//
// Run from examples/go: go run ./decode [backend]
package main

import (
	"fmt"
	"math"
	"os"

	"github.com/pagedattn/pagedattn/bindings/go/pagedattn"
)

const (
	numSeqs         = 3
	numHeads        = 8
	numKVHeads      = 2 // grouped-query attention: 4 query heads share one KV head
	headSize        = 64
	blockSize       = 16
	numBlocks       = 16
	maxBlocksPerSeq = 4
	kvRow           = numKVHeads * headSize
	qRow            = numHeads * headSize
)

// rng is the C example's xorshift generator, so both print the same numbers.
type rng uint32

func (r *rng) uniform() float32 {
	*r ^= *r << 13
	*r ^= *r >> 17
	*r ^= *r << 5
	return float32(*r>>8)/16777216.0*2 - 1
}

func run(backendName string) error {
	contextLens := []int32{5, 17, 40}
	queryLens := []int32{1, 1, 1}
	// Block ids of each sequence, row-major; unused entries are never read.
	blockTables := []int32{7, 0, 0, 0, 2, 11, 0, 0, 9, 4, 13, 0}

	if v := pagedattn.LibraryVersion(); v.Major != pagedattn.HeaderVersion.Major {
		return fmt.Errorf("library %v, headers %v", v, pagedattn.HeaderVersion)
	}
	fmt.Printf("pagedattn %s, backend %s\n", pagedattn.LibraryVersionString(), backendName)

	// Every token of every sequence (context plus the new one), as the model would produce them.
	r := rng(12345)
	keys := make([][][kvRow]float32, numSeqs)
	values := make([][][kvRow]float32, numSeqs)
	query := make([]float32, numSeqs*qRow)
	for s := 0; s < numSeqs; s++ {
		keys[s] = make([][kvRow]float32, contextLens[s]+1)
		values[s] = make([][kvRow]float32, contextLens[s]+1)
		for t := range keys[s] {
			for e := 0; e < kvRow; e++ {
				keys[s][t][e] = r.uniform()
				values[s][t][e] = r.uniform()
			}
		}
		for e := 0; e < qRow; e++ {
			query[s*qRow+e] = r.uniform()
		}
	}

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

	// The cache: one layer, float32, NHD layout.
	cache, err := pagedattn.NewKVCache(backend, pagedattn.CacheDesc{NumLayers: 1, NumBlocks: numBlocks,
		BlockSize: blockSize, NumKVHeads: numKVHeads, HeadSize: headSize, DType: pagedattn.Float32,
		Layout: pagedattn.NHD})
	if err != nil {
		return err
	}
	defer cache.Close()

	// Earlier steps stored the context: write it with an explicit slot mapping.
	var ctxK, ctxV []float32
	var ctxSlots []int64
	for s := 0; s < numSeqs; s++ {
		for p := 0; p < int(contextLens[s]); p++ {
			ctxK = append(ctxK, keys[s][p][:]...)
			ctxV = append(ctxV, values[s][p][:]...)
			block := int64(blockTables[s*maxBlocksPerSeq+p/blockSize])
			ctxSlots = append(ctxSlots, block*blockSize+int64(p%blockSize))
		}
	}
	// A tensor keeps a bad description's error; Write (like Forward) returns it.
	tk := pagedattn.Float32Tensor(ctxK, len(ctxSlots), numKVHeads, headSize)
	tv := pagedattn.Float32Tensor(ctxV, len(ctxSlots), numKVHeads, headSize)
	if err := cache.Write(0, tk, tv, pagedattn.Int64Tensor(ctxSlots), 1, 1); err != nil {
		return err
	}

	// This step: one new token per sequence. Planning validates the tables once.
	batch, err := pagedattn.NewBatch(backend, cache, nil, &pagedattn.BatchDesc{QueryLens: queryLens,
		ContextLens: contextLens, BlockTables: blockTables, BlockTableStride: maxBlocksPerSeq})
	if err != nil {
		return err
	}
	defer batch.Close()

	// The new tokens' k/v: row s is sequence s's token at position contextLens[s].
	var newK, newV []float32
	for s := 0; s < numSeqs; s++ {
		newK = append(newK, keys[s][contextLens[s]][:]...)
		newV = append(newV, values[s][contextLens[s]][:]...)
	}
	output := make([]float32, numSeqs*qRow)
	// WriteKV (the default): store the new k/v in the cache, then attend over everything.
	opts := pagedattn.NewAttentionOptions(numHeads, numKVHeads, headSize)
	err = backend.Forward(pagedattn.ForwardArgs{
		Batch:   batch,
		Cache:   cache,
		Layer:   0,
		Options: &opts,
		Q:       pagedattn.Float32Tensor(query, numSeqs, numHeads, headSize),
		K:       pagedattn.Float32Tensor(newK, numSeqs, numKVHeads, headSize),
		V:       pagedattn.Float32Tensor(newV, numSeqs, numKVHeads, headSize),
		Out:     pagedattn.Float32Tensor(output, numSeqs, numHeads, headSize),
	})
	if err != nil {
		return err
	}
	for s := 0; s < numSeqs; s++ {
		o := output[s*qRow:]
		fmt.Printf("seq %d (context %2d): out[head 0][0..3] = %+.5f %+.5f %+.5f %+.5f\n", s, contextLens[s], o[0], o[1], o[2], o[3])
	}

	// float64 reference: softmax(q.k / sqrt(D)) v over positions 0..context_len.
	maxErr, maxRef := 0.0, 0.0
	scale := 1 / math.Sqrt(headSize)
	for s := 0; s < numSeqs; s++ {
		n := int(contextLens[s]) + 1
		for h := 0; h < numHeads; h++ {
			kvh := h / (numHeads / numKVHeads)
			scores := make([]float64, n)
			mx := math.Inf(-1)
			for t := 0; t < n; t++ {
				dot := 0.0
				for d := 0; d < headSize; d++ {
					dot += float64(query[s*qRow+h*headSize+d]) * float64(keys[s][t][kvh*headSize+d])
				}
				scores[t] = dot * scale
				mx = math.Max(mx, scores[t])
			}
			sum := 0.0
			for t := range scores {
				scores[t] = math.Exp(scores[t] - mx)
				sum += scores[t]
			}
			for d := 0; d < headSize; d++ {
				ref := 0.0
				for t := 0; t < n; t++ {
					ref += scores[t] / sum * float64(values[s][t][kvh*headSize+d])
				}
				e := math.Abs(ref - float64(output[s*qRow+h*headSize+d]))
				if math.IsNaN(e) || e > maxErr {
					maxErr = e // NaN propagates as a failure
				}
				maxRef = math.Max(maxRef, math.Abs(ref))
			}
		}
	}
	rel := maxErr / maxRef
	fmt.Printf("max |out - ref| / max |ref| = %.3g (float32 tolerance 1e-5)\n", rel)
	if math.IsNaN(rel) || rel > 1e-5 {
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
