#!/usr/bin/env python3
"""pagedattn's CPU backends side by side with PyTorch's CPU attention, same inputs, same process.

What an engine on PyTorch does without a paged CPU kernel: gather the sequence's blocks through
the block table into contiguous K/V (index_select; plainly, and into reused workspaces with one
transposing copy, the fastest gather measured here), then attention: torch's
scaled_dot_product_attention (SDPA), and for decode also a grouped bf16 matmul + float32
softmax by hand (faster than SDPA's one-row path). The fp8 cache is converted to bfloat16 after
the gather. As a lower bound for any non-paged engine, the hand decode is also timed on K/V that
already lie contiguous (no gather at all).

Where Intel Extension for PyTorch (IPEX) imports, its paged-attention kernels join: the CPU
kernels vLLM's CPU backend called (`ipex.llm.modules.PagedAttention`: one-query decode over the
block table, and varlen flash attention over it for prefill, after `reshape_and_cache` writes the
step's K/V). They read IPEX's cache layout, [blocks, kv_heads, block_size, D] (our HND), so these
cases run on an HND cache that both libraries read; IPEX's CPU decode takes bf16 and fp8 e5m2
caches (not e4m3). IPEX pins its torch version: `pip install torch==2.8.0
intel-extension-for-pytorch==2.8.0 numpy` in a separate virtual environment.

Cases (the target shapes of docs/perf.md, all changeable by flags):
  decode   batch 16 x context 4096, 32/8 heads, head size 128, block 16, bf16 and fp8 e4m3
           caches (NHD, block tables shuffled, 268 MB of bf16 K/V: far beyond the L3)
  prefill  4 x 2048 new tokens, causal, same heads, bf16
  ipex     (with IPEX) decode as above over bf16 and fp8 e5m2 HND caches, and the prefill
  mla      multi-head latent attention (DeepSeek V2/V3, Kimi K2) decode, batch 16 x context 4096,
           16 and 128 query heads over latent rows of 576 (512 values + 64 rotary), block 64,
           bf16 cache (mla-fp8: fp8 e4m3); mla-prefill: 4 x 2048 causal, 16 heads, bf16. The
           torch peer is absorbed MLA by hand: the rows gathered through the table, scores over
           all 576 values by bf16 matmul, float32 softmax, the weights times the leading 512
           values; for prefill also SDPA with enable_gqa (value width 512) where it runs

Each timing is the median of --rounds rounds, every round running each contender --inner times
in turn (ours, then torch, alternating, so a change in the host's state hits both). Correctness is
judged against a float64 reference computed here from the same inputs (the cache's stored bf16 or
fp8 values, the bf16 queries), never against a peer: every contender's error (max |out - ref| /
max |ref|, on up to --check-rows query rows per sequence) is printed, and the script exits 1 when
ours exceeds the library's tolerance (bf16 2e-2, fp8 cache 6e-2). A peer beyond it is reported,
not failed: its error is information. torch is not a dependency of the library: install it yourself (`pip install torch
numpy` in a virtual environment) and run, from the repository root after a build:

  PAGEDATTN_LIB_DIR=build/lib PYTHONPATH=bindings/python python3 bench/compare_torch_cpu.py

--threads sets both torch's intra-op threads and our backend's workers (default 2). The rate
column is the cache's K/V bytes over the time (decode; the same bytes for every contender,
whatever it converts them to) or the causal half's FLOPs over the time (prefill, and every MLA
case: 2*(576+512) per key, head and query).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import pagedattn as pa

# What this torch has (Debian 12's python3-torch is 1.13: no SDPA, no float8): the contenders it
# lacks are left out and the output says so.
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")
HAS_FP8 = hasattr(torch, "float8_e4m3fn")


def _has_gqa() -> bool:
    if not HAS_SDPA:
        return False
    x = torch.zeros((1, 2, 1, 8))
    try:
        F.scaled_dot_product_attention(x, x[:, :1], x[:, :1], enable_gqa=True)
        return True
    except TypeError:  # torch < 2.5
        return False


HAS_GQA = _has_gqa()


def _ipex_paged():
    """IPEX's PagedAttention, or None where IPEX is not installed (or does not load with this
    torch). Its import writes warnings (overridden torch kernels, no CUDA runtime) straight to
    file descriptor 2: silenced here."""
    import importlib.util
    import os
    if importlib.util.find_spec("intel_extension_for_pytorch") is None:
        return None
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        from intel_extension_for_pytorch.llm.modules import PagedAttention
        return PagedAttention
    except Exception:  # IPEX built for another torch
        return None
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


# Imported only when its cases are asked for, after torch's: loading IPEX replaces some of torch's
# CPU kernels (it says so), which must not change the torch contenders' figures.
IPEX = None


def sdpa(q, k, v, causal: bool):
    """torch's SDPA with GQA: natively where it can, else with K/V repeated per query head (as an
    engine on such a torch would). The scale is SDPA's default, 1/sqrt(D), as ours."""
    if HAS_GQA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def median_ms(fns: dict, rounds: int, inner: int) -> dict:
    """Runs every fn of `fns` inner times per round, contenders in turn; median/min of rounds.
    The callers' float64 check has run each fn once already: that is the warm-up (page
    faults, thread pools, oneDNN primitive caches)."""
    per = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            per[name].append((time.perf_counter() - t0) * 1e3 / inner)
    return {k: (statistics.median(v), min(v)) for k, v in per.items()}


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    """max |a - ref| / max |ref|, the library's measure; NaN anywhere in a counts as infinite."""
    a = a.double()
    if not torch.isfinite(a).all():
        return math.inf
    return float((a - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


# The library's tolerances on max |out - ref| / max |ref| (bf16 outputs; an fp8 cache's reference
# uses the same stored fp8 values, so its extra error is the bf16 softmax weights' rounding).
TOLERANCE = {"bfloat16": 2e-2, "fp8_e4m3": 6e-2, "fp8_e5m2": 6e-2}


def check_rows(T: int, n: int) -> torch.Tensor:
    """The query rows of a T-row sequence judged against float64: all of them up to n, else n
    spread over the sequence, the first and the last included."""
    if T <= n:
        return torch.arange(T)
    return torch.linspace(0, T - 1, n).round().long().unique()


def softmax_pv(q, k, v, scale: float, mask=None):
    """float64 attention for one sequence: q [R, H, D], k/v [T, Hkv, D], mask [R, T] of visible
    keys (None: all); GQA heads h use KV head h // (H / Hkv). Returns [R, H, D]."""
    R, H, D = q.shape
    hkv = k.shape[1]
    qg = q.double().view(R, hkv, H // hkv, D)
    s = torch.einsum("rhgd,thd->hgrt", qg, k.double()) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("hgrt,thd->rhgd", p, v.double()).reshape(R, H, D)


class Paged:
    """One layer of a paged cache in torch memory: NHD [blocks, block_size, kv_heads, D], or HND
    [blocks, kv_heads, block_size, D] (IPEX's layout)."""

    def __init__(self, be, args, seqs: int, seq_len: int, cache_dtype: str, gen,
                 layout: str = "nhd") -> None:
        bs, hkv, d = args.block_size, args.kv_heads, args.head_size
        self.bs, self.seq_len, self.layout = bs, seq_len, layout
        per_seq = math.ceil(seq_len / bs)
        nblocks = seqs * per_seq + 1
        shape = (nblocks, bs, hkv, d) if layout == "nhd" else (nblocks, hkv, bs, d)
        kf = torch.randn(shape, generator=gen)
        vf = torch.randn(shape, generator=gen)
        lay = pa.Layout.NHD if layout == "nhd" else pa.Layout.HND
        fp8 = {"fp8_e4m3": ("float8_e4m3fn", pa.Dtype.FP8_E4M3),
               "fp8_e5m2": ("float8_e5m2", pa.Dtype.FP8_E5M2)}
        if cache_dtype in fp8:  # callers skip these where torch has no float8 (HAS_FP8)
            tname, pdt = fp8[cache_dtype]
            self.k = kf.to(getattr(torch, tname))
            self.v = vf.to(getattr(torch, tname))
            self.cache = pa.KVCache.wrap(be, [self.k.view(torch.uint8)], [self.v.view(torch.uint8)],
                                         dtype=pdt, layout=lay)
        else:
            self.k = kf.to(torch.bfloat16)
            self.v = vf.to(torch.bfloat16)
            self.cache = pa.KVCache.wrap(be, [self.k], [self.v], layout=lay)
        # Shuffled block tables, as a serving engine's allocator leaves them after a while.
        perm = torch.randperm(nblocks, generator=gen)[: seqs * per_seq]
        self.table = perm.view(seqs, per_seq).to(torch.int32)
        self.flat = self.table.view(-1).to(torch.int64)

    def seq_kv(self, s: int) -> tuple:
        """Sequence s's K and V as stored in the cache, [seq_len, kv_heads, D] float64."""
        blocks = self.table[s].long()
        out = []
        for c in (self.k, self.v):
            x = c[blocks].to(torch.float64)
            if self.layout != "nhd":
                x = x.transpose(1, 2)
            out.append(x.reshape(-1, *x.shape[2:])[: self.seq_len])
        return tuple(out)

    def gathered(self) -> tuple:
        """[seqs, kv_heads, seq_len, D] bf16 K and V gathered through the table, the plain way
        (fresh tensors each call; matmuls on the transposed views)."""
        assert self.layout == "nhd"
        seqs = self.table.shape[0]
        k = self.k.index_select(0, self.flat).view(seqs, -1, *self.k.shape[2:])[:, : self.seq_len]
        v = self.v.index_select(0, self.flat).view(seqs, -1, *self.v.shape[2:])[:, : self.seq_len]
        if k.dtype != torch.bfloat16:
            k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
        return k.transpose(1, 2), v.transpose(1, 2)

    def gather_into(self, ws: dict) -> tuple:
        """The same, the fastest way measured here: into workspaces allocated once (no page
        faults per step), then one copy to contiguous [seqs, kv_heads, seq_len, D] bf16 so the
        matmuls run on contiguous operands (on the transposed views torch's bf16 matmul is ~10x
        slower)."""
        assert self.layout == "nhd"
        seqs, width = self.table.shape
        out = []
        for name, src in (("k", self.k), ("v", self.v)):
            if name not in ws:
                ws[name] = torch.empty((seqs * width, *src.shape[1:]), dtype=src.dtype)
                ws[name + "t"] = torch.empty((seqs, src.shape[2], self.seq_len, src.shape[3]),
                                             dtype=torch.bfloat16)
            torch.index_select(src, 0, self.flat, out=ws[name])
            rows = ws[name].view(seqs, width * self.bs, *src.shape[2:])[:, : self.seq_len]
            ws[name + "t"].copy_(rows.transpose(1, 2))  # converts fp8 to bf16 on the way
            out.append(ws[name + "t"])
        return tuple(out)


def grouped_bmm(q, k, v, scale: float):
    """Decode by hand, the fastest torch formulation measured here: q [B, H, D] viewed as
    [B, Hkv, group, D] so each K/V head is multiplied once for its group (bf16 matmuls), softmax
    in float32. torch's SDPA runs decode (one query row) ~9x slower than this on this CPU."""
    B, H, D = q.shape
    qg = q.view(B, k.shape[1], H // k.shape[1], D)
    s = torch.matmul(qg, k.transpose(-1, -2)).float() * scale
    p = torch.softmax(s, dim=-1).to(torch.bfloat16)
    return torch.matmul(p, v).view(B, H, D)


def decode_case(be, args, cache_dtype: str, gen, layout: str = "nhd") -> dict:
    """Decode, ours against torch's gather-then-attend paths (NHD cache), or against IPEX's paged
    decode kernel on the same cache memory (HND, its layout)."""
    B, ctx, H, Hkv, D = args.batch, args.context, args.heads, args.kv_heads, args.head_size
    paged = Paged(be, args, B, ctx, cache_dtype, gen, layout=layout)
    # The decode token's K/V are in the cache already (write_kv off): every query reads ctx keys.
    batch = pa.Batch(be, paged.cache, [1] * B, [ctx - 1] * B, paged.table)
    q = torch.randn((B, H, D), generator=gen).to(torch.bfloat16)
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(D)

    def ours():
        pa.forward(be, batch, paged.cache, 0, q, out=out, write_kv=False, num_kv_heads=Hkv,
                   scale=scale)

    fns = {"ours": ours}
    if layout == "nhd":
        qt = q.unsqueeze(2)  # [B, H, 1, D]
        kc, vc = paged.gathered()  # contiguous copies for the no-gather lower bound
        kc, vc = kc.contiguous(), vc.contiguous()
        ws: dict = {}

        def torch_gather_sdpa():
            k, v = paged.gathered()
            return sdpa(qt, k, v, False).squeeze(2)

        def torch_gather_bmm():
            k, v = paged.gather_into(ws)
            return grouped_bmm(q, k, v, scale)

        def torch_bmm_contig():
            return grouped_bmm(q, kc, vc, scale)

        if HAS_SDPA:
            fns["torch_gather_sdpa"] = torch_gather_sdpa
        fns["torch_gather_bmm"] = torch_gather_bmm
        fns["torch_bmm_contiguous"] = torch_bmm_contig
    else:
        out_ipex = torch.empty_like(q)
        head_mapping = torch.arange(Hkv, dtype=torch.int32).repeat_interleave(H // Hkv)
        ctx_lens = torch.full((B,), ctx, dtype=torch.int32)

        def ipex_paged_decode():
            IPEX.single_query_cached_kv_attention(out_ipex, q, paged.k, paged.v, head_mapping,
                                                  scale, paged.table, ctx_lens, args.block_size,
                                                  ctx, None)
            return out_ipex

        fns["ipex_paged_decode"] = ipex_paged_decode
    # float64 reference: each query row sees all ctx keys of its sequence.
    ref = torch.stack([softmax_pv(q[s:s + 1], *paged.seq_kv(s), scale)[0] for s in range(B)])
    ours()
    errs = {"ours": rel_err(out, ref)}
    errs.update({name: rel_err(f(), ref) for name, f in fns.items() if name != "ours"})
    t = median_ms(fns, args.rounds, args.inner)
    kv_bytes = 2 * B * ctx * Hkv * D * paged.k.element_size()
    where = "cache" if layout == "nhd" else "HND"
    return {"case": f"decode b{B} x {ctx}, {H}/{Hkv} x {D}, {cache_dtype} {where}",
            "times": t, "errors": errs, "tolerance": TOLERANCE[cache_dtype],
            "kv_bytes": kv_bytes, "tokens": B}


def prefill_case(be, args, gen, layout: str = "nhd") -> dict:
    """Prefill (ours writes the step's K/V into the cache, then attends), against torch's SDPA on
    contiguous q/k/v (NHD cache), or against IPEX's reshape_and_cache + flash_attn_varlen_func
    over the same block tables (HND cache)."""
    B, T, H, Hkv, D = args.prefill_seqs, args.prefill_len, args.heads, args.kv_heads, args.head_size
    paged = Paged(be, args, B, T, "bfloat16", gen, layout=layout)
    batch = pa.Batch(be, paged.cache, [T] * B, [0] * B, paged.table)
    q = torch.randn((B * T, H, D), generator=gen).to(torch.bfloat16)
    k = torch.randn((B * T, Hkv, D), generator=gen).to(torch.bfloat16)
    v = torch.randn((B * T, Hkv, D), generator=gen).to(torch.bfloat16)
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(D)

    def ours():
        pa.forward(be, batch, paged.cache, 0, q, k, v, out=out, scale=scale)

    fns = {"ours": ours}
    if layout == "nhd":
        qt = q.view(B, T, H, D).transpose(1, 2)
        kt = k.view(B, T, Hkv, D).transpose(1, 2)
        vt = v.view(B, T, Hkv, D).transpose(1, 2)
        qc, kc, vc = qt.contiguous(), kt.contiguous(), vt.contiguous()
        g = H // Hkv
        kr, vr = kc.repeat_interleave(g, dim=1), vc.repeat_interleave(g, dim=1)

        def torch_gqa():
            return sdpa(qc, kc, vc, True)

        def torch_expanded():  # K/V repeated per query head beforehand (not timed)
            return F.scaled_dot_product_attention(qc, kr, vr, is_causal=True)

        def torch_matmul():  # without SDPA: per sequence, scores materialised, causal mask
            o = torch.empty_like(qc)
            mask = torch.ones((T, T), dtype=torch.bool).triu(1)
            for b in range(B):
                s = torch.matmul(qc[b], kr[b].transpose(-1, -2)).float() * scale
                p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1).to(torch.bfloat16)
                o[b] = torch.matmul(p, vr[b])
            return o

        if HAS_SDPA:
            fns["torch_sdpa_gqa" if HAS_GQA else "torch_sdpa_repeat_kv"] = torch_gqa
            fns["torch_sdpa_expanded_kv"] = torch_expanded
        else:
            fns["torch_matmul_causal"] = torch_matmul
    else:
        bs = args.block_size
        out_ipex = torch.empty_like(q)
        pos = torch.arange(T)
        slots = (paged.table.long()[:, pos // bs] * bs + pos % bs).reshape(-1).to(torch.int32)
        cu = torch.arange(0, (B + 1) * T, T, dtype=torch.int32)

        def ipex_paged_prefill():  # [B, H, T, D], as the torch contenders return it
            IPEX.reshape_and_cache(k, v, paged.k, paged.v, slots)
            IPEX.flash_attn_varlen_func(out_ipex, q, paged.k, paged.v, cu, cu, T, T, scale, True,
                                        paged.table, None)
            return out_ipex.view(B, T, H, D).transpose(1, 2)

        fns["ipex_paged_prefill"] = ipex_paged_prefill
    # float64 reference on the judged rows of each sequence (causal: row i sees keys 0..i).
    rows = check_rows(T, args.check_rows)
    pos = torch.arange(T)
    ref = torch.cat([softmax_pv(q[b * T + rows], k[b * T:(b + 1) * T], v[b * T:(b + 1) * T],
                                scale, pos[None, :] <= rows[:, None]) for b in range(B)])
    picked = torch.cat([b * T + rows for b in range(B)])
    ours()
    errs = {"ours": rel_err(out[picked], ref)}
    errs.update({name: rel_err(f().transpose(1, 2).reshape(B * T, H, D)[picked], ref)
                 for name, f in fns.items() if name != "ours"})
    t = median_ms(fns, args.rounds, max(1, args.inner // 4))
    flops = 4.0 * B * H * D * (T * (T + 1) / 2)  # QK^T and PV, causal half
    where = "" if layout == "nhd" else " HND"
    return {"case": f"prefill {B} x {T} causal, {H}/{Hkv} x {D}, bf16{where}",
            "times": t, "errors": errs, "tolerance": TOLERANCE["bfloat16"],
            "checked_rows": int(picked.numel()), "flops": flops, "tokens": B * T}


# ---- Multi-head latent attention (MLA: DeepSeek V2/V3/R1, Kimi K2) ----
# Until the Python binding has its MLA calls, the cases below reach the C functions through
# ctypes on the library the binding loaded, with the binding's struct mirrors.
LATENT = 1 << 1                # PAGEDATTN_KV_CACHE_LATENT
FEATURE_MLA = 1 << 16          # PAGEDATTN_FEATURE_MLA
_DL = {torch.bfloat16: (4, 16), torch.float32: (2, 32)}  # DLPack (code, bits)


class _C:
    """The library, its MLA prototypes declared once."""

    lib = None

    @classmethod
    def get(cls):
        if cls.lib is None:
            from pagedattn import _ffi
            lib = _ffi.load()
            vp = ctypes.c_void_p
            lib.pagedattn_forward_mla.restype = ctypes.c_int
            lib.pagedattn_forward_mla.argtypes = [vp, vp, vp, ctypes.c_int32] + [vp] * 6
            cls.lib, cls.ffi = lib, _ffi
        return cls.lib

    @classmethod
    def check(cls, status: int, what: str) -> None:
        if status != 0:
            lib = cls.get()
            raise RuntimeError(f"{what}: {lib.pagedattn_status_string(status).decode()}: "
                               f"{lib.pagedattn_last_error().decode()}")


class CTensor:
    """A pagedattn_tensor over a contiguous bf16 or float32 torch tensor on the CPU."""

    def __init__(self, t: torch.Tensor) -> None:
        assert t.is_contiguous()
        _C.get()
        ffi = _C.ffi
        self.t = t
        self.shape = (ctypes.c_int64 * t.dim())(*t.shape)
        code, bits = _DL[t.dtype]
        self.s = ffi.TensorStruct(t.data_ptr(), ffi.Device(1, 0), t.dim(),
                                  ffi.DLDataType(code, bits, 1), self.shape, None, 0)

    def ref(self):
        return ctypes.byref(self.s)


class LatentPaged:
    """One layer of a latent cache in torch memory, [blocks, block_size, D] (bf16 or fp8 e4m3),
    wrapped by the library; shuffled block tables, and a batch planned over them."""

    def __init__(self, be, args, seqs: int, qlen: int, ctx: int, cache_dtype: str, gen) -> None:
        lib = _C.get()
        ffi = _C.ffi
        bs, D = args.mla_block_size, args.mla_head_size
        self.bs, self.seq_len, self.D = bs, ctx + qlen, D
        per_seq = math.ceil(self.seq_len / bs)
        nblocks = seqs * per_seq + 1
        rf = torch.randn((nblocks, bs, D), generator=gen)
        if cache_dtype == "fp8_e4m3":
            self.rows = rf.to(torch.float8_e4m3fn)
            dt = pa.Dtype.FP8_E4M3
        else:
            self.rows = rf.to(torch.bfloat16)
            dt = pa.Dtype.BFLOAT16
        desc = ffi.KVCacheDescStruct()
        lib.pagedattn_kv_cache_desc_init(ctypes.byref(desc))
        desc.num_layers, desc.num_blocks, desc.block_size = 1, nblocks, bs
        desc.num_kv_heads, desc.head_size, desc.dtype, desc.flags = 1, D, int(dt), LATENT
        self.layers = (ctypes.c_void_p * 1)(self.rows.data_ptr())
        mem = ffi.KVCacheMemoryStruct()
        mem.struct_size = ctypes.sizeof(mem)
        mem.k_layers = self.layers
        mem.device = ffi.Device(1, 0)
        self.cache = ctypes.c_void_p()
        _C.check(lib.pagedattn_kv_cache_wrap(ctypes.byref(self.cache), be._handle(),
                                             ctypes.byref(desc), ctypes.byref(mem)),
                 "pagedattn_kv_cache_wrap (latent)")
        perm = torch.randperm(nblocks, generator=gen)[: seqs * per_seq]
        self.table = perm.view(seqs, per_seq).to(torch.int32).contiguous()
        self.flat = self.table.view(-1).to(torch.int64)
        self.qlens = (ctypes.c_int32 * seqs)(*([qlen] * seqs))
        self.ctxs = (ctypes.c_int32 * seqs)(*([ctx] * seqs))
        bd = ffi.BatchDescStruct()
        lib.pagedattn_batch_desc_init(ctypes.byref(bd))
        bd.num_seqs = seqs
        bd.query_lens = ctypes.addressof(self.qlens)
        bd.context_lens = ctypes.addressof(self.ctxs)
        bd.block_tables = self.table.data_ptr()
        bd.block_table_stride = per_seq
        self.batch = ctypes.c_void_p()
        _C.check(lib.pagedattn_batch_create(ctypes.byref(self.batch), be._handle(), self.cache,
                                            None, ctypes.byref(bd)), "pagedattn_batch_create")
        self.ws = torch.empty((seqs * per_seq, bs, D), dtype=self.rows.dtype)

    def close(self) -> None:
        lib = _C.get()
        lib.pagedattn_batch_destroy(self.batch)
        lib.pagedattn_kv_cache_destroy(self.cache)

    def seq_rows(self, s: int) -> torch.Tensor:
        """Sequence s's rows as stored, [seq_len, D] float64."""
        return self.rows[self.table[s].long()].to(torch.float64).reshape(-1, self.D)[: self.seq_len]

    def gathered(self) -> torch.Tensor:
        """[seqs, seq_len, D] bf16 rows gathered through the table into a workspace allocated
        once (fp8 converted to bf16 after the gather)."""
        seqs = self.table.shape[0]
        torch.index_select(self.rows, 0, self.flat, out=self.ws)
        x = self.ws.view(seqs, -1, self.D)[:, : self.seq_len]
        return x.to(torch.bfloat16) if x.dtype != torch.bfloat16 else x


def mla_forward(be, lp: LatentPaged, opts, qn: CTensor, qp: CTensor, out: CTensor) -> None:
    _C.check(_C.get().pagedattn_forward_mla(be._handle(), lp.batch, lp.cache, 0,
                                            ctypes.byref(opts), qn.ref(), qp.ref(), out.ref(),
                                            None, None), "pagedattn_forward_mla")


def mla_options(H: int, D: int, scale: float):
    ffi = _C.ffi
    o = ffi.AttentionOptionsStruct()
    _C.get().pagedattn_attention_options_init_sized(ctypes.byref(o), ctypes.sizeof(o))
    o.num_heads, o.num_kv_heads, o.head_size, o.scale = H, 1, D, scale
    return o


def mla_ref(q: torch.Tensor, rows: torch.Tensor, R: int, scale: float, mask=None):
    """float64 absorbed MLA for one sequence: q [n, H, D], rows [T, D], mask [n, T] of visible
    keys (None: all). Returns [n, H, R]."""
    s = torch.einsum("nhd,td->nht", q.double(), rows) * scale
    if mask is not None:
        s = s.masked_fill(~mask[:, None, :], float("-inf"))
    return torch.einsum("nht,tr->nhr", torch.softmax(s, dim=-1), rows[:, :R])


def mla_decode_case(be, args, H: int, cache_dtype: str, gen) -> dict:
    """MLA decode: ours (pagedattn_forward_mla) against absorbed MLA in torch: gather the latent
    rows through the table, scores over all D values by bf16 matmul, float32 softmax, bf16
    matmul of the weights with the rows' leading R values."""
    B, ctx, D, R = args.batch, args.context, args.mla_head_size, args.mla_value_size
    lp = LatentPaged(be, args, B, 1, ctx - 1, cache_dtype, gen)
    q = torch.randn((B, H, D), generator=gen).to(torch.bfloat16)
    qn, qp = q[..., :R].contiguous(), q[..., R:].contiguous()
    out = torch.empty((B, H, R), dtype=torch.bfloat16)
    scale = 1.0 / math.sqrt(D)
    opts = mla_options(H, D, scale)
    cq, cp, co = CTensor(qn), CTensor(qp), CTensor(out)

    def ours():
        mla_forward(be, lp, opts, cq, cp, co)

    def torch_gather_bmm():
        kv = lp.gathered()                                           # [B, ctx, D]
        s = torch.matmul(q, kv.transpose(1, 2)).float() * scale      # [B, H, ctx]
        p = torch.softmax(s, dim=-1).to(torch.bfloat16)
        return torch.matmul(p, kv[..., :R])                          # [B, H, R]

    fns = {"ours": ours, "torch_gather_bmm": torch_gather_bmm}
    ref = torch.stack([mla_ref(q[s:s + 1], lp.seq_rows(s), R, scale)[0] for s in range(B)])
    ours()
    errs = {"ours": rel_err(out, ref), "torch_gather_bmm": rel_err(torch_gather_bmm(), ref)}
    t = median_ms(fns, args.rounds, args.inner)
    lp.close()
    return {"case": f"mla decode b{B} x {ctx}, H {H}, {D}/{R}, {cache_dtype} cache",
            "times": t, "errors": errs, "tolerance": TOLERANCE[cache_dtype],
            "flops": 2.0 * (D + R) * H * B * ctx, "tokens": B,
            "latent_bytes": B * ctx * D * lp.rows.element_size()}


def mla_prefill_case(be, args, gen) -> dict:
    """MLA prefill, causal, the rows of the new tokens already in the cache (an engine writes
    them with write_latent first): ours against torch's absorbed MLA per sequence (gather,
    scores materialised with the causal mask, float32 softmax), and SDPA where this torch has
    enable_gqa and takes a value width other than the query's."""
    B, T, H = args.prefill_seqs, args.prefill_len, args.mla_prefill_heads
    D, R = args.mla_head_size, args.mla_value_size
    lp = LatentPaged(be, args, B, T, 0, "bfloat16", gen)
    q = torch.randn((B * T, H, D), generator=gen).to(torch.bfloat16)
    qn, qp = q[..., :R].contiguous(), q[..., R:].contiguous()
    out = torch.empty((B * T, H, R), dtype=torch.bfloat16)
    scale = 1.0 / math.sqrt(D)
    opts = mla_options(H, D, scale)
    cq, cp, co = CTensor(qn), CTensor(qp), CTensor(out)
    qh = q.view(B, T, H, D).transpose(1, 2).contiguous()             # [B, H, T, D]
    mask = torch.ones((T, T), dtype=torch.bool).triu(1)

    def ours():
        mla_forward(be, lp, opts, cq, cp, co)

    def torch_matmul():  # [B, H, T, R]
        kv = lp.gathered()
        o = torch.empty((B, H, T, R), dtype=torch.bfloat16)
        for b in range(B):
            s = torch.matmul(qh[b], kv[b].transpose(0, 1)).float() * scale   # [H, T, T]
            p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1).to(torch.bfloat16)
            o[b] = torch.matmul(p, kv[b, :, :R])
        return o

    def torch_sdpa():
        kv = lp.gathered().unsqueeze(1)                              # [B, 1, T, D]
        return F.scaled_dot_product_attention(qh, kv, kv[..., :R], is_causal=True, scale=scale,
                                              enable_gqa=True)

    fns = {"ours": ours, "torch_gather_matmul": torch_matmul}
    if HAS_GQA:
        try:
            torch_sdpa()
            fns["torch_gather_sdpa"] = torch_sdpa
        except (RuntimeError, TypeError) as e:
            print(f"mla prefill: SDPA left out ({str(e).splitlines()[0]})")
    rows = check_rows(T, args.check_rows)
    pos = torch.arange(T)
    ref = torch.cat([mla_ref(q[b * T + rows], lp.seq_rows(b), R, scale,
                             pos[None, :] <= rows[:, None]) for b in range(B)])
    picked = torch.cat([b * T + rows for b in range(B)])
    ours()
    errs = {"ours": rel_err(out[picked], ref)}
    errs.update({name: rel_err(f().transpose(1, 2).reshape(B * T, H, R)[picked], ref)
                 for name, f in fns.items() if name != "ours"})
    t = median_ms(fns, args.rounds, max(1, args.inner // 4))
    lp.close()
    return {"case": f"mla prefill {B} x {T} causal, H {H}, {D}/{R}, bf16",
            "times": t, "errors": errs, "tolerance": TOLERANCE["bfloat16"],
            "checked_rows": int(picked.numel()), "tokens": B * T,
            "flops": 2.0 * (D + R) * H * B * (T * (T + 1) / 2)}

def capability() -> str:
    cpu = getattr(torch.backends, "cpu", None)
    return cpu.get_cpu_capability() if cpu is not None else "not reported by this torch"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="cpu", help="pagedattn backend: cpu, onednn or auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-size", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--prefill-seqs", type=int, default=4)
    ap.add_argument("--prefill-len", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--inner", type=int, default=8, help="calls per round (prefill: a quarter)")
    ap.add_argument("--cases", default="decode,fp8,prefill,mla,mla-fp8,mla-prefill,ipex",
                    help="mla: MLA decode per --mla-heads, bf16 cache; mla-fp8: the same on an "
                    "fp8 e4m3 cache; mla-prefill: --prefill-seqs x --prefill-len causal")
    ap.add_argument("--mla-heads", default="16,128", help="MLA decode query heads, a list")
    ap.add_argument("--mla-prefill-heads", type=int, default=16)
    ap.add_argument("--mla-head-size", type=int, default=576, help="MLA latent row size D")
    ap.add_argument("--mla-value-size", type=int, default=512, help="MLA value size R")
    ap.add_argument("--mla-block-size", type=int, default=64)
    ap.add_argument("--check-rows", type=int, default=64,
                    help="prefill: query rows per sequence judged against float64")
    ap.add_argument("--json", default=None, help="append the results as one JSON line here")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    be = pa.Backend(args.backend, num_threads=args.threads)
    gen = torch.Generator().manual_seed(1)
    print(f"pagedattn {pa.version_string()} backend {be.name} | torch {torch.__version__} "
          f"({torch.get_num_threads()} threads; CPU capability {capability()})", flush=True)
    if not HAS_SDPA:
        print(f"torch {torch.__version__} has no scaled_dot_product_attention: its SDPA "
              "contenders are left out (prefill: materialised scores instead)")
    results = []
    cases = args.cases.split(",")
    if "decode" in cases:
        results.append(decode_case(be, args, "bfloat16", gen))
    if "fp8" in cases and not HAS_FP8:
        print(f"fp8 case skipped: torch {torch.__version__} has no float8_e4m3fn")
    elif "fp8" in cases:
        results.append(decode_case(be, args, "fp8_e4m3", gen))
    if "prefill" in cases:
        results.append(prefill_case(be, args, gen))
    mla_cases = [c for c in cases if c.startswith("mla")]
    if mla_cases and not int(be.capabilities.features) & FEATURE_MLA:
        print(f"mla cases skipped: backend {be.name} has no MLA")
        mla_cases = []
    for H in [int(h) for h in args.mla_heads.split(",")] if "mla" in mla_cases else []:
        results.append(mla_decode_case(be, args, H, "bfloat16", gen))
    if "mla-fp8" in mla_cases and not HAS_FP8:
        print(f"mla-fp8 case skipped: torch {torch.__version__} has no float8_e4m3fn")
    elif "mla-fp8" in mla_cases:
        for H in [int(h) for h in args.mla_heads.split(",")]:
            results.append(mla_decode_case(be, args, H, "fp8_e4m3", gen))
    if "mla-prefill" in mla_cases:
        results.append(mla_prefill_case(be, args, gen))
    global IPEX
    if "ipex" in cases:
        IPEX = _ipex_paged()
        if IPEX is None:
            print("ipex cases skipped: intel_extension_for_pytorch is not installed for this torch")
        else:
            import intel_extension_for_pytorch as ipex  # loaded already: for its version
            print(f"IPEX {ipex.__version__}: its paged kernels on HND caches")
            results.append(decode_case(be, args, "bfloat16", gen, layout="hnd"))
            results.append(decode_case(be, args, "fp8_e5m2", gen, layout="hnd"))
            results.append(prefill_case(be, args, gen, layout="hnd"))

    bad = False
    cw = max([44] + [len(r["case"]) for r in results])  # the case column's width
    print(f"\n{'case':<{cw}} {'contender':<24} {'median ms':>10} {'min ms':>8} {'rate':>14} "
          f"{'ours faster':>11}")
    for r in results:
        ours_ms = r["times"]["ours"][0]
        for name, (med, mn) in r["times"].items():
            if "kv_bytes" in r:
                rate = f"{r['kv_bytes'] / med / 1e6:.1f} GB/s"
            else:
                rate = f"{r['flops'] / med / 1e6:.0f} GFLOP/s"
            speed = "" if name == "ours" else f"{med / ours_ms:.2f}x"
            print(f"{r['case']:<{cw}} {name:<24} {med:>10.3f} {mn:>8.3f} {rate:>14} {speed:>11}")
        tol = r["tolerance"]
        ok = r["errors"]["ours"] <= tol
        bad |= not ok
        errs = ", ".join(f"{name} {e:.2e}{'' if e <= tol else ' (beyond)'}"
                         for name, e in r["errors"].items())
        print(f"{'':<{cw}} vs float64 (tolerance {tol:g}): {errs}"
              f"{'' if ok else '  OURS WRONG'}")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"torch": torch.__version__, "backend": be.name,
                                "ipex": IPEX is not None,
                                "threads": args.threads, "results": results}) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
