"""Speculative-decoding tree masks on a batch (docs/semantics.md 4.7) against the float64 numpy
reference: random draft trees, the chain that equals no mask, packing, updates, the refusals
and the feature bit."""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import pytest

import pagedattn as pa
from test_api import TOL, Scenario, as_f64, rel_err

# Decode, chunked prefill, idle and plain prefill sequences in one batch.
QLENS = (1, 6, 1, 0, 9, 4)
CLENS = (30, 12, 7, 3, 19, 0)


def draft_tree(q: int, rng: np.random.Generator) -> np.ndarray:
    """A random draft tree over q tokens in topological order: token r > 0 hangs under a parent
    drawn from 0..r-1 and sees its parent's ancestors and itself."""
    m = np.zeros((q, q), dtype=bool)
    for r in range(q):
        if r:
            m[r] = m[rng.integers(r)]
        m[r, r] = True
    return m


def trees(qlens: Sequence[int], seed: int, causal_every: int = 3) -> List[Optional[np.ndarray]]:
    """One mask per sequence: a draft tree, or None (causal) for every causal_every-th."""
    rng = np.random.default_rng(seed)
    return [None if q == 0 or i % causal_every == causal_every - 1 else draft_tree(q, rng)
            for i, q in enumerate(qlens)]


def plan(be: pa.Backend, sc: Scenario, **kw) -> pa.Batch:
    return pa.Batch(be, sc.cache, sc.query_lens, sc.context_lens, sc.tables, **kw)


def test_feature_bit(be: pa.Backend) -> None:
    assert pa.Feature.TREE_MASK == 1 << 15
    assert pa.Feature.TREE_MASK in be.capabilities.features


def test_pack_tree_masks_is_numpys_packbits() -> None:
    rng = np.random.default_rng(1)
    masks = [draft_tree(5, rng), None, draft_tree(1, rng), draft_tree(8, rng)]
    mask, indptr = pa.pack_tree_masks(masks)
    assert mask.dtype == np.uint8 and indptr.dtype == np.int64
    assert indptr.tolist() == [0, 4, 4, 5, 13]
    for i, m in enumerate(masks):
        seg = mask[indptr[i]:indptr[i + 1]]
        if m is None:
            assert seg.size == 0
        else:
            want = np.packbits(m.reshape(-1), bitorder="little")
            assert seg.tobytes() == want.tobytes()
            bits = np.unpackbits(seg, bitorder="little")[:m.size].reshape(m.shape)
            assert (bits.astype(bool) == m).all()
    # Integer matrices count non-zero entries as set.
    assert pa.pack_tree_masks([masks[0].astype(np.int32) * 7])[0].tobytes() == \
        mask[:4].tobytes()
    with pytest.raises(ValueError, match="square"):
        pa.pack_tree_masks([np.ones((2, 3), dtype=bool)])
    with pytest.raises(TypeError, match="boolean"):
        pa.pack_tree_masks([np.eye(3)])


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_draft_trees_match_reference(be: pa.Backend, dt: str) -> None:
    sc = Scenario(be, dt, query_lens=QLENS, context_lens=CLENS, seed=70)
    masks = trees(QLENS, 70)
    assert any(m is not None and m.shape[0] > 1 and not np.tril(m).all() for m in masks)
    with plan(be, sc, tree_mask=masks) as batch:
        assert batch.info.max_tree_mask_bytes == sum(-(-q * q // 8) for q, m in
                                                    zip(QLENS, masks) if m is not None)
        out, lse = pa.forward(be, batch, sc.cache, 0, sc.q, sc.k, sc.v, lse=True)
    ref, ref_lse = sc.reference(tree_masks=masks)
    assert rel_err(as_f64(out), ref) <= TOL[dt]
    assert np.allclose(lse, ref_lse, rtol=max(TOL[dt], 1e-5), atol=1e-5)
    # The masks matter: the causal reference is far off.
    assert rel_err(as_f64(out), sc.reference()[0]) > 0.05


def test_packed_bytes_and_matrices_plan_the_same(be: pa.Backend) -> None:
    sc = Scenario(be, "f32", query_lens=QLENS, context_lens=CLENS, seed=71)
    masks = trees(QLENS, 71)
    mask, indptr = pa.pack_tree_masks(masks)
    outs = []
    for kw in (dict(tree_mask=masks),
               dict(tree_mask=mask, tree_mask_indptr=indptr),
               dict(tree_mask=mask.tobytes(), tree_mask_indptr=indptr.tolist()),
               dict(tree_mask=bytearray(mask.tobytes()), tree_mask_indptr=indptr)):
        with plan(be, sc, **kw) as batch:
            outs.append(pa.forward(be, batch, sc.cache, 0, sc.q, sc.k, sc.v).tobytes())
    assert len(set(outs)) == 1
    # The SEQ length form takes masks too.
    seq_lens = [q + c for q, c in zip(QLENS, CLENS)]
    qsl = np.concatenate([[0], np.cumsum(QLENS)]).tolist()
    with pa.Batch(be, sc.cache, seq_lens=seq_lens, query_start_loc=qsl, block_tables=sc.tables,
                  tree_mask=masks) as batch:
        assert pa.forward(be, batch, sc.cache, 0, sc.q, sc.k, sc.v).tobytes() == outs[0]


def test_chain_mask_equals_no_mask(be: pa.Backend) -> None:
    sc = Scenario(be, "bf16", query_lens=QLENS, context_lens=CLENS, seed=72)
    chain = [np.tril(np.ones((q, q), dtype=bool)) for q in QLENS]
    plain = pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v, lse=True)
    with plan(be, sc, tree_mask=chain) as batch:
        masked = pa.forward(be, batch, sc.cache, 0, sc.q, sc.k, sc.v, lse=True)
    assert masked[0].array.tobytes() == plain[0].array.tobytes()
    assert masked[1].tobytes() == plain[1].tobytes()
    assert rel_err(as_f64(masked[0]), sc.reference()[0]) <= TOL["bf16"]


