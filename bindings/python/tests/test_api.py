"""The Python API against a float64 numpy reference, its refusals, and handle lifetimes."""

from __future__ import annotations

import gc
import itertools
import threading
from typing import Any, Dict, List

import numpy as np
import pytest

import pagedattn as pa
from reference import decoder_attention, rel_err

TOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 2e-2}


def rounded(x: np.ndarray, dt: str) -> Any:
    """x (float32) as the tensor type for dt, plus its exact float64 values."""
    if dt == "f32":
        a = x.astype(np.float32)
        return a, a.astype(np.float64)
    if dt == "f16":
        a = x.astype(np.float16)
        return a, a.astype(np.float64)
    b = pa.to_bfloat16(x)
    return b, b.to_float32().astype(np.float64)


def as_f64(t: Any) -> np.ndarray:
    if isinstance(t, pa.BFloat16Array):
        return t.to_float32().astype(np.float64)
    return np.asarray(t, dtype=np.float64)


def cache_dtype(dt: str) -> pa.Dtype:
    return {"f32": pa.Dtype.FLOAT32, "f16": pa.Dtype.FLOAT16, "bf16": pa.Dtype.BFLOAT16}[dt]


class Scenario:
    """Random sequences with context in a cache and one step of new tokens."""

    def __init__(self, be: pa.Backend, dt: str = "f32", *, query_lens=(1, 1, 1),
                 context_lens=(5, 17, 40), H=8, Hkv=2, D=64, bs=16, nb=32,
                 layout=pa.Layout.NHD, seed=0) -> None:
        rng = np.random.default_rng(seed)
        self.seed, self.dt = seed, dt
        self.query_lens, self.context_lens = list(query_lens), list(context_lens)
        self.H, self.Hkv, self.D, self.bs = H, Hkv, D, bs
        self.cache = pa.KVCache.create(be, num_layers=1, num_blocks=nb, block_size=bs,
                                       num_kv_heads=Hkv, head_size=D, dtype=cache_dtype(dt),
                                       layout=layout)
        perm = rng.permutation(nb)
        self.tables: List[List[int]] = []
        at = 0
        for q, c in zip(query_lens, context_lens):
            need = -(-(q + c) // bs)
            self.tables.append([int(x) for x in perm[at:at + need]])
            at += need
        self.keys, self.values = [], []
        ctx_k, ctx_v, slots = [], [], []
        for i, (q, c) in enumerate(zip(query_lens, context_lens)):
            k, kf = rounded(rng.uniform(-1, 1, (c + q, Hkv, D)).astype(np.float32), dt)
            v, vf = rounded(rng.uniform(-1, 1, (c + q, Hkv, D)).astype(np.float32), dt)
            self.keys.append(kf)
            self.values.append(vf)
            ctx_k.append(kf[:c])
            ctx_v.append(vf[:c])
            slots += [self.tables[i][p // bs] * bs + p % bs for p in range(c)]
        self.slots = slots
        ck, _ = rounded(np.concatenate(ctx_k).astype(np.float32), dt)
        cv, _ = rounded(np.concatenate(ctx_v).astype(np.float32), dt)
        self.cache.write(0, ck, cv, np.asarray(slots, dtype=np.int64))
        T = sum(query_lens)
        newk = np.concatenate([self.keys[i][c:] for i, c in enumerate(context_lens)])
        newv = np.concatenate([self.values[i][c:] for i, c in enumerate(context_lens)])
        self.k, _ = rounded(newk.astype(np.float32), dt)
        self.v, _ = rounded(newv.astype(np.float32), dt)
        self.q, self.qf = rounded(rng.uniform(-1, 1, (T, H, D)).astype(np.float32), dt)
        self.batch = pa.Batch(be, self.cache, self.query_lens, self.context_lens, self.tables)

    def reference(self, **kw: Any):
        return decoder_attention(self.qf, self.keys, self.values, self.query_lens,
                                 self.context_lens, **kw)


def test_version_and_library() -> None:
    major, minor, patch = pa.version()
    assert pa.version_string() == f"{major}.{minor}.{patch}"
    assert major == 0
    assert "pagedattn" in pa.library_path()


def test_backend_list_and_capabilities(be: pa.Backend) -> None:
    infos = {i.name: i for i in pa.backends()}
    assert infos["cpu"].available and infos["cpu"].reason == ""
    for name, info in infos.items():
        assert info.available or info.reason, f"{name} unavailable without a reason"
    caps = be.capabilities
    assert caps.name == "cpu" and be.name == "cpu"
    assert caps.device_type == 1
    assert pa.Dtype.FLOAT32 in caps.dtypes and pa.Dtype.BFLOAT16 in caps.dtypes
    assert 16 in caps.block_sizes and 64 in caps.head_sizes and 128 in caps.head_sizes
    assert pa.Feature.LSE in caps.features
    assert caps.max_num_threads == 2


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("layout", [pa.Layout.NHD, pa.Layout.HND])
def test_decode_matches_float64_reference(be: pa.Backend, dt: str, layout: pa.Layout) -> None:
    sc = Scenario(be, dt, layout=layout, seed=3)
    poison = {"f32": np.full(sc.q.shape, np.nan, np.float32),
              "f16": np.full(sc.q.shape, np.nan, np.float16),
              "bf16": pa.BFloat16Array(np.full(sc.q.shape, 0xFFFF, np.uint16))}[dt]
    out, lse = pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v, out=poison, lse=True)
    assert out is poison
    ref, ref_lse = sc.reference()
    err = rel_err(as_f64(out), ref)
    assert err <= TOL[dt], f"seed {sc.seed}: rel err {err}"
    assert np.allclose(lse, ref_lse, rtol=max(TOL[dt], 1e-5), atol=1e-5)


@pytest.mark.parametrize("opts", [
    dict(soft_cap=1.5, scale=0.5),
    dict(window=7),
    dict(alibi=True),
    dict(soft_cap=4.0, window=20, alibi=True),
])
def test_chunked_prefill_options_match_reference(be: pa.Backend, opts: Dict[str, Any]) -> None:
    sc = Scenario(be, "f32", query_lens=(7, 1, 0, 13), context_lens=(9, 30, 3, 0), seed=5)
    alibi = (2.0 ** (-8.0 * (np.arange(sc.H) + 1) / sc.H)).astype(np.float32) \
        if opts.get("alibi") else None
    out = pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v,
                     scale=opts.get("scale", 0.0), soft_cap=opts.get("soft_cap", 0.0),
                     sliding_window=opts.get("window", 0), alibi_slopes=alibi)
    ref, _ = sc.reference(scale=opts.get("scale"), soft_cap=opts.get("soft_cap", 0.0),
                          window=opts.get("window", 0), alibi=alibi)
    assert rel_err(out, ref) <= 1e-5


def test_batch_metadata(be: pa.Backend) -> None:
    sc = Scenario(be, query_lens=(2, 0, 3), context_lens=(14, 0, 1), seed=7)
    assert sc.batch.query_start.tolist() == [0, 2, 2, 5]
    want = []
    for i, (q, c) in enumerate(zip(sc.query_lens, sc.context_lens)):
        want += [sc.tables[i][p // 16] * 16 + p % 16 for p in range(c, c + q)]
    assert sc.batch.slot_mapping.tolist() == want
    info = sc.batch.info
    assert (info.num_seqs, info.num_tokens, info.block_size) == (3, 5, 16)
    assert info.num_prefill_seqs == 2 and info.num_decode_seqs == 0


def test_batch_update_and_capacity(be: pa.Backend) -> None:
    sc = Scenario(be, seed=8)
    b = pa.Batch(be, sc.cache, [1, 1], [3, 4], [sc.tables[0], sc.tables[1]], max_num_seqs=3,
                 max_num_tokens=3, max_blocks_per_seq=3, max_seq_len=64)
    b.update([1, 1, 1], [5, 17, 40], sc.tables)
    out = pa.forward(be, b, sc.cache, 0, sc.q, sc.k, sc.v)
    assert rel_err(out, sc.reference()[0]) <= 1e-5
    with pytest.raises(pa.PagedAttnError) as e:
        b.update([1, 1, 1, 1], [1, 1, 1, 1], sc.tables + [[0]])
    assert e.value.code == pa.Status.CAPACITY and e.value.message


def test_refusals_carry_status_and_message(be: pa.Backend) -> None:
    sc = Scenario(be, seed=9)
    cases = [
        (lambda: pa.Backend("no-such-backend"), pa.Status.UNKNOWN_BACKEND),
        (lambda: pa.Batch(be, sc.cache, [1], [5], [[32]]), pa.Status.OUT_OF_RANGE),
        (lambda: pa.Batch(be, sc.cache, [1], [40], [[1, 2]]), pa.Status.OUT_OF_RANGE),
        (lambda: pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v,
                            out=np.zeros(sc.q.shape, np.float16)), pa.Status.BAD_TENSOR),
        (lambda: pa.forward(be, sc.batch, sc.cache, 0, sc.q.astype(np.float64), sc.k, sc.v,
                            out=np.zeros(sc.q.shape)), pa.Status.BAD_TENSOR),
        (lambda: pa.forward(be, None, sc.cache, 0, sc.q, sc.k, sc.v), pa.Status.NULL_POINTER),
        (lambda: pa.forward(be, sc.batch, sc.cache, 1, sc.q, sc.k, sc.v), pa.Status.OUT_OF_RANGE),
        (lambda: sc.cache.copy_blocks([(0, 5), (1, 5)]), pa.Status.INVALID_ARGUMENT),
        (lambda: pa.KVCache.create(be, num_layers=1, num_blocks=4, block_size=3, num_kv_heads=1,
                                   head_size=64, dtype=pa.Dtype.FLOAT32), None),
    ]
    for fn, code in cases:
        with pytest.raises(pa.PagedAttnError) as e:
            fn()
        if code is not None:
            assert e.value.code == code, e.value
        assert e.value.message, "the library's message must be carried"
        assert e.value.code.c_name in str(e.value)
    # The refused forward left out untouched.
    out = np.full(sc.q.shape, 7.0, dtype=np.float32)
    with pytest.raises(pa.PagedAttnError):
        pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v, out=out, num_kv_heads=3)
    assert (out == 7.0).all()


def test_bad_slot_writes_nothing(be: pa.Backend) -> None:
    cache = pa.KVCache.create(be, num_layers=1, num_blocks=4, block_size=16, num_kv_heads=2,
                              head_size=64, dtype=pa.Dtype.FLOAT32)
    k = np.ones((3, 2, 64), np.float32)
    with pytest.raises(pa.PagedAttnError) as e:
        cache.write(0, k, k, [0, 1, 64])
    assert e.value.code == pa.Status.OUT_OF_RANGE
    assert not cache.read_blocks(range(4)).any()
    cache.write(0, k, k, [0, -1, 63])
    blocks = cache.read_blocks([0, 3]).view(np.float32).reshape(2, 2, 16, 2, 64)  # id, K/V, slot
    assert (blocks[0, :, 0] == 1).all() and not blocks[0, :, 1].any()
    assert (blocks[1, :, 15] == 1).all()


def test_binding_side_errors_are_clear(be: pa.Backend) -> None:
    sc = Scenario(be, seed=10)
    with pytest.raises(TypeError, match="q: expected a numpy array"):
        pa.forward(be, sc.batch, sc.cache, 0, [[1.0]], sc.k, sc.v)
    with pytest.raises(TypeError, match="complex"):
        pa.forward(be, sc.batch, sc.cache, 0, sc.q.astype(np.complex64), sc.k, sc.v,
                   out=np.zeros(sc.q.shape, np.float32))
    ro = np.zeros(sc.q.shape, np.float32)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v, out=ro)


