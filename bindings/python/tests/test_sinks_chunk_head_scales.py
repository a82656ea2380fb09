"""Attention sinks, chunked local attention and per-KV-head fp8 scales (the 0.2 options) against
the float64 numpy reference, their refusals, and the feature bits that announce them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pagedattn as pa
from reference import decoder_attention, rel_err
from test_api import TOL, Scenario, as_f64

TOL_FP8 = 6e-2


def sinks_for(H: int, seed: int) -> np.ndarray:
    """Sinks in [-2, 4): large enough to take a visible share of each row's softmax."""
    return np.random.default_rng(seed).uniform(-2, 4, H).astype(np.float32)


def fp8_decode(raw: np.ndarray, dtype: pa.Dtype) -> np.ndarray:
    """The float64 values of fp8 bytes (e4m3fn: bias 7, 3 mantissa bits; e5m2: bias 15, 2)."""
    b = raw.astype(np.int64)
    ebits, mbits = (4, 3) if dtype == pa.Dtype.FP8_E4M3 else (5, 2)
    bias = (1 << (ebits - 1)) - 1
    sign = np.where(b >> 7, -1.0, 1.0)
    e = (b >> mbits) & ((1 << ebits) - 1)
    m = (b & ((1 << mbits) - 1)) / float(1 << mbits)
    mag = np.where(e == 0, m * 2.0 ** (1 - bias), (1 + m) * 2.0 ** (e - bias))
    return sign * mag


def test_capabilities_announce_the_new_options(be: pa.Backend) -> None:
    feats = be.capabilities.features
    for f in (pa.Feature.SINKS, pa.Feature.CHUNKED_LOCAL, pa.Feature.HEAD_SCALES):
        assert f in feats, f
    assert (pa.Feature.SINKS, pa.Feature.CHUNKED_LOCAL, pa.Feature.HEAD_SCALES) == \
        (1 << 12, 1 << 13, 1 << 14)


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_sinks_match_reference(be: pa.Backend, dt: str) -> None:
    sc = Scenario(be, dt, query_lens=(1, 7, 0, 1, 12), context_lens=(30, 9, 4, 0, 0), seed=40)
    sinks = sinks_for(sc.H, 40)
    out, lse = pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v, sinks=sinks, lse=True)
    ref, ref_lse = sc.reference(sinks=sinks)
    assert rel_err(as_f64(out), ref) <= TOL[dt]
    assert np.allclose(lse, ref_lse, rtol=max(TOL[dt], 1e-5), atol=1e-5)
    # The sinks matter: the reference without them is far off.
    assert rel_err(as_f64(out), sc.reference()[0]) > 10 * TOL[dt]


def test_sinks_as_a_list_and_with_every_option(be: pa.Backend) -> None:
    sc = Scenario(be, "f32", query_lens=(5, 1, 2), context_lens=(7, 30, 0), seed=41)
    sinks = sinks_for(sc.H, 41)
    alibi = (2.0 ** (-8.0 * (np.arange(sc.H) + 1) / sc.H)).astype(np.float32)
    out = pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v, sinks=[float(x) for x in sinks],
                     scale=0.2, soft_cap=5.0, sliding_window=12, alibi_slopes=alibi,
                     attention_chunk=9)
    ref, _ = sc.reference(sinks=sinks, scale=0.2, soft_cap=5.0, window=12, alibi=alibi, chunk=9)
    assert rel_err(out, ref) <= 1e-5


def test_sinks_on_encoder_attention(be: pa.Backend) -> None:
    rng = np.random.default_rng(42)
    H, D, T = 4, 32, 6
    q = rng.uniform(-1, 1, (T, H, D)).astype(np.float32)
    k = rng.uniform(-1, 1, (T, H, D)).astype(np.float32)
    v = rng.uniform(-1, 1, (T, H, D)).astype(np.float32)
    sinks = sinks_for(H, 42)
    with pa.Batch(be, None, [T]) as batch:
        out = pa.forward(be, batch, None, 0, q, k, v, sinks=sinks,
                         attention_type=pa.AttentionType.ENCODER_ONLY)
    s = np.einsum("thd,shd->hts", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(D)
    m = np.maximum(s.max(-1), sinks[:, None])
    e = np.exp(s - m[..., None])
    total = e.sum(-1) + np.exp(sinks[:, None] - m)
    ref = np.einsum("hts,shd->thd", e / total[..., None], v.astype(np.float64))
    assert rel_err(out, ref) <= 1e-5


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_attention_chunk_matches_reference(be: pa.Backend, chunk: int) -> None:
    sc = Scenario(be, "f32", query_lens=(9, 20, 1, 1), context_lens=(23, 10, 40, 15), seed=43)
    out, lse = pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v, attention_chunk=chunk,
                          lse=True)
    ref, ref_lse = sc.reference(chunk=chunk)
    assert rel_err(out, ref) <= 1e-5
    assert np.allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)
    # Options without tensors are reused between calls: the chunk is part of what is reused.
    plain = pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v)
    assert rel_err(plain, sc.reference()[0]) <= 1e-5


