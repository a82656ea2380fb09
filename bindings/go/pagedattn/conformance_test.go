package pagedattn

// The shared conformance suite (tests/conformance/FORMAT.md): each case's inputs, written by the
// C runner into PAGEDATTN_CONFORMANCE_DIR, are run through this package and must give
// byte-identical outputs and the same refusals (status, failing step, message) as the C run.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

type meta map[string]string

func loadMeta(dir string) (meta, error) {
	text, err := os.ReadFile(filepath.Join(dir, "meta.txt"))
	if err != nil {
		return nil, err
	}
	m := meta{}
	for _, line := range strings.Split(string(text), "\n") {
		if line == "" {
			continue
		}
		k, v, _ := strings.Cut(line, " ")
		m[k] = v
	}
	return m, nil
}

func (m meta) i(k string) int {
	v, err := strconv.Atoi(m[k])
	if err != nil {
		panic(fmt.Sprintf("meta %s = %q", k, m[k]))
	}
	return v
}

func (m meta) f(k string) float32 {
	v, err := strconv.ParseFloat(m[k], 32)
	if err != nil {
		panic(fmt.Sprintf("meta %s = %q", k, m[k]))
	}
	return float32(v)
}

func (m meta) list(k string) []int32 {
	var out []int32
	for _, f := range strings.Fields(m[k]) {
		v, _ := strconv.Atoi(f)
		out = append(out, int32(v))
	}
	return out
}

func (m meta) dtype(k string) DType {
	return map[string]DType{"f32": Float32, "f16": Float16, "bf16": BFloat16, "fp8_e4m3": FP8E4M3, "fp8_e5m2": FP8E5M2}[m[k]]
}

func (m meta) layout(k string) Layout {
	if m[k] == "hnd" {
		return HND
	}
	return NHD
}

// buf holds q/k/v/out data in the Go type of its dtype.
type buf struct {
	f32 []float32
	u16 []uint16
}