def test_strided_views_are_used_in_place(be: pa.Backend) -> None:
    sc = Scenario(be, seed=11)
    T, H, D = sc.q.shape
    big = np.zeros((T, H + 2, D + 8), np.float32)
    big[:, :H, :D] = sc.q
    qv = big[:, :H, :D]  # non-compact strides, unit innermost stride
    outbig = np.full((T, H, 2 * D), np.nan, np.float32)
    out = outbig[:, :, :D]
    pa.forward(be, sc.batch, sc.cache, 0, qv, sc.k, sc.v, out=out, write_kv=True)
    assert rel_err(out, sc.reference()[0]) <= 1e-5
    assert np.isnan(outbig[:, :, D:]).all()


def test_close_twice_use_after_close_and_out_of_order(be: pa.Backend) -> None:
    sc = Scenario(be, seed=12)
    backend2 = pa.Backend("cpu", num_threads=1)
    cache = pa.KVCache.create(backend2, num_layers=1, num_blocks=8, block_size=16,
                              num_kv_heads=2, head_size=64, dtype=pa.Dtype.FLOAT32)
    batch = pa.Batch(backend2, cache, [1], [3], [[5]])
    backend2.close()  # the C backend lives on until the cache and batch are gone
    backend2.close()
    assert backend2.closed
    assert cache.read_blocks([5]).shape == (1, cache.bytes_per_block)
    assert batch.slot_mapping.tolist() == [5 * 16 + 3]
    with pytest.raises(pa.PagedAttnError) as e:
        pa.forward(backend2, batch, cache, 0, sc.q[:1], sc.k[:1], sc.v[:1])
    assert e.value.code == pa.Status.INVALID_HANDLE and "closed" in e.value.message
    cache.close()
    with pytest.raises(pa.PagedAttnError) as e:
        cache.read_blocks([0])
    assert e.value.code == pa.Status.INVALID_HANDLE
    with pytest.raises(pa.PagedAttnError):
        pa.forward(be, batch, cache, 0, sc.q[:1], sc.k[:1], sc.v[:1])
    batch.close()
    batch.close()
    with pytest.raises(pa.PagedAttnError):
        _ = batch.info
    with pytest.raises(pa.PagedAttnError):
        with batch:
            pass
    # Dropped without close: the finalizers destroy them, in whatever order the GC picks.
    b3 = pa.Backend("cpu")
    c3 = pa.KVCache.create(b3, num_layers=1, num_blocks=2, block_size=16, num_kv_heads=1,
                           head_size=64, dtype=pa.Dtype.FLOAT16)
    bt3 = pa.Batch(b3, c3, [1], [0], [[1]])
    del b3, c3, bt3
    gc.collect()


