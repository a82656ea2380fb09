package pagedattn

import (
	"math"
	"runtime"
)

// BatchDesc lists one step's sequences. Nil slices are passed as NULL.
//
// The lengths come in one of two forms: QueryLens and ContextLens (the CONTEXT form), or SeqLens
// and QueryStartLoc (the SEQ form, as vLLM v1 and FlashInfer hold them), the other form's slices
// left nil. Both plan the same batch.
type BatchDesc struct {
	QueryLens             []int32 // new tokens per sequence; its length is the number of sequences
	ContextLens           []int32 // tokens already cached per sequence
	BlockTables           []int32 // [num_seqs][BlockTableStride] row-major; nil only for encoder-only
	BlockTableStride      int
	SlotMapping           []int64 // optional caller slots (-1 = padding); nil = computed
	EncoderLens           []int32 // cross attention: encoder tokens per sequence
	CrossBlockTables      []int32 // cross attention: [num_seqs][CrossBlockTableStride]
	CrossBlockTableStride int
	// Capacities for later Update calls. 0 = this batch's size for the counts; for the table
	// width BlockTableStride, and for the sequence length what the tables address
	// (MaxBlocksPerSeq * block size, or the cross tables' reach if larger).
	MaxNumSeqs          int
	MaxNumTokens        int64
	MaxBlocksPerSeq     int
	MaxNumEncoderTokens int64
	MaxSeqLen           int64
	// The SEQ form: context + new tokens per sequence (its length is then the number of
	// sequences), and the len(SeqLens) + 1 row offsets (0, then the running sum of the query
	// lengths).
	SeqLens       []int32
	QueryStartLoc []int32
	// Speculative-decoding tree masks (docs/semantics.md 4.7), packed: sequence i's segment is
	// TreeMask[TreeMaskIndptr[i]:TreeMaskIndptr[i+1]], empty (causal among its new tokens) or a
	// q x q bit matrix (q its query length), row-major, least significant bit first: bit r*q + j
	// set means new token r sees new token j. Every diagonal bit is set and none above it; the
	// context is always visible. TreeMaskIndptr has num_seqs + 1 entries, 0 then non-decreasing.
	// Both nil: no masks. PackTreeMasks builds both from boolean matrices.
	TreeMask       []byte
	TreeMaskIndptr []int64
	// Capacity for updates: mask bytes (0 = this step's TreeMaskIndptr[num_seqs], so a batch
	// that updates into masked steps is created with this set).
	MaxTreeMaskBytes int64
}

// PackTreeMasks packs per-sequence tree masks as BatchDesc.TreeMask and TreeMaskIndptr hold
// them. masks[i] is nil (causal among sequence i's new tokens) or its q x q boolean matrix,
// row-major (m[r*q+j]: new token r sees new token j), packed into exactly ceil(q*q/8) bytes,
// least significant bit first (numpy's packbits(m.reshape(-1), bitorder="little")). It returns
// the bytes and the len(masks) + 1 offsets, or an InvalidArgument error for a matrix whose
// length is not a square.
func PackTreeMasks(masks [][]bool) ([]byte, []int64, error) {
	var mask []byte
	indptr := make([]int64, 1, len(masks)+1)
	for i, m := range masks {
		if m != nil {
			q := int(math.Sqrt(float64(len(m))))
			for q*q > len(m) {
				q--
			}
			for (q+1)*(q+1) <= len(m) {
				q++
			}
			if q*q != len(m) {
				return nil, nil, goError(InvalidArgument, "tree mask %d has %d entries, not the q * q of a square matrix", i, len(m))
			}
			at := len(mask)
			mask = append(mask, make([]byte, (len(m)+7)/8)...)
			for b, set := range m {
				if set {
					mask[at+b/8] |= 1 << (b % 8)
				}
			}
		}
		indptr = append(indptr, int64(len(mask)))
	}
	return mask, indptr, nil
}

// seqForm reports whether d carries its lengths in the SEQ form.
func (d *BatchDesc) seqForm() bool { return d.SeqLens != nil || d.QueryStartLoc != nil }

