"""Multi-head latent attention (MLA, docs/semantics.md section 8): latent caches, write_latent
and forward_mla against a float64 numpy reference, the refusals between plain and latent
caches, and the feature bit and capabilities field that announce them."""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np
import pytest

import pagedattn as pa
from reference import rel_err
from test_api import TOL, as_f64, cache_dtype, rounded

# DeepSeek V3's shape: 16 heads (one tensor-parallel shard), rows of 512 + 64.
H, D, R = 16, 576, 512


def mla_reference(q: np.ndarray, rows: Sequence[np.ndarray], query_lens: Sequence[int],
                  context_lens: Sequence[int], scale: float = 0.0
                  ) -> Tuple[np.ndarray, np.ndarray]:
    """q: [T, H, D]; rows[i]: every latent row of sequence i, [context + query, D]. Each key's
    row is its key (all D values) and its value (the leading R). Returns (out [T, H, R],
    lse [T, H]) in float64."""
    T = q.shape[0]
    out = np.zeros((T, H, R))
    lse = np.zeros((T, H))
    scale = scale or 1.0 / np.sqrt(D)
    t = 0
    for i, (ql, cl) in enumerate(zip(query_lens, context_lens)):
        rows_i = np.asarray(rows[i], dtype=np.float64)
        for j in range(ql):
            visible = rows_i[:cl + j + 1]
            s = visible @ q[t].T * scale  # [keys, H]
            m = s.max(axis=0)
            e = np.exp(s - m)
            total = e.sum(axis=0)
            out[t] = (e.T @ visible[:, :R]) / total[:, None]
            lse[t] = m + np.log(total)
            t += 1
    return out, lse