def test_context_managers(be: pa.Backend) -> None:
    with pa.KVCache.create(be, num_layers=2, num_blocks=4, block_size=8, num_kv_heads=1,
                           head_size=32, dtype=pa.Dtype.FLOAT16) as cache:
        assert cache.desc == pa.CacheDesc(2, 4, 8, 1, 32, pa.Dtype.FLOAT16, pa.Layout.NHD, 0)
        with pa.Batch(be, cache, [2], [0], [[3]]) as b:
            assert b.num_tokens == 2
        assert b.closed
    assert cache.closed


def test_bytes_per_block_copy_swap_read_load(be: pa.Backend) -> None:
    assert pa.bytes_per_block(3, 16, 2, 64, pa.Dtype.FLOAT16) == 3 * 2 * 16 * 2 * 64 * 2
    rng = np.random.default_rng(13)
    a = pa.KVCache.create(be, num_layers=2, num_blocks=6, block_size=4, num_kv_heads=2,
                          head_size=32, dtype=pa.Dtype.FLOAT32)
    for layer in range(2):
        kv = rng.uniform(-1, 1, (24, 2, 32)).astype(np.float32)
        a.write(layer, kv, -kv, np.arange(24))
    before = a.read_blocks(range(6))
    a.copy_blocks([(0, 5), (2, 3)])
    after = a.read_blocks(range(6))
    assert (after[5] == before[0]).all() and (after[3] == before[2]).all()
    assert (after[[0, 1, 2, 4]] == before[[0, 1, 2, 4]]).all()
    b = pa.KVCache.create(be, num_layers=2, num_blocks=3, block_size=4, num_kv_heads=2,
                          head_size=32, dtype=pa.Dtype.FLOAT32)
    b.swap_blocks(a, [(1, 0), (4, 2)])
    got = b.read_blocks(range(3))
    assert (got[0] == after[1]).all() and (got[2] == after[4]).all() and not got[1].any()
    c = pa.KVCache.create(be, num_layers=2, num_blocks=6, block_size=4, num_kv_heads=2,
                          head_size=32, dtype=pa.Dtype.FLOAT32)
    c.load_blocks([4, 1], after[[1, 4]])
    assert (c.read_blocks([4, 1]) == after[[1, 4]]).all()
    with pytest.raises(pa.PagedAttnError) as e:
        c.load_blocks([0, 0], after[[1, 4]])
    assert e.value.code == pa.Status.INVALID_ARGUMENT
    with pytest.raises(pa.PagedAttnError) as e:
        c.read_blocks([6])
    assert e.value.code == pa.Status.OUT_OF_RANGE