def test_torch_bool_masks(be: pa.Backend) -> None:
    torch = pytest.importorskip("torch", reason="python3-torch not installed")
    sc = Scenario(be, "f32", query_lens=QLENS, context_lens=CLENS, seed=73)
    masks = trees(QLENS, 73)
    with plan(be, sc, tree_mask=[None if m is None else torch.from_numpy(m) for m in masks]) as b:
        out = pa.forward(be, b, sc.cache, 0, sc.q, sc.k, sc.v)
    assert rel_err(out, sc.reference(tree_masks=masks)[0]) <= 1e-5


def test_update_into_masked_steps(be: pa.Backend) -> None:
    sc = Scenario(be, "f32", query_lens=QLENS, context_lens=CLENS, seed=74)
    masks = trees(QLENS, 74)
    need = int(pa.pack_tree_masks(masks)[1][-1])
    # Planned causal with room for the masks of later steps.
    batch = plan(be, sc, max_tree_mask_bytes=need)
    assert batch.info.max_tree_mask_bytes == need
    batch.update(sc.query_lens, sc.context_lens, sc.tables, tree_mask=masks)
    out = pa.forward(be, batch, sc.cache, 0, sc.q, sc.k, sc.v)
    assert rel_err(out, sc.reference(tree_masks=masks)[0]) <= 1e-5
    # An update without masks is causal again (masks belong to the step).
    batch.update(sc.query_lens, sc.context_lens, sc.tables)
    out = pa.forward(be, batch, sc.cache, 0, sc.q, sc.k, sc.v, write_kv=False)
    assert rel_err(out, sc.reference()[0]) <= 1e-5
    # More bytes than planned: CAPACITY, and the batch keeps its contents.
    big = [np.tril(np.ones((q, q), dtype=bool)) for q in QLENS]
    with pytest.raises(pa.PagedAttnError) as e:
        batch.update(sc.query_lens, sc.context_lens, sc.tables, tree_mask=big)
    assert e.value.code == pa.Status.CAPACITY and e.value.message
    out = pa.forward(be, batch, sc.cache, 0, sc.q, sc.k, sc.v, write_kv=False)
    assert rel_err(out, sc.reference()[0]) <= 1e-5
    # A batch created without masks or capacity takes none.
    with pytest.raises(pa.PagedAttnError) as e:
        sc.batch.update(sc.query_lens, sc.context_lens, sc.tables, tree_mask=masks)
    assert e.value.code == pa.Status.CAPACITY


