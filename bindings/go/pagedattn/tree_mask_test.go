package pagedattn

// Speculative-decoding tree masks on a batch (docs/semantics.md 4.7) against the float64
// reference: random draft trees over decode and chunked prefill sequences, the chain that equals
// no mask, packing, updates, the refusals and the feature bit.

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

// treeMix is a decode / chunked prefill / idle / prefill mix: {query_len, context_len}.
var treeMix = [][2]int{{1, 20}, {6, 9}, {1, 3}, {0, 3}, {9, 13}, {4, 0}}

// draftTree returns a random draft tree over q tokens in topological order, row-major q x q:
// token r > 0 hangs under a parent drawn from 0..r-1 and sees its parent's ancestors and itself.
func draftTree(q int, seed uint64) []bool {
	draws := values(q, seed)
	m := make([]bool, q*q)
	for r := 0; r < q; r++ {
		if r > 0 {
			parent := int(float64(draws[r]+1) / 2 * float64(r))
			copy(m[r*q:(r+1)*q], m[parent*q:(parent+1)*q])
		}
		m[r*q+r] = true
	}
	return m
}

// chainMask is the causal rule as a mask: every token sees all earlier ones.
func chainMask(q int) []bool {
	m := make([]bool, q*q)
	for b := range m {
		m[b] = b%q <= b/q
	}
	return m
}

// treesFor gives one mask per sequence: a draft tree, or nil (causal) for every third sequence
// and the idle ones.
func treesFor(lens [][2]int, seed uint64) [][]bool {
	masks := make([][]bool, len(lens))
	for i, l := range lens {
		if l[0] > 0 && i%3 != 2 {
			masks[i] = draftTree(l[0], seed+uint64(i))
		}
	}
	return masks
}

// treeDesc is the scene's batch desc with packed masks.
func (s *scene) treeDesc(t *testing.T, masks [][]bool) *BatchDesc {
	t.Helper()
	q, c := s.lensContext()
	mask, indptr, err := PackTreeMasks(masks)
	if err != nil {
		t.Fatal(err)
	}
	return &BatchDesc{QueryLens: q, ContextLens: c, BlockTables: s.tables, BlockTableStride: s.stride,
		TreeMask: mask, TreeMaskIndptr: indptr}
}

func f32Bits(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, x := range v {
		out[i] = math.Float32bits(x)
	}
	return out
}

func sameBits(a, b []float32) bool {
	x, y := f32Bits(a), f32Bits(b)
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if x[i] != y[i] {
			return false
		}
	}
	return true
}

func TestCapabilitiesAnnounceTreeMasks(t *testing.T) {
	if FeatureTreeMask != 1<<15 {
		t.Fatal("FeatureTreeMask differs from backend.h")
	}
	if !must(cpuBackend(t).Capabilities()).Features.Has(FeatureTreeMask) {
		t.Fatal("the cpu backend does not announce tree masks")
	}
}

func TestPackTreeMasksPacksLeastSignificantBitFirst(t *testing.T) {
	masks := [][]bool{draftTree(5, 1), nil, draftTree(1, 2), draftTree(8, 3)}
	mask, indptr, err := PackTreeMasks(masks)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{0, 4, 4, 5, 13}; len(indptr) != len(want) || !bytes.Equal(i64Bytes(indptr), i64Bytes(want)) {
		t.Fatalf("indptr %v, want %v", indptr, want)
	}
	for i, m := range masks {
		seg := mask[indptr[i]:indptr[i+1]]
		for b, set := range m {
			if (seg[b/8]>>(b%8)&1 == 1) != set {
				t.Fatalf("mask %d bit %d", i, b)
			}
		}
	}
	// Two drafts under the root: rows {0}, {0, 1}, {0, 2}.
	tree := []bool{true, false, false, true, true, false, true, false, true}
	if got, _, _ := PackTreeMasks([][]bool{tree}); !bytes.Equal(got, []byte{0b0101_1001, 0b1}) {
		t.Fatalf("packed %08b", got)
	}
	_, _, err = PackTreeMasks([][]bool{make([]bool, 6)})
	if e := wantCode(t, err, InvalidArgument); !strings.Contains(e.Msg, "square") {
		t.Fatal(e.Msg)
	}
}

func i64Bytes(v []int64) []byte {
	var b bytes.Buffer
	for _, x := range v {
		for k := 0; k < 8; k++ {
			b.WriteByte(byte(x >> (8 * k)))
		}
	}
	return b.Bytes()
}