@pytest.mark.parametrize("layout", [pa.Layout.NHD, pa.Layout.HND])
def test_wrap_numpy_memory_in_place(be: pa.Backend, layout: pa.Layout) -> None:
    nb, bs, hkv, d = 4, 8, 2, 64
    shape = (nb, bs, hkv, d) if layout == pa.Layout.NHD else (nb, hkv, bs, d)
    ks = [np.zeros(shape, np.float16) for _ in range(2)]
    vs = [np.zeros(shape, np.float16) for _ in range(2)]
    cache = pa.KVCache.wrap(be, ks, vs, layout=layout)
    assert cache.desc == pa.CacheDesc(2, nb, bs, hkv, d, pa.Dtype.FLOAT16, layout, 0)
    row = np.arange(hkv * d, dtype=np.float16).reshape(1, hkv, d)
    cache.write(1, row, -row, [2 * bs + 5])
    want = ks[1][2, 5] if layout == pa.Layout.NHD else ks[1][2, :, 5]
    assert (want == row[0]).all()
    assert not ks[0].any()
    vwant = vs[1][2, 5] if layout == pa.Layout.NHD else vs[1][2, :, 5]
    assert (vwant == -row[0]).all()
    kptr, _, strides = cache.layer(1)
    assert kptr == ks[1].ctypes.data
    assert strides[0] == bs * hkv * d