func bufFromBytes(b []byte, dt DType) *buf {
	if dt == Float32 {
		v := make([]float32, len(b)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return &buf{f32: v}
	}
	v := make([]uint16, len(b)/2)
	for i := range v {
		v[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return &buf{u16: v}
}

func poisoned(n int, dt DType) *buf {
	b := make([]byte, n*dtSize(dt))
	for i := range b {
		b[i] = 0xFF
	}
	return bufFromBytes(b, dt)
}

func dtSize(dt DType) int {
	if dt == Float32 {
		return 4
	}
	return 2
}

func (b *buf) tensor(dt DType, shape ...int) (*Tensor, error) {
	if b.f32 != nil || dt == Float32 {
		return NewTensor(b.f32, dt, shape...)
	}
	return NewTensor(b.u16, dt, shape...)
}

func (b *buf) bytes() []byte {
	var w bytes.Buffer
	if b.f32 != nil {
		_ = binary.Write(&w, binary.LittleEndian, b.f32)
	} else {
		_ = binary.Write(&w, binary.LittleEndian, b.u16)
	}
	return w.Bytes()
}

func readI32(path string) []int32 {
	b, _ := os.ReadFile(path)
	v := make([]int32, len(b)/4)
	for i := range v {
		v[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func readI64(path string) []int64 {
	b, _ := os.ReadFile(path)
	v := make([]int64, len(b)/8)
	for i := range v {
		v[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return v
}

func readAll(c *KVCache) ([]byte, error) {
	d, err := c.Desc()
	if err != nil {
		return nil, err
	}
	ids := make([]int32, d.NumBlocks)
	for i := range ids {
		ids[i] = int32(i)
	}
	return c.ReadBlocks(ids)
}

type stepError struct {
	step string
	err  error
}

// runCase runs one case; it returns why it does not match the C run ("" if it does).
func runCase(dir string) (string, error) {
	m, err := loadMeta(dir)
	if err != nil {
		return "", err
	}
	file := func(n string) string { return filepath.Join(dir, n) }
	has := func(n string) bool { _, err := os.Stat(file(n)); return err == nil }
	mustRead := func(n string) []byte { b, _ := os.ReadFile(file(n)); return b }
	dt, outDT, cacheDT := m.dtype("dtype"), m.dtype("out_dtype"), m.dtype("cache_dtype")
	nl, h, hkv, d := m.i("num_layers"), m.i("num_heads"), m.i("num_kv_heads"), m.i("head_size")
	t, kvRows, numCtx := m.i("num_tokens"), m.i("kv_rows"), m.i("num_ctx")
	op := m["op"]
	attn := map[string]AttentionType{"decoder": Decoder, "encoder": Encoder, "encoder_only": EncoderOnly, "cross": Cross}[m["attention"]]
	encOnly := attn == EncoderOnly
	var pairs [][2]int32
	pl := m.list("pairs")
	for i := 0; i+1 < len(pl); i += 2 {
		pairs = append(pairs, [2]int32{pl[i], pl[i+1]})
	}
	refusal := m["expect"] != "PAGEDATTN_OK"
	// Per-KV-head scales (head_scales 1): the context writes and the forward use them.
	var khs, vhs *Tensor
	if m.i("head_scales") != 0 {
		k := bufFromBytes(mustRead("k_head_scales.bin"), Float32).f32
		v := bufFromBytes(mustRead("v_head_scales.bin"), Float32).f32
		var err1, err2 error
		khs, err1 = NewTensor(k, Float32, len(k))
		vhs, err2 = NewTensor(v, Float32, len(v))
		if err1 != nil || err2 != nil {
			return "", fmt.Errorf("head scales: %v %v", err1, err2)
		}
	}
	out := poisoned(t*h*d, outDT)
	lse := make([]float32, t*h)
	for i := range lse {
		lse[i] = float32(math.NaN())
	}
	var slotsSeen []int64
	var before []byte
	var cache, dst *KVCache
	var failure *stepError

	be, err := NewBackendWithOptions(m["backend"], BackendOptions{NumThreads: 1})
	if err != nil {
		failure = &stepError{"backend_create", err}
	} else {
		defer be.Close()
	}
	run := func() (*stepError, error) {
		desc := CacheDesc{NumLayers: nl, NumBlocks: m.i("num_blocks"), BlockSize: m.i("block_size"),
			NumKVHeads: hkv, HeadSize: d, DType: cacheDT, Layout: m.layout("layout")}
		if !encOnly {
			if cache, err = NewKVCache(be, desc); err != nil {
				return &stepError{"cache_create", err}, nil
			}
		}
		if numCtx > 0 {
			if refusal {
				if before, err = readAll(cache); err != nil {
					return nil, err
				}
			}
			ctxK, ctxV := mustRead("ctx_k.bin"), mustRead("ctx_v.bin")
			slots := Int64Tensor(readI64(file("ctx_slots.bin")))
			per := numCtx * hkv * d * dt.Size()
			for l := 0; l < nl; l++ {
				k, err1 := bufFromBytes(ctxK[l*per:(l+1)*per], dt).tensor(dt, numCtx, hkv, d)
				v, err2 := bufFromBytes(ctxV[l*per:(l+1)*per], dt).tensor(dt, numCtx, hkv, d)
				if err1 != nil || err2 != nil {
					return nil, fmt.Errorf("ctx tensors: %v %v", err1, err2)
				}
				var err error
				if khs != nil {
					err = cache.WriteScaled(l, k, v, slots, khs, vhs)
				} else {
					err = cache.Write(l, k, v, slots, m.f("k_scale"), m.f("v_scale"))
				}
				if err != nil {
					return &stepError{"kv_cache_write", err}, nil
				}
			}
		}
		if refusal && cache != nil {
			if before, err = readAll(cache); err != nil {
				return nil, err
			}
		}
		switch op {
		case "forward":
			bd := &BatchDesc{QueryLens: m.list("query_lens"), ContextLens: m.list("context_lens"),
				BlockTableStride: m.i("table_stride")}
			if bd.ContextLens == nil {
				bd.ContextLens = []int32{}
			}
			if !encOnly {
				bd.BlockTables = readI32(file("tables.bin"))
			}
			var cross *KVCache
			if attn == Cross {
				bd.EncoderLens = m.list("encoder_lens")
				bd.CrossBlockTables = readI32(file("cross_tables.bin"))
				bd.CrossBlockTableStride = m.i("cross_table_stride")
				cross = cache
			}
			// Tree masks (tree 1) as the runner packed them: bytes and offsets.
			if m.i("tree") != 0 {
				bd.TreeMask = append([]byte{}, mustRead("tree_mask.bin")...) // non-nil, even if empty
				bd.TreeMaskIndptr = readI64(file("tree_mask_indptr.bin"))
			}
			batch, err := NewBatch(be, cache, cross, bd)
			if err != nil {
				return &stepError{"batch_create", err}, nil
			}
			defer batch.Close()
			if slotsSeen, err = batch.SlotMapping(); err != nil {
				return &stepError{"batch_get_slot_mapping", err}, nil
			}
			o := NewAttentionOptions(h, m.i("opt_num_kv_heads"), d)
			o.Scale, o.SoftCap, o.SlidingWindow = m.f("scale"), m.f("soft_cap"), m.i("sliding_window")
			o.Type, o.WriteKV = attn, m.i("write_kv") != 0
			o.KScale, o.VScale = m.f("k_scale"), m.f("v_scale")
			if m.i("alibi") != 0 {
				slopes := bufFromBytes(mustRead("alibi.bin"), Float32).f32
				if o.AlibiSlopes, err = NewTensor(slopes, Float32, len(slopes)); err != nil {
					return nil, err
				}
			}
			if m.i("sinks") != 0 {
				sinks := bufFromBytes(mustRead("sinks.bin"), Float32).f32
				if o.Sinks, err = NewTensor(sinks, Float32, m.i("sinks_len")); err != nil {
					return nil, err
				}
			}
			o.AttentionChunk = m.i("attention_chunk")
			o.KHeadScales, o.VHeadScales = khs, vhs
			q, err := bufFromBytes(mustRead("q.bin"), dt).tensor(dt, t, h, d)
			if err != nil {
				return nil, err
			}
			var k, v *Tensor
			if kvRows > 0 {
				if k, err = bufFromBytes(mustRead("k.bin"), dt).tensor(dt, kvRows, hkv, d); err != nil {
					return nil, err
				}
				if v, err = bufFromBytes(mustRead("v.bin"), dt).tensor(dt, kvRows, hkv, d); err != nil {
					return nil, err
				}
			}
			ot, err := out.tensor(outDT, t, h, d)
			if err != nil {
				return nil, err
			}
			var lt *Tensor
			if m.i("lse") != 0 {
				if lt, err = NewTensor(lse, Float32, t, h); err != nil {
					return nil, err
				}
			}
			use := batch
			if m.i("null_batch") != 0 {
				use = nil // passed to C as NULL
			}
			args := ForwardArgs{Batch: use, Cache: cache, Layer: m.i("layer"), Options: &o, Q: q, K: k, V: v, Out: ot, LSE: lt}
			if err := be.Forward(args); err != nil {
				return &stepError{"forward", err}, nil
			}
		case "copy_blocks":
			if err := cache.CopyBlocks(pairs); err != nil {
				return &stepError{"copy_blocks", err}, nil
			}
		case "swap_blocks":
			dd := desc
			dd.Layout, dd.NumBlocks = m.layout("dst_layout"), m.i("dst_num_blocks")
			if dst, err = NewKVCache(be, dd); err != nil {
				return &stepError{"dst_cache_create", err}, nil
			}
			if refusal {
				if before, err = readAll(dst); err != nil {
					return nil, err
				}
			}
			if err := dst.SwapBlocksFrom(cache, pairs); err != nil {
				return &stepError{"swap_blocks", err}, nil
			}
		default:
			return nil, fmt.Errorf("unknown op %s", op)
		}
		return nil, nil
	}
	if failure == nil {
		if failure, err = run(); err != nil {
			return "", err
		}
	}
	if cache != nil {
		defer cache.Close()
	}
	if dst != nil {
		defer dst.Close()
	}

	status, step, msg := "PAGEDATTN_OK", "none", ""
	if failure != nil {
		e, ok := failure.err.(*Error)
		if !ok {
			return "", fmt.Errorf("%s: not an *Error: %v", failure.step, failure.err)
		}
		status, step = e.Code.String(), failure.step
		msg = strings.NewReplacer("\n", " ", "\r", " ").Replace(e.Msg)
	}
	if status != m["status"] || step != m["fail_step"] {
		return fmt.Sprintf("got %s at %s (%s), C got %s at %s", status, step, msg, m["status"], m["fail_step"]), nil
	}
	if msg != m["message"] {
		return fmt.Sprintf("message %q, C said %q", msg, m["message"]), nil
	}
	written := cache
	if op == "swap_blocks" {
		written = dst
	}
	if written != nil {
		now, err := readAll(written)
		if err != nil {
			return "", err
		}
		if has("cache.bin") && !bytes.Equal(now, mustRead("cache.bin")) {
			return "cache bytes differ from the C run's", nil
		}
		if before != nil && !bytes.Equal(before, now) {
			return "a refused call changed the cache", nil
		}
	}
	if failure != nil {
		if step == "forward" && bytes.Count(out.bytes(), []byte{0xFF}) != len(out.bytes()) {
			return "a refused forward wrote out", nil
		}
		return "", nil
	}
	if has("slots.bin") {
		want := readI64(file("slots.bin"))
		if fmt.Sprint(want) != fmt.Sprint(slotsSeen) {
			return "slot mapping differs from the C run's", nil
		}
	}
	if has("out.bin") && !bytes.Equal(out.bytes(), mustRead("out.bin")) {
		return "out bytes differ from the C run's", nil
	}
	if has("lse.bin") && !bytes.Equal((&buf{f32: lse}).bytes(), mustRead("lse.bin")) {
		return "lse bytes differ from the C run's", nil
	}
	return "", nil
}

func TestConformance(t *testing.T) {
	dir := os.Getenv("PAGEDATTN_CONFORMANCE_DIR")
	if dir == "" {
		t.Skip("skipped: PAGEDATTN_CONFORMANCE_DIR not set (bindings/go/run_tests.sh sets it)")
	}
	index, err := os.ReadFile(filepath.Join(dir, "index.txt"))
	if err != nil {
		t.Fatal(err)
	}
	names := strings.Fields(string(index))
	if len(names) < 10 {
		t.Fatalf("only %d cases", len(names))
	}
	for _, name := range names {
		name := name
		t.Run(name, func(t *testing.T) {
			why, err := runCase(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if why != "" {
				t.Error(why)
			}
		})
	}
	for _, must := range []string{"refuse_bad_block_id", "refuse_wrong_dtype", "refuse_short_table", "refuse_null_batch", "refuse_unknown_backend"} {
		if !strings.Contains(" "+string(index)+" ", must) {
			t.Errorf("case %s missing", must)
		}
	}
}