func TestDraftTreesMatchTheReference(t *testing.T) {
	be := cpuBackend(t)
	s := newScene(treeMix, 11, false)
	c := s.cache(t, be, Float32)
	s.writeContext(t, c)
	masks := treesFor(treeMix, 11)
	bd := s.treeDesc(t, masks)
	b := must(NewBatch(be, c, nil, bd))
	defer b.Close()
	if info := must(b.Info()); info.MaxTreeMaskBytes != int64(len(bd.TreeMask)) {
		t.Fatalf("MaxTreeMaskBytes %d, want %d", info.MaxTreeMaskBytes, len(bd.TreeMask))
	}
	o := NewAttentionOptions(scH, scHKV, scD)
	out, lse, err := s.forward(be, b, c, &o)
	if err != nil {
		t.Fatal(err)
	}
	want, wantLSE := s.referenceMasked(nil, 0, masks)
	if e := relErr(out, want); e > 1e-5 {
		t.Errorf("rel err %g", e)
	}
	if e := maxAbsDiff(lse, wantLSE); e > 1e-5 {
		t.Errorf("lse err %g", e)
	}
	// The masks matter: the causal reference is far off.
	if causal, _ := s.reference(nil, 0); relErr(out, causal) < 1e-2 {
		t.Error("the masks made no difference")
	}
	// The SEQ length form takes the same masks.
	seqLens, starts := s.lensSeq()
	bySeq := must(NewBatch(be, c, nil, &BatchDesc{SeqLens: seqLens, QueryStartLoc: starts, BlockTables: s.tables,
		BlockTableStride: s.stride, TreeMask: bd.TreeMask, TreeMaskIndptr: bd.TreeMaskIndptr}))
	defer bySeq.Close()
	again, againLSE, err := s.forward(be, bySeq, c, &o)
	if err != nil {
		t.Fatal(err)
	}
	if !sameBits(again, out) || !sameBits(againLSE, lse) {
		t.Error("the SEQ form gave other bytes")
	}
}

func TestChainMaskEqualsNoMask(t *testing.T) {
	be := cpuBackend(t)
	s := newScene(treeMix, 12, false)
	c := s.cache(t, be, Float32)
	s.writeContext(t, c)
	chains := make([][]bool, len(treeMix))
	for i, l := range treeMix {
		chains[i] = chainMask(l[0])
	}
	plain := s.batch(t, be, c)
	masked := must(NewBatch(be, c, nil, s.treeDesc(t, chains)))
	defer masked.Close()
	o := NewAttentionOptions(scH, scHKV, scD)
	a, aLSE, err := s.forward(be, plain, c, &o)
	if err != nil {
		t.Fatal(err)
	}
	m, mLSE, err := s.forward(be, masked, c, &o)
	if err != nil {
		t.Fatal(err)
	}
	if !sameBits(a, m) || !sameBits(aLSE, mLSE) {
		t.Fatal("a chain mask gave other bytes than no mask")
	}
	if want, _ := s.reference(nil, 0); relErr(a, want) > 1e-5 {
		t.Fatal("causal result off the reference")
	}
}

func TestUpdatesTakeMasksWithinTheCapacity(t *testing.T) {
	be := cpuBackend(t)
	s := newScene(treeMix, 13, false)
	c := s.cache(t, be, Float32)
	s.writeContext(t, c)
	masks := treesFor(treeMix, 13)
	bd := s.treeDesc(t, masks)
	// Planned causal with room for the masks of later steps.
	plain := *bd
	plain.TreeMask, plain.TreeMaskIndptr, plain.MaxTreeMaskBytes = nil, nil, int64(len(bd.TreeMask))
	b := must(NewBatch(be, c, nil, &plain))
	defer b.Close()
	if got := must(b.Info()).MaxTreeMaskBytes; got != int64(len(bd.TreeMask)) {
		t.Fatalf("MaxTreeMaskBytes %d", got)
	}
	if err := b.Update(bd); err != nil {
		t.Fatal(err)
	}
	o := NewAttentionOptions(scH, scHKV, scD)
	out, _, err := s.forward(be, b, c, &o)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := s.referenceMasked(nil, 0, masks); relErr(out, want) > 1e-5 {
		t.Fatalf("rel err %g", relErr(out, want))
	}
	// An update without masks is causal again: masks belong to the step.
	plain.MaxTreeMaskBytes = 0
	if err := b.Update(&plain); err != nil {
		t.Fatal(err)
	}
	causal, _ := s.reference(nil, 0)
	if out, _, err = s.forward(be, b, c, &o); err != nil || relErr(out, causal) > 1e-5 {
		t.Fatalf("causal update: %v", err)
	}
	// More bytes than planned: Capacity, and the batch keeps its contents.
	chains := make([][]bool, len(treeMix))
	for i, l := range treeMix {
		chains[i] = chainMask(l[0])
	}
	big := s.treeDesc(t, chains)
	wantCode(t, b.Update(big), Capacity)
	if out, _, err = s.forward(be, b, c, &o); err != nil || relErr(out, causal) > 1e-5 {
		t.Fatalf("after a refused update: %v", err)
	}
}