def test_merge_states_matches_formula(be: pa.Backend) -> None:
    rng = np.random.default_rng(14)
    o1 = rng.uniform(-1, 1, (5, 4, 32)).astype(np.float32)
    o2 = rng.uniform(-1, 1, (5, 4, 32)).astype(np.float32)
    l1 = rng.uniform(-3, 3, (5, 4)).astype(np.float32)
    l2 = rng.uniform(-3, 3, (5, 4)).astype(np.float32)
    l2[0, 0] = -np.inf
    out, lse = pa.merge_states(be, o1, l1, o2, l2)
    m = np.logaddexp(l1.astype(np.float64), l2)
    ref = (np.exp(l1 - m)[..., None] * o1 + np.exp(l2 - m)[..., None] * o2)
    assert rel_err(out, ref) <= 1e-5
    assert np.allclose(lse, m, atol=1e-5)
    assert np.allclose(out[0, 0], o1[0, 0], atol=1e-6)


def test_fp8_cache_decode(be: pa.Backend) -> None:
    cache = pa.KVCache.create(be, num_layers=1, num_blocks=8, block_size=16, num_kv_heads=2,
                              head_size=64, dtype=pa.Dtype.FP8_E4M3)
    rng = np.random.default_rng(15)
    keys = rng.uniform(-1, 1, (20, 2, 64)).astype(np.float32)
    vals = rng.uniform(-1, 1, (20, 2, 64)).astype(np.float32)
    cache.write(0, keys[:19], vals[:19], np.arange(19) + 32, k_scale=0.01, v_scale=0.01)
    batch = pa.Batch(be, cache, [1], [19], [[2, 3]])
    q = rng.uniform(-1, 1, (1, 4, 64)).astype(np.float32)
    out = pa.forward(be, batch, cache, 0, q, keys[19:], vals[19:], k_scale=0.01, v_scale=0.01)
    ref, _ = decoder_attention(q, [keys], [vals], [1], [19])
    assert rel_err(out, ref) <= 6e-2  # fp8 rounding of K/V, not in this reference


def test_errors_are_per_thread(be: pa.Backend) -> None:
    errors: List[pa.PagedAttnError] = []

    def worker() -> None:
        try:
            pa.Backend("other-missing-backend")
        except pa.PagedAttnError as e:
            errors.append(e)

    th = threading.Thread(target=worker)
    th.start()
    th.join()
    assert errors and "other-missing-backend" in errors[0].message