// numSeqs is the number of sequences d describes.
func (d *BatchDesc) numSeqs() int {
	if d.seqForm() {
		return len(d.SeqLens)
	}
	return len(d.QueryLens)
}

// check verifies that every array is as long as the C side will read.
func (d *BatchDesc) check() error {
	n := d.numSeqs()
	tokens := 0
	if d.seqForm() {
		if d.QueryLens != nil || d.ContextLens != nil {
			return goError(InvalidArgument, "pass QueryLens and ContextLens or SeqLens and QueryStartLoc, not both forms")
		}
		if d.SeqLens == nil || d.QueryStartLoc == nil {
			return goError(InvalidArgument, "SeqLens and QueryStartLoc go together")
		}
		if len(d.QueryStartLoc) != n+1 {
			return goError(InvalidArgument, "query_start_loc has %d entries, needs len(seq_lens) + 1 = %d", len(d.QueryStartLoc), n+1)
		}
		// The library checks the offsets before it reads a slot.
		if last := d.QueryStartLoc[n]; last > 0 {
			tokens = int(last)
		}
	} else {
		if len(d.ContextLens) != n {
			return goError(InvalidArgument, "context_lens has %d entries, query_lens %d", len(d.ContextLens), n)
		}
		for _, q := range d.QueryLens {
			if q > 0 {
				tokens += int(q)
			}
		}
	}
	if d.BlockTables != nil && d.BlockTableStride > 0 && len(d.BlockTables) < n*d.BlockTableStride {
		return goError(InvalidArgument, "block_tables has %d entries, needs %d", len(d.BlockTables), n*d.BlockTableStride)
	}
	if d.SlotMapping != nil {
		if len(d.SlotMapping) < tokens {
			return goError(InvalidArgument, "slot_mapping has %d entries, needs %d", len(d.SlotMapping), tokens)
		}
	}
	if d.EncoderLens != nil && len(d.EncoderLens) != n {
		return goError(InvalidArgument, "encoder_lens has %d entries, needs %d", len(d.EncoderLens), n)
	}
	if d.CrossBlockTables != nil && d.CrossBlockTableStride > 0 && len(d.CrossBlockTables) < n*d.CrossBlockTableStride {
		return goError(InvalidArgument, "cross_block_tables has %d entries, needs %d", len(d.CrossBlockTables), n*d.CrossBlockTableStride)
	}
	if (d.TreeMask == nil) != (d.TreeMaskIndptr == nil) {
		return goError(InvalidArgument, "TreeMask and TreeMaskIndptr go together")
	}
	if d.TreeMaskIndptr != nil {
		if len(d.TreeMaskIndptr) != n+1 {
			return goError(InvalidArgument, "tree_mask_indptr has %d entries, needs %d", len(d.TreeMaskIndptr), n+1)
		}
		// The library reads a sequence's bytes up to its next offset.
		var reach int64
		for _, o := range d.TreeMaskIndptr {
			if o > reach {
				reach = o
			}
		}
		if int64(len(d.TreeMask)) < reach {
			return goError(InvalidArgument, "tree_mask has %d bytes, tree_mask_indptr reaches %d", len(d.TreeMask), reach)
		}
	}
	return nil
}

func (d *BatchDesc) keepAlive() {
	runtime.KeepAlive(d.QueryLens)
	runtime.KeepAlive(d.ContextLens)
	runtime.KeepAlive(d.BlockTables)
	runtime.KeepAlive(d.SlotMapping)
	runtime.KeepAlive(d.EncoderLens)
	runtime.KeepAlive(d.CrossBlockTables)
	runtime.KeepAlive(d.SeqLens)
	runtime.KeepAlive(d.QueryStartLoc)
	runtime.KeepAlive(d.TreeMask)
	runtime.KeepAlive(d.TreeMaskIndptr)
}