def test_library_refuses_malformed_masks(be: pa.Backend) -> None:
    sc = Scenario(be, "f32", query_lens=(1, 4, 3), context_lens=(5, 9, 0), seed=75)
    good = [np.ones((1, 1), bool), np.tril(np.ones((4, 4), bool)), None]
    diag = [m.copy() if m is not None else None for m in good]
    diag[1][2, 2] = False
    above = [m.copy() if m is not None else None for m in good]
    above[1][1, 3] = True
    mask, indptr = pa.pack_tree_masks(good)  # indptr [0, 1, 3, 3]
    cases = [
        (dict(tree_mask=diag), "row 2 does not see itself"),
        (dict(tree_mask=above), "row 1 sees the later token 3"),
        (dict(tree_mask=np.concatenate([[0], mask]).astype(np.uint8),
              tree_mask_indptr=indptr + 1), "tree_mask_indptr[0] = 1"),
        (dict(tree_mask=mask, tree_mask_indptr=[0, 1, 2, 2]),   # 1 byte for 4 x 4 bits
         "sequence 1's tree mask has 1 bytes"),
        (dict(tree_mask=mask, tree_mask_indptr=[0, 1, 0, 3]), "tree_mask_indptr[2] = 0"),
    ]
    for kw, words in cases:
        with pytest.raises(pa.PagedAttnError) as e:
            plan(be, sc, **kw)
        assert e.value.code == pa.Status.INVALID_ARGUMENT, e.value
        assert words in e.value.message, e.value.message
        # Update validates as create does, and keeps the batch's contents.
        before = sc.batch.slot_mapping
        with pytest.raises(pa.PagedAttnError) as e:
            sc.batch.update(sc.query_lens, sc.context_lens, sc.tables, **kw)
        assert e.value.code in (pa.Status.INVALID_ARGUMENT, pa.Status.CAPACITY)
        assert (sc.batch.slot_mapping == before).all()


def test_binding_refuses_what_the_library_would_read_past(be: pa.Backend) -> None:
    sc = Scenario(be, "f32", query_lens=(1, 4, 3), context_lens=(5, 9, 0), seed=76)
    good = [np.ones((1, 1), bool), np.tril(np.ones((4, 4), bool)), None]
    mask, indptr = pa.pack_tree_masks(good)
    bad = [
        (dict(tree_mask=good[:2]), ValueError, "tree_mask has 2 entries, needs 3"),
        (dict(tree_mask=[good[0], np.ones((3, 3), bool), None]), ValueError,
         r"tree_mask\[1\] has shape \(3, 3\), needs \(4, 4\)"),
        (dict(tree_mask=mask), ValueError, "needs tree_mask_indptr"),
        (dict(tree_mask_indptr=indptr), ValueError, "goes with a packed tree_mask"),
        (dict(tree_mask=good, tree_mask_indptr=indptr), ValueError, "goes with a packed"),
        (dict(tree_mask=mask, tree_mask_indptr=indptr[:3]), ValueError,
         "tree_mask_indptr has 3 entries, needs 4"),
        (dict(tree_mask=mask[:2], tree_mask_indptr=indptr), ValueError,
         "tree_mask has 2 bytes, tree_mask_indptr reaches 3"),
        (dict(tree_mask=[good[0], np.eye(4), None]), TypeError, "boolean"),
    ]
    for kw, exc, words in bad:
        with pytest.raises(exc, match=words):
            plan(be, sc, **kw)
        with pytest.raises(exc, match=words):
            sc.batch.update(sc.query_lens, sc.context_lens, sc.tables, **kw)
    with pytest.raises(OverflowError, match="max_tree_mask_bytes"):
        plan(be, sc, max_tree_mask_bytes=1 << 63)


def test_forward_on_a_tree_batch_refuses_positional_options(be: pa.Backend) -> None:
    sc = Scenario(be, "f32", query_lens=(1, 4), context_lens=(5, 9), seed=77)
    alibi = (2.0 ** (-8.0 * (np.arange(sc.H) + 1) / sc.H)).astype(np.float32)
    before = sc.cache.read_blocks(range(32))
    # Planned with masks, or only with room for them (an update could add them): both refuse.
    for kw in (dict(tree_mask=[None, draft_tree(4, np.random.default_rng(77))]),
               dict(max_tree_mask_bytes=2)):
        with plan(be, sc, **kw) as batch:
            out = np.full(sc.q.shape, 7.0, np.float32)
            for opts in (dict(sliding_window=4), dict(alibi_slopes=alibi),
                         dict(attention_chunk=8),
                         dict(attention_type=pa.AttentionType.ENCODER)):
                with pytest.raises(pa.PagedAttnError) as e:
                    pa.forward(be, batch, sc.cache, 0, sc.q, sc.k, sc.v, out=out, **opts)
                assert e.value.code == pa.Status.INVALID_ARGUMENT, opts
                assert "tree masks" in e.value.message
            assert (out == 7.0).all()
    assert (sc.cache.read_blocks(range(32)) == before).all()