func TestMalformedMasksAreRefusedByTheLibrary(t *testing.T) {
	be := cpuBackend(t)
	lens := [][2]int{{1, 5}, {4, 9}, {3, 0}}
	s := newScene(lens, 14, false)
	c := s.cache(t, be, Float32)
	good := s.treeDesc(t, [][]bool{chainMask(1), chainMask(4), nil}) // indptr 0, 1, 3, 3
	diag := chainMask(4)
	diag[2*4+2] = false
	above := chainMask(4)
	above[4+3] = true
	shifted := *good
	shifted.TreeMask = append([]byte{0}, good.TreeMask...)
	shifted.TreeMaskIndptr = []int64{1, 2, 4, 4}
	short, down := *good, *good
	short.TreeMaskIndptr = []int64{0, 1, 2, 2} // 1 byte for 4 x 4 bits
	down.TreeMaskIndptr = []int64{0, 1, 0, 3}
	cases := []struct {
		desc  *BatchDesc
		words string
	}{
		{s.treeDesc(t, [][]bool{chainMask(1), diag, nil}), "row 2 does not see itself"},
		{s.treeDesc(t, [][]bool{chainMask(1), above, nil}), "row 1 sees the later token 3"},
		{&shifted, "tree_mask_indptr[0] = 1"},
		{&short, "sequence 1's tree mask has 1 bytes"},
		{&down, "tree_mask_indptr[2] = 0"},
	}
	room := *good
	room.TreeMask, room.TreeMaskIndptr, room.MaxTreeMaskBytes = nil, nil, 16
	b := must(NewBatch(be, c, nil, &room))
	defer b.Close()
	slots := must(b.SlotMapping())
	for _, tc := range cases {
		_, err := NewBatch(be, c, nil, tc.desc)
		e := wantCode(t, err, InvalidArgument)
		if !strings.Contains(e.Msg, tc.words) || strings.HasPrefix(e.Msg, "pagedattn (Go)") {
			t.Errorf("%q lacks %q", e.Msg, tc.words)
		}
		// Update validates as create does, and keeps the batch's contents.
		wantCode(t, b.Update(tc.desc), InvalidArgument)
		if !bytes.Equal(i64Bytes(must(b.SlotMapping())), i64Bytes(slots)) {
			t.Fatal("a refused update changed the batch")
		}
	}
}

func TestTheBindingRefusesWhatTheLibraryWouldReadPast(t *testing.T) {
	be := cpuBackend(t)
	lens := [][2]int{{1, 5}, {4, 9}, {3, 0}}
	s := newScene(lens, 15, false)
	c := s.cache(t, be, Float32)
	good := s.treeDesc(t, [][]bool{chainMask(1), chainMask(4), nil})
	noIndptr, noMask, shortIndptr, shortMask := *good, *good, *good, *good
	noIndptr.TreeMaskIndptr = nil
	noMask.TreeMask = nil
	shortIndptr.TreeMaskIndptr = good.TreeMaskIndptr[:3]
	shortMask.TreeMask = good.TreeMask[:2]
	for _, tc := range []struct {
		desc  *BatchDesc
		words string
	}{
		{&noIndptr, "go together"},
		{&noMask, "go together"},
		{&shortIndptr, "tree_mask_indptr has 3 entries, needs 4"},
		{&shortMask, "tree_mask has 2 bytes, tree_mask_indptr reaches 3"},
	} {
		_, err := NewBatch(be, c, nil, tc.desc)
		if e := wantCode(t, err, InvalidArgument); !strings.HasPrefix(e.Msg, "pagedattn (Go)") || !strings.Contains(e.Msg, tc.words) {
			t.Errorf("%q lacks %q", e.Msg, tc.words)
		}
	}
}

func TestATreeBatchTakesPlainDecoderAttentionOnly(t *testing.T) {
	be := cpuBackend(t)
	lens := [][2]int{{1, 5}, {4, 9}}
	s := newScene(lens, 16, false)
	c := s.cache(t, be, Float32)
	s.writeContext(t, c)
	slopes := make([]float32, scH)
	for h := range slopes {
		slopes[h] = float32(math.Pow(2, -8*float64(h+1)/scH))
	}
	ids := make([]int32, scNB)
	for i := range ids {
		ids[i] = int32(i)
	}
	before := must(c.ReadBlocks(ids))
	withMasks := s.treeDesc(t, [][]bool{nil, draftTree(4, 16)})
	room := *withMasks
	room.TreeMask, room.TreeMaskIndptr, room.MaxTreeMaskBytes = nil, nil, 2
	// Planned with masks, or only with room for them (an update could add them): both refuse.
	for _, bd := range []*BatchDesc{withMasks, &room} {
		b := must(NewBatch(be, c, nil, bd))
		for i := 0; i < 4; i++ {
			o := NewAttentionOptions(scH, scHKV, scD)
			switch i {
			case 0:
				o.SlidingWindow = 4
			case 1:
				o.AlibiSlopes = Float32Tensor(slopes, scH)
			case 2:
				o.AttentionChunk = 8
			case 3:
				o.Type = Encoder
			}
			_, _, err := s.forward(be, b, c, &o)
			if e := wantCode(t, err, InvalidArgument); !strings.Contains(e.Msg, "tree masks") {
				t.Errorf("case %d: %s", i, e.Msg)
			}
		}
		b.Close()
	}
	if !bytes.Equal(must(c.ReadBlocks(ids)), before) {
		t.Fatal("a refused forward changed the cache")
	}
}