// BatchInfo summarises a planned batch.
type BatchInfo struct {
	NumSeqs          int
	NumTokens        int64 // rows of q/k/v/out
	NumEncoderTokens int64 // rows of k/v in a cross forward that writes the cross cache
	NumDecodeSeqs    int
	NumPrefillSeqs   int
	MaxQueryLen      int
	MaxSeqLen        int64
	MaxNumSeqs       int
	MaxNumTokens     int64
	MaxBlocksPerSeq  int
	BlockSize        int
	// Sized for the capacities (Update keeps them); both count against the backend's MemoryLimit.
	HostBytes      uint64 // the planned host metadata: lengths, tables, slot mappings
	WorkspaceBytes uint64 // the backend's own: CPU scratch and split-KV partials; GPU device copies and partials
	// The remaining capacities planned for.
	MaxNumEncoderTokens int64
	MaxSeqLenCapacity   int64 // what MaxSeqLen may reach through Update
	MaxTreeMaskBytes    int64 // tree mask bytes a step may use (0: none)
}

// Batch is a validated and planned batch. Forwards may share it concurrently; Update and Close
// wait for them.
type Batch struct {
	h       handle
	backend *Backend
}

// NewBatch validates and plans a batch against cache (and crossCache for cross attention; either
// may be nil where the C API allows NULL). The batch stays valid after the caches are closed.
func NewBatch(be *Backend, cache, crossCache *KVCache, desc *BatchDesc) (*Batch, error) {
	if desc == nil {
		return nil, goError(NullPointer, "nil batch desc")
	}
	if err := desc.check(); err != nil {
		return nil, err
	}
	bp, err := be.handle().acquire()
	if err != nil {
		return nil, err
	}
	defer be.h.release()
	cp, xp := noPtr, noPtr
	if cache != nil {
		if cp, err = cache.h.acquire(); err != nil {
			return nil, err
		}
		defer cache.h.release()
	}
	if crossCache == cache {
		xp = cp // one read lock per handle: a recursive RLock can deadlock behind Close
	} else if crossCache != nil {
		if xp, err = crossCache.h.acquire(); err != nil {
			return nil, err
		}
		defer crossCache.h.release()
	}
	p, err := cBatchCreate(bp, cp, xp, desc)
	desc.keepAlive()
	if err != nil {
		return nil, err
	}
	b := &Batch{h: handle{p: p, kind: "batch"}, backend: be}
	runtime.SetFinalizer(b, func(b *Batch) { _ = b.Close() })
	return b, nil
}

// Close destroys the batch. Closing twice returns an error.
func (b *Batch) Close() error {
	if b == nil {
		return goError(NullPointer, "nil batch")
	}
	runtime.SetFinalizer(b, nil)
	return b.h.close(cBatchDestroy)
}

func (b *Batch) handle() *handle {
	if b == nil {
		return nil
	}
	return &b.h
}

// Update replaces the batch's contents with a new step of no larger capacity (graph replay). On
// failure the batch keeps its previous contents.
func (b *Batch) Update(desc *BatchDesc) error {
	if desc == nil {
		return goError(NullPointer, "nil batch desc")
	}
	if err := desc.check(); err != nil {
		return err
	}
	p, err := b.handle().acquireExclusive()
	if err != nil {
		return err
	}
	defer b.h.releaseExclusive()
	err = cBatchUpdate(p, desc)
	desc.keepAlive()
	return err
}

// Info summarises the plan.
func (b *Batch) Info() (BatchInfo, error) {
	p, err := b.handle().acquire()
	if err != nil {
		return BatchInfo{}, err
	}
	defer b.h.release()
	return cBatchInfo(p)
}

// SlotMapping returns a copy of the planned slot mapping (one slot per token).
func (b *Batch) SlotMapping() ([]int64, error) {
	p, err := b.handle().acquire()
	if err != nil {
		return nil, err
	}
	defer b.h.release()
	return cBatchI64(p, 0)
}

// QueryStart returns the first row of each sequence, then the number of tokens.
func (b *Batch) QueryStart() ([]int32, error) {
	p, err := b.handle().acquire()
	if err != nil {
		return nil, err
	}
	defer b.h.release()
	return cBatchQueryStart(p)
}

// CrossSlotMapping returns the cross-cache slots of the encoder tokens a cross forward writes
// (empty without cross attention).
func (b *Batch) CrossSlotMapping() ([]int64, error) {
	p, err := b.handle().acquire()
	if err != nil {
		return nil, err
	}
	defer b.h.release()
	return cBatchI64(p, 2)
}