def test_cross_attention_first_step_and_decode(be: pa.Backend) -> None:
    rng = np.random.default_rng(17)
    H, Hkv, D, bs = 4, 2, 32, 8
    cache = pa.KVCache.create(be, num_layers=1, num_blocks=16, block_size=bs, num_kv_heads=Hkv,
                              head_size=D, dtype=pa.Dtype.FLOAT32)
    enc_lens = [10, 3]
    xt = np.array([[5, 9], [12, 0]], dtype=np.int32)
    enc_k = rng.uniform(-1, 1, (13, Hkv, D)).astype(np.float32)
    enc_v = rng.uniform(-1, 1, (13, Hkv, D)).astype(np.float32)
    q = rng.uniform(-1, 1, (3, H, D)).astype(np.float32)
    b = pa.Batch(be, cache, [2, 1], [0, 0], [[1], [2]], cross_cache=cache,
                 encoder_lens=enc_lens, cross_block_tables=xt)
    want = [5 * bs + p for p in range(8)] + [9 * bs + p for p in range(2)] + \
        [12 * bs + p for p in range(3)]
    assert b.cross_slot_mapping.tolist() == want
    out = pa.forward(be, b, cache, 0, q, enc_k, enc_v, attention_type=pa.AttentionType.CROSS)

    def ref_rows(rows, keys, vals):
        res = []
        for qq in rows:
            hs = []
            for h in range(H):
                s = keys[:, h // 2].astype(np.float64) @ qq[h] / np.sqrt(D)
                e = np.exp(s - s.max())
                hs.append(e @ vals[:, h // 2] / e.sum())
            res.append(hs)
        return np.array(res)

    ref = np.concatenate([ref_rows(q[:2], enc_k[:10], enc_v[:10]),
                          ref_rows(q[2:], enc_k[10:], enc_v[10:])])
    assert rel_err(out, ref) <= 1e-5
    # A later decode step reads the stored encoder K/V without writing (k/v omitted).
    b.close()
    b2 = pa.Batch(be, cache, [1, 1], [2, 1], [[1], [2]], cross_cache=cache,
                  encoder_lens=enc_lens, cross_block_tables=xt)
    out2 = pa.forward(be, b2, cache, 0, q[1:], attention_type=pa.AttentionType.CROSS)
    ref2 = np.concatenate([ref_rows(q[1:2], enc_k[:10], enc_v[:10]),
                           ref_rows(q[2:], enc_k[10:], enc_v[10:])])
    assert rel_err(out2, ref2) <= 1e-5


def test_slot_mapping_inputs_of_several_kinds(be: pa.Backend) -> None:
    cache = pa.KVCache.create(be, num_layers=1, num_blocks=2, block_size=4, num_kv_heads=1,
                              head_size=8, dtype=pa.Dtype.FLOAT32)
    row = np.ones((2, 1, 8), np.float32)
    cache.write(0, row, row, np.array([1, 6], dtype=np.int32))
    cache.write(0, 2 * row, 2 * row, np.array([2, 7], dtype=np.uint8))  # widened to int64
    cache.write(0, 3 * row, 3 * row, (0, 5))
    k = cache.read_blocks([0, 1]).view(np.float32).reshape(2, 2, 4, 8)[:, 0, :, 0]
    assert k.tolist() == [[3, 1, 2, 0], [0, 3, 1, 2]]


def test_dtype_names_sizes_and_dlpack_types() -> None:
    want = {
        pa.Dtype.FLOAT32: ("float32", 4, (pa.DLPackCode.FLOAT, 32, 1)),
        pa.Dtype.FLOAT16: ("float16", 2, (pa.DLPackCode.FLOAT, 16, 1)),
        pa.Dtype.BFLOAT16: ("bfloat16", 2, (pa.DLPackCode.BFLOAT, 16, 1)),
        pa.Dtype.FP8_E4M3: ("fp8_e4m3", 1, (pa.DLPackCode.FLOAT8_E4M3FN, 8, 1)),
        pa.Dtype.FP8_E5M2: ("fp8_e5m2", 1, (pa.DLPackCode.FLOAT8_E5M2, 8, 1)),
    }
    assert set(want) == set(pa.Dtype)
    for dt, (name, size, dl) in want.items():
        assert dt.library_name == pa.dtype_name(dt) == name
        assert dt.itemsize == pa.dtype_size(dt) == size
        got = dt.to_dlpack()
        assert got == pa.dtype_to_dlpack(dt) == pa.DLPackDtype(*dl)
        assert isinstance(got.code, pa.DLPackCode)
        assert pa.Dtype.from_dlpack(got) is dt
        assert pa.dtype_from_dlpack(tuple(got)) is dt
        assert pa.dtype_from_dlpack(tuple(got)[:2]) is dt  # lanes default to 1
    # numpy arrays are described with the same codes the library maps.
    assert pa.dtype_from_dlpack((pa.DLPackCode.FLOAT, np.dtype(np.float16).itemsize * 8)) \
        is pa.Dtype.FLOAT16
    # Values that are not dtypes: the C functions' own answers.
    assert pa.dtype_name(0) == pa.dtype_name(99) == "invalid"
    assert pa.dtype_size(0) == 0
    with pytest.raises(pa.PagedAttnError) as e:
        pa.dtype_to_dlpack(0)
    assert e.value.code == pa.Status.INVALID_ARGUMENT and "dtype = 0" in e.value.message
    for bad, name in [((pa.DLPackCode.INT, 32), "int32"), ((pa.DLPackCode.FLOAT, 64), "float64"),
                      ((pa.DLPackCode.FLOAT, 32, 4), "float32x4")]:
        with pytest.raises(pa.PagedAttnTypeError) as e:
            pa.dtype_from_dlpack(bad)
        assert e.value.code == pa.Status.UNSUPPORTED
        assert f"DLPack dtype {name} is not supported" in e.value.message
    with pytest.raises(ValueError):
        pa.dtype_from_dlpack((2,))
    with pytest.raises(ValueError):
        pa.dtype_from_dlpack((2, 300))


def _closed_trio() -> Dict[str, Any]:
    """A backend, a cache, a batch and a second cache, all closed (the backend first)."""
    be = pa.Backend("cpu", num_threads=1)
    cache = pa.KVCache.create(be, num_layers=1, num_blocks=4, block_size=16, num_kv_heads=2,
                              head_size=64, dtype=pa.Dtype.FLOAT32)
    other = pa.KVCache.create(be, num_layers=1, num_blocks=4, block_size=16, num_kv_heads=2,
                              head_size=64, dtype=pa.Dtype.FLOAT32)
    batch = pa.Batch(be, cache, [1], [3], [[2]])
    for h in (be, batch, cache, other):
        h.close()
        h.close()  # idempotent
        assert h.closed and "closed" in repr(h)
    return {"be": be, "cache": cache, "other": other, "batch": batch}


def test_every_method_after_close_raises_invalid_handle(be: pa.Backend) -> None:
    h = _closed_trio()
    cbe, cache, other, batch = h["be"], h["cache"], h["other"], h["batch"]
    live = pa.KVCache.create(be, num_layers=1, num_blocks=4, block_size=16, num_kv_heads=2,
                             head_size=64, dtype=pa.Dtype.FLOAT32)
    live_batch = pa.Batch(be, live, [1], [3], [[2]])
    q = np.zeros((1, 8, 64), np.float32)
    kv = np.zeros((1, 2, 64), np.float32)
    o = np.zeros((1, 8, 64), np.float32)
    lse = np.zeros((1, 8), np.float32)
    calls: Dict[str, Dict[str, Any]] = {
        "Backend": {
            "__enter__": lambda: cbe.__enter__(),
            "capabilities": lambda: cbe.capabilities,
            "name": lambda: cbe.name,
            "synchronize": lambda: cbe.synchronize(),
            "memory_usage": lambda: cbe.memory_usage(),
            "forward": lambda: cbe.forward(live_batch, live, 0, q, kv, kv),
            "forward_mla": lambda: cbe.forward_mla(live_batch, live, 0, q[..., :32], q[..., 32:]),
            "merge_states": lambda: cbe.merge_states(o, lse, o, lse),
        },
        "KVCache": {
            "__enter__": lambda: cache.__enter__(),
            "__init__": lambda: pa.KVCache(cbe, num_layers=1, num_blocks=4, block_size=16,
                                           num_kv_heads=2, head_size=64, dtype=pa.Dtype.FLOAT32),
            "create": lambda: pa.KVCache.create(cbe, num_layers=1, num_blocks=4, block_size=16,
                                                num_kv_heads=2, head_size=64,
                                                dtype=pa.Dtype.FLOAT32),
            "wrap": lambda: pa.KVCache.wrap(cbe, [np.zeros((4, 16, 2, 64), np.float32)],
                                            [np.zeros((4, 16, 2, 64), np.float32)]),
            "desc": lambda: cache.desc,
            "bytes_per_block": lambda: cache.bytes_per_block,
            "latent": lambda: cache.latent,
            "layer": lambda: cache.layer(0),
            "write": lambda: cache.write(0, kv, kv, [0]),
            "write_latent": lambda: cache.write_latent(0, kv[:, 0], None, [0]),
            "copy_blocks": lambda: cache.copy_blocks([(0, 1)]),
            "swap_blocks": lambda: cache.swap_blocks(live, [(0, 1)]),
            "read_blocks": lambda: cache.read_blocks([0]),
            "load_blocks": lambda: cache.load_blocks([0], np.zeros(live.bytes_per_block,
                                                                   np.uint8)),
        },
        "Batch": {
            "__enter__": lambda: batch.__enter__(),
            "update": lambda: batch.update([1], [4], [[2]]),
            "info": lambda: batch.info,
            "num_tokens": lambda: batch.num_tokens,
            "slot_mapping": lambda: batch.slot_mapping,
            "cross_slot_mapping": lambda: batch.cross_slot_mapping,
            "query_start": lambda: batch.query_start,
        },
    }
    # Every public method and property is covered (a new one must be added here).
    for cls in (pa.Backend, pa.KVCache, pa.Batch):
        public = {n for n in dir(cls) if not n.startswith("_")} - {"close", "closed"}
        assert public <= set(calls[cls.__name__]), public - set(calls[cls.__name__])
    # Closed handles given to calls on live objects.
    calls["other objects"] = {
        "forward(closed batch)": lambda: pa.forward(be, batch, live, 0, q, kv, kv),
        "forward(closed cache)": lambda: pa.forward(be, live_batch, cache, 0, q, kv, kv),
        "forward_mla(closed batch)": lambda: pa.forward_mla(be, batch, live, 0, q, out=q),
        "forward_mla(closed cache)": lambda: pa.forward_mla(be, live_batch, cache, 0, q, out=q),
        "swap_blocks(closed src)": lambda: live.swap_blocks(other, [(0, 1)]),
        "Batch(closed backend)": lambda: pa.Batch(cbe, live, [1], [0], [[0]]),
        "Batch(closed cache)": lambda: pa.Batch(be, cache, [1], [0], [[0]]),
        "Batch(closed cross cache)": lambda: pa.Batch(be, live, [1], [0], [[0]],
                                                      cross_cache=cache, encoder_lens=[1],
                                                      cross_block_tables=[[0]]),
    }
    before = live.read_blocks(range(4))
    for group, fns in calls.items():
        for what, fn in fns.items():
            with pytest.raises(pa.PagedAttnError) as e:
                fn()
            assert e.value.code == pa.Status.INVALID_HANDLE, f"{group}.{what}: {e.value}"
            assert "closed" in e.value.message, f"{group}.{what}: {e.value.message}"
    assert np.array_equal(live.read_blocks(range(4)), before)  # nothing written
    live_batch.close()
    live.close()


def test_closing_in_any_order_is_safe() -> None:
    rng = np.random.default_rng(21)
    q = rng.uniform(-1, 1, (1, 8, 64)).astype(np.float32)
    kv = rng.uniform(-1, 1, (1, 2, 64)).astype(np.float32)

    def trio():
        b = pa.Backend("cpu", num_threads=1)
        c = pa.KVCache.create(b, num_layers=1, num_blocks=4, block_size=16, num_kv_heads=2,
                              head_size=64, dtype=pa.Dtype.FLOAT32)
        return b, c, pa.Batch(b, c, [1], [0], [[1]], max_num_seqs=2, max_num_tokens=2,
                              max_seq_len=16)

    # Backend first: the C backend lives on while the cache and batch exist, and both keep
    # working through every method that does not take the backend object.
    b, c, bt = trio()
    out = pa.forward(b, bt, c, 0, q, kv, kv)
    b.close()
    c.write(0, kv, kv, [17])
    c.copy_blocks([(1, 2)])
    assert np.array_equal(c.read_blocks([1]), c.read_blocks([2]))
    c.load_blocks([3], c.read_blocks([1]))
    assert c.desc.num_blocks == 4 and c.layer(0)[0] != 0
    bt.update([1, 1], [1, 0], [[1], [3]])
    assert bt.info.num_seqs == 2 and bt.slot_mapping.tolist() == [17, 48]
    with pytest.raises(pa.PagedAttnError) as e:
        pa.forward(b, bt, c, 0, q, kv, kv)
    assert e.value.code == pa.Status.INVALID_HANDLE
    bt.close()
    c.close()
    assert np.isfinite(out).all()

    # Cache first, then backend, then batch: the batch outlives both and still answers.
    b, c, bt = trio()
    c.close()
    b.close()
    assert bt.query_start.tolist() == [0, 1]
    bt.close()

    # Every permutation of close(), then the finalizers of objects never closed, in whatever
    # order the garbage collector picks.
    for order in itertools.permutations(range(3)):
        objs = trio()
        for i in order:
            objs[i].close()
    b, c, bt = trio()
    del b, c, bt
    gc.collect()