class MlaStep:
    """Random latent rows of a few sequences in a latent cache with shuffled block tables. The
    context rows go in through the two-tensor form of write_latent (kv_c, k_pe), the step's new
    rows through the whole-row form (k_pe None), as an engine writes them before the forward."""

    def __init__(self, be: pa.Backend, dt: str, query_lens: Sequence[int],
                 context_lens: Sequence[int], bs: int, seed: int, k_pe_3d: bool = False) -> None:
        rng = np.random.default_rng(seed)
        self.dt, self.bs = dt, bs
        self.query_lens, self.context_lens = list(query_lens), list(context_lens)
        need = [-(-(q + c) // bs) for q, c in zip(query_lens, context_lens)]
        nb = sum(need) + 3
        self.cache = pa.KVCache(be, num_layers=2, num_blocks=nb, block_size=bs, num_kv_heads=1,
                                head_size=D, dtype=cache_dtype(dt), latent=True)
        perm = [int(x) for x in rng.permutation(nb)]
        self.tables: List[List[int]] = []
        for n in need:
            self.tables.append(perm[:n])
            perm = perm[n:]
        self.rows: List[np.ndarray] = []
        ctx_rows, ctx_slots, new_rows, new_slots = [], [], [], []
        for i, (q, c) in enumerate(zip(query_lens, context_lens)):
            raw = rng.uniform(-1, 1, (c + q, D)).astype(np.float32)
            self.rows.append(rounded(raw, dt)[1])
            slots = [self.tables[i][p // bs] * bs + p % bs for p in range(c + q)]
            ctx_rows.append(raw[:c])
            ctx_slots += slots[:c]
            new_rows.append(raw[c:])
            new_slots += slots[c:]
        ctx = np.concatenate(ctx_rows)
        kv_c, _ = rounded(np.ascontiguousarray(ctx[:, :R]), dt)
        pe = np.ascontiguousarray(ctx[:, R:])
        k_pe, _ = rounded(pe.reshape(-1, 1, D - R) if k_pe_3d else pe, dt)
        self.cache.write_latent(1, kv_c, k_pe, np.asarray(ctx_slots, dtype=np.int64))
        whole, _ = rounded(np.concatenate(new_rows), dt)
        self.cache.write_latent(1, whole, None, new_slots)
        T = sum(query_lens)
        q_raw = rng.uniform(-1, 1, (T, H, D)).astype(np.float32)
        self.q, self.qf = rounded(q_raw, dt)
        self.q_nope, _ = rounded(np.ascontiguousarray(q_raw[:, :, :R]), dt)
        self.q_pe, _ = rounded(np.ascontiguousarray(q_raw[:, :, R:]), dt)
        self.batch = pa.Batch(be, self.cache, self.query_lens, self.context_lens, self.tables)

    def reference(self, scale: float = 0.0) -> Tuple[np.ndarray, np.ndarray]:
        return mla_reference(self.qf, self.rows, self.query_lens, self.context_lens, scale)


def test_feature_bit_and_latent_sizes(be: pa.Backend) -> None:
    caps = be.capabilities
    assert pa.Feature.MLA == 1 << 16
    assert pa.Feature.MLA in caps.features
    assert D in caps.latent_sizes
    assert all(s % 32 == 0 and 32 <= s <= 1024 for s in caps.latent_sizes)
    assert list(caps.latent_sizes) == sorted(caps.latent_sizes)


@pytest.mark.parametrize("dt,bs", [("f32", 16), ("bf16", 64), ("bf16", 16), ("f32", 64)])
def test_decode_matches_reference(be: pa.Backend, dt: str, bs: int) -> None:
    step = MlaStep(be, dt, query_lens=(1, 1, 1, 1), context_lens=(37, 5, 130, 64), bs=bs,
                   seed=60 + bs, k_pe_3d=(bs == 64))
    out, lse = pa.forward_mla(be, step.batch, step.cache, 1, step.q_nope, step.q_pe, lse=True)
    assert tuple(out.shape) == (4, H, R)
    ref, ref_lse = step.reference()
    assert rel_err(as_f64(out), ref) <= TOL[dt]
    assert np.allclose(lse, ref_lse, rtol=max(TOL[dt], 1e-5), atol=1e-5)
    # The other layer holds no rows: the cache is written per layer.
    zero = pa.forward_mla(be, step.batch, step.cache, 0, step.q_nope, step.q_pe)
    assert not as_f64(zero).any()


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_prefill_and_chunked_prefill_match_reference(be: pa.Backend, dt: str) -> None:
    # A fresh prompt, a decode and a chunk of a prompt with context, in one step.
    step = MlaStep(be, dt, query_lens=(9, 1, 20), context_lens=(0, 40, 13), bs=16, seed=70)
    out = be.forward_mla(step.batch, step.cache, 1, step.q_nope, step.q_pe, scale=0.1352)
    ref, _ = step.reference(scale=0.1352)
    assert rel_err(as_f64(out), ref) <= TOL[dt]


def test_whole_query_rows_with_out(be: pa.Backend) -> None:
    step = MlaStep(be, "f32", query_lens=(1, 3), context_lens=(50, 17), bs=64, seed=71)
    out = np.full((4, H, R), np.nan, dtype=np.float32)
    got = pa.forward_mla(be, step.batch, step.cache, 1, step.q, out=out)
    assert got is out
    ref, _ = step.reference()
    assert rel_err(out, ref) <= TOL["f32"]
    # value_size allocates the output instead.
    again = pa.forward_mla(be, step.batch, step.cache, 1, step.q, value_size=R)
    assert np.array_equal(again, out)
    with pytest.raises(ValueError, match="value_size"):
        pa.forward_mla(be, step.batch, step.cache, 1, step.q)


def test_latent_cache_geometry_and_wrap(be: pa.Backend) -> None:
    bpb = pa.bytes_per_block(3, 16, 1, D, pa.Dtype.BFLOAT16, latent=True)
    assert bpb == 3 * 16 * D * 2  # one row per slot, no V
    assert bpb * 2 == pa.bytes_per_block(3, 16, 1, D, pa.Dtype.BFLOAT16)
    with pa.KVCache(be, num_layers=1, num_blocks=4, block_size=16, num_kv_heads=1, head_size=D,
                    dtype=pa.Dtype.FLOAT32, latent=True) as cache:
        assert cache.latent and cache.desc.latent
        assert cache.bytes_per_block == 16 * D * 4
    # A wrapped latent cache: the caller's array holds the rows written.
    mem = np.zeros((4, 16, 1, D), dtype=np.float32)
    rows = np.random.default_rng(72).uniform(-1, 1, (3, D)).astype(np.float32)
    with pa.KVCache.wrap(be, [mem], None, latent=True) as cache:
        assert cache.latent
        cache.write_latent(0, rows[:, :R], rows[:, R:], [2 * 16 + 5, 7, 3 * 16])
    assert np.array_equal(mem[2, 5, 0], rows[0])
    assert np.array_equal(mem[0, 7, 0], rows[1])
    assert np.array_equal(mem[3, 0, 0], rows[2])
    with pytest.raises(ValueError):
        pa.KVCache.wrap(be, [mem], [mem], latent=True)
    with pytest.raises(ValueError):
        pa.KVCache.wrap(be, [mem], None)


def test_plain_and_latent_caches_refuse_each_others_calls(be: pa.Backend) -> None:
    step = MlaStep(be, "f32", query_lens=(1,), context_lens=(20,), bs=16, seed=73)
    q = np.zeros((1, H, D), dtype=np.float32)
    k = np.zeros((1, 1, D), dtype=np.float32)
    # A latent cache in the plain forward.
    with pytest.raises(pa.PagedAttnError) as e:
        pa.forward(be, step.batch, step.cache, 1, q, k, k, num_kv_heads=1, write_kv=False)
    assert e.value.code == pa.Status.INVALID_ARGUMENT
    # ... and in the plain write.
    with pytest.raises(pa.PagedAttnError) as e:
        step.cache.write(1, k, k, [0])
    assert e.value.code == pa.Status.INVALID_ARGUMENT
    # A plain cache (one KV head of 64, rows that would be 32 + 32) in forward_mla and
    # write_latent.
    with pa.KVCache(be, num_layers=1, num_blocks=4, block_size=16, num_kv_heads=1, head_size=64,
                    dtype=pa.Dtype.FLOAT32) as plain:
        with pa.Batch(be, plain, [1], [20], [[2, 0]]) as batch:
            half = np.ones((1, H, 32), dtype=np.float32)
            out = np.full((1, H, 32), 7.0, dtype=np.float32)
            with pytest.raises(pa.PagedAttnError) as e:
                pa.forward_mla(be, batch, plain, 0, half, half, out=out)
            assert e.value.code == pa.Status.INVALID_ARGUMENT
            assert (out == 7.0).all()  # nothing written
        with pytest.raises(pa.PagedAttnError) as e:
            plain.write_latent(0, half[:, 0], half[:, 0], [0])
        assert e.value.code == pa.Status.INVALID_ARGUMENT


def test_write_latent_checks_its_arguments(be: pa.Backend) -> None:
    step = MlaStep(be, "f32", query_lens=(1,), context_lens=(3,), bs=16, seed=74)
    rows = np.zeros((2, D), dtype=np.float32)
    with pytest.raises(pa.PagedAttnError) as e:
        step.cache.write_latent(0, rows, None, [0, 10_000])
    assert e.value.code == pa.Status.OUT_OF_RANGE
    with pytest.raises(pa.PagedAttnError) as e:  # kv_c and k_pe that do not add up to D
        step.cache.write_latent(0, rows[:, :R], rows[:, R:D - 1], [0, 1])
    assert e.value.code in (pa.Status.BAD_TENSOR, pa.Status.INVALID_ARGUMENT)
    with pytest.raises(OverflowError):
        step.cache.write_latent(1 << 32, rows, None, [0, 1])