def test_attention_chunk_with_window_and_sinks(be: pa.Backend) -> None:
    sc = Scenario(be, "bf16", query_lens=(1, 10, 1, 3), context_lens=(30, 14, 5, 0), seed=44)
    sinks = sinks_for(sc.H, 44)
    out = pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v, attention_chunk=12,
                     sliding_window=8, sinks=sinks)
    ref, _ = sc.reference(chunk=12, window=8, sinks=sinks)
    assert rel_err(as_f64(out), ref) <= TOL["bf16"]


def exact_fp8_values(rng: np.random.Generator, shape: Any) -> np.ndarray:
    """Multiples of 1/8 in [-7/8, 7/8]: x / s is exact in e4m3 and e5m2 for a power-of-two s,
    so the cache holds x exactly and the reference needs no fp8 rounding."""
    return (rng.integers(-7, 8, shape) / 8.0).astype(np.float32)


@pytest.mark.parametrize("cache_dtype", [pa.Dtype.FP8_E4M3, pa.Dtype.FP8_E5M2])
def test_head_scales_write_and_forward_match_reference(be: pa.Backend,
                                                       cache_dtype: pa.Dtype) -> None:
    rng = np.random.default_rng(45)
    H, Hkv, D, bs, ctx = 4, 2, 32, 8, 12
    tables = [[5, 2]]
    cache = pa.KVCache(be, num_layers=1, num_blocks=8, block_size=bs, num_kv_heads=Hkv,
                       head_size=D, dtype=cache_dtype)
    keys = exact_fp8_values(rng, (ctx + 1, Hkv, D))
    vals = exact_fp8_values(rng, (ctx + 1, Hkv, D))
    khs = np.array([0.25, 4.0], dtype=np.float32)
    vhs = [2.0, 0.5]  # a list of floats works as well
    slots = [tables[0][p // bs] * bs + p % bs for p in range(ctx)]
    cache.write(0, keys[:ctx], vals[:ctx], slots, k_head_scales=khs, v_head_scales=vhs)
    # The cache holds fp8(x / scale[h]) per KV head.
    block = fp8_decode(cache.read_blocks([5]).reshape(2, bs, Hkv, D), cache_dtype)
    assert (block[0] == keys[:bs] / khs[None, :, None]).all()
    assert (block[1] == vals[:bs] / np.array(vhs)[None, :, None]).all()
    batch = pa.Batch(be, cache, [1], [ctx], tables)
    q = rng.uniform(-1, 1, (1, H, D)).astype(np.float32)
    # The step's token is written with the per-head scales too, then read back through them.
    out, lse = pa.forward(be, batch, cache, 0, q, keys[ctx:], vals[ctx:], k_head_scales=khs,
                          v_head_scales=vhs, lse=True)
    ref, ref_lse = decoder_attention(q, [keys], [vals], [1], [ctx])
    # fp8 caches may compute in bfloat16 (docs/semantics.md section 7): the fp8 tolerance.
    assert rel_err(out, ref) <= TOL_FP8
    assert np.allclose(lse, ref_lse, rtol=TOL_FP8, atol=TOL_FP8)
    # Read with the scalar scales (1) instead, the cache gives another result.
    wrong = pa.forward(be, batch, cache, 0, q)
    assert rel_err(wrong, ref) > 0.5


def test_equal_head_scales_store_what_a_scalar_scale_stores(be: pa.Backend) -> None:
    rng = np.random.default_rng(46)
    keys = rng.uniform(-1, 1, (16, 2, 32)).astype(np.float32)
    vals = rng.uniform(-1, 1, (16, 2, 32)).astype(np.float32)
    got = []
    for per_head in (False, True):
        with pa.KVCache(be, num_layers=1, num_blocks=2, block_size=16, num_kv_heads=2,
                        head_size=32, dtype=pa.Dtype.FP8_E4M3) as cache:
            if per_head:
                cache.write(0, keys, vals, np.arange(16), k_head_scales=[0.003, 0.003],
                            v_head_scales=np.full(2, 0.02, np.float32))
            else:
                cache.write(0, keys, vals, np.arange(16), k_scale=0.003, v_scale=0.02)
            got.append(cache.read_blocks([0]))
    assert (got[0] == got[1]).all()


def test_head_scales_on_a_float_cache_are_ignored(be: pa.Backend) -> None:
    sc = Scenario(be, "f32", seed=47)
    out = pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v, k_head_scales=[4.0, 0.5],
                     v_head_scales=[0.25, 2.0])
    assert rel_err(out, sc.reference()[0]) <= 1e-5


def test_refusals(be: pa.Backend) -> None:
    sc = Scenario(be, "f32", seed=48)
    fp8 = pa.KVCache(be, num_layers=1, num_blocks=4, block_size=16, num_kv_heads=2,
                     head_size=64, dtype=pa.Dtype.FP8_E4M3)
    row = np.zeros((1, 2, 64), np.float32)
    out = np.full(sc.q.shape, 7.0, np.float32)
    before = sc.cache.read_blocks(range(32))
    cases = [
        (lambda: pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v, out=out,
                            sinks=np.zeros(sc.H - 1, np.float32)), pa.Status.BAD_TENSOR),
        (lambda: pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v, out=out,
                            sinks=np.zeros(sc.H, np.float64)), pa.Status.BAD_TENSOR),
        (lambda: pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v, out=out,
                            attention_chunk=-1), pa.Status.INVALID_ARGUMENT),
        (lambda: pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v, out=out,
                            attention_chunk=4, attention_type=pa.AttentionType.ENCODER),
         pa.Status.INVALID_ARGUMENT),
        (lambda: pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v, out=out,
                            k_head_scales=[1.0, 0.0]), pa.Status.INVALID_ARGUMENT),
        (lambda: pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v, out=out,
                            v_head_scales=[1.0, 1.0, 1.0]), pa.Status.BAD_TENSOR),
        (lambda: fp8.write(0, row, row, [3], k_head_scales=[-1.0, 1.0]),
         pa.Status.INVALID_ARGUMENT),
        (lambda: fp8.write(0, row, row, [3], v_head_scales=[float("inf"), 1.0]),
         pa.Status.INVALID_ARGUMENT),
        (lambda: fp8.write(0, row, row, [3], k_head_scales=[1.0]), pa.Status.BAD_TENSOR),
    ]
    for fn, code in cases:
        with pytest.raises(pa.PagedAttnError) as e:
            fn()
        assert e.value.code == code, e.value
        assert e.value.message
    assert (out == 7.0).all()
    assert (sc.cache.read_blocks(range(32)) == before).all()
    assert not fp8.read_blocks(range(4)).any()
    with pytest.raises(ValueError, match="one kind of scale"):
        fp8.write(0, row, row, [3], k_scale=0.5, v_head_scales=[1.0, 1.0])
    with pytest.raises(TypeError, match="attention_chunk"):
        pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v, attention_chunk=2.0)


def test_torch_sinks_and_head_scales(be: pa.Backend) -> None:
    torch = pytest.importorskip("torch", reason="python3-torch not installed")
    sc = Scenario(be, "f32", query_lens=(1, 4), context_lens=(18, 9), seed=49)
    sinks = sinks_for(sc.H, 49)
    out = pa.forward(be, sc.batch, sc.cache, 0, torch.from_numpy(sc.q), torch.from_numpy(sc.k),
                     torch.from_numpy(sc.v), sinks=torch.from_numpy(sinks),
                     k_head_scales=torch.ones(2), v_head_scales=torch.ones(2))
    assert isinstance(out, torch.Tensor)
    assert rel_err(out.numpy(), sc.reference(sinks=sinks)[0]) <= 1e-5
