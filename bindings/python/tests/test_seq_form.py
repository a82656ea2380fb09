"""Batches from the SEQ length form (seq_lens + query_start_loc, as vLLM v1 and FlashInfer hold
them) plan what the CONTEXT form (query_lens + context_lens) plans."""

from __future__ import annotations

from typing import List, Sequence

import numpy as np
import pytest

import pagedattn as pa
from test_api import Scenario, rel_err


def seq_form(query_lens: Sequence[int], context_lens: Sequence[int]):
    """(seq_lens, query_start_loc) of a batch given in the CONTEXT form."""
    seq_lens = [q + c for q, c in zip(query_lens, context_lens)]
    query_start_loc: List[int] = [0]
    for q in query_lens:
        query_start_loc.append(query_start_loc[-1] + q)
    return seq_lens, query_start_loc


def test_seq_form_plans_the_same_batch(be: pa.Backend) -> None:
    sc = Scenario(be, "f32", query_lens=(2, 0, 7, 1), context_lens=(14, 3, 9, 30), seed=60)
    seq_lens, qsl = seq_form(sc.query_lens, sc.context_lens)
    for lens, starts in ((seq_lens, qsl), (np.asarray(seq_lens, np.int32),
                                          np.asarray(qsl, np.int64))):
        with pa.Batch(be, sc.cache, seq_lens=lens, query_start_loc=starts,
                      block_tables=sc.tables) as b:
            assert b.query_start.tolist() == qsl
            assert b.slot_mapping.tolist() == sc.batch.slot_mapping.tolist()
            assert b.info == sc.batch.info
            out_seq = pa.forward(be, b, sc.cache, 0, sc.q, sc.k, sc.v)
            out_ctx = pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v)
            assert out_seq.tobytes() == out_ctx.tobytes()
            assert rel_err(out_seq, sc.reference()[0]) <= 1e-5


def test_update_takes_either_form(be: pa.Backend) -> None:
    sc = Scenario(be, "f32", query_lens=(1, 1, 1), context_lens=(5, 17, 40), seed=61)
    seq_lens, qsl = seq_form(sc.query_lens, sc.context_lens)
    b = pa.Batch(be, sc.cache, [1, 1], [3, 4], [sc.tables[0], sc.tables[1]], max_num_seqs=3,
                 max_num_tokens=3, max_blocks_per_seq=3, max_seq_len=64)
    b.update(seq_lens=seq_lens, query_start_loc=qsl, block_tables=sc.tables)
    assert rel_err(pa.forward(be, b, sc.cache, 0, sc.q, sc.k, sc.v), sc.reference()[0]) <= 1e-5
    b.update([1, 1], [3, 4], [sc.tables[0], sc.tables[1]])
    assert b.query_start.tolist() == [0, 1, 2]
    s = pa.Batch(be, sc.cache, seq_lens=[4], query_start_loc=[0, 1], block_tables=[sc.tables[0]],
                 max_num_seqs=3, max_num_tokens=3, max_blocks_per_seq=3, max_seq_len=64)
    s.update(sc.query_lens, sc.context_lens, sc.tables)
    assert s.slot_mapping.tolist() == sc.batch.slot_mapping.tolist()
    with pytest.raises(pa.PagedAttnError) as e:
        s.update(seq_lens=[1] * 4, query_start_loc=[0, 1, 2, 3, 4], block_tables=[[0]] * 4)
    assert e.value.code == pa.Status.CAPACITY


def test_seq_form_with_cross_attention(be: pa.Backend) -> None:
    cache = pa.KVCache(be, num_layers=1, num_blocks=16, block_size=8, num_kv_heads=2,
                       head_size=32, dtype=pa.Dtype.FLOAT32)
    xt = [[5, 9], [12, 0]]
    ctx = pa.Batch(be, cache, [2, 1], [0, 0], [[1], [2]], cross_cache=cache,
                   encoder_lens=[10, 3], cross_block_tables=xt)
    seq = pa.Batch(be, cache, seq_lens=[2, 1], query_start_loc=[0, 2, 3],
                   block_tables=[[1], [2]], cross_cache=cache, encoder_lens=[10, 3],
                   cross_block_tables=xt)
    assert seq.cross_slot_mapping.tolist() == ctx.cross_slot_mapping.tolist()
    # Kept encoder_lens and cross tables go with an update in the SEQ form.
    seq.update(seq_lens=[3, 2], query_start_loc=[0, 1, 2], block_tables=[[1], [2]])
    assert seq.info.num_decode_seqs == 2


def test_form_mistakes_are_refused(be: pa.Backend) -> None:
    sc = Scenario(be, "f32", seed=62)
    tables = sc.tables
    with pytest.raises(ValueError, match="not both forms"):
        pa.Batch(be, sc.cache, [1, 1, 1], seq_lens=[6, 18, 41], query_start_loc=[0, 1, 2, 3],
                 block_tables=tables)
    with pytest.raises(ValueError, match="go together"):
        pa.Batch(be, sc.cache, seq_lens=[6, 18, 41], block_tables=tables)
    with pytest.raises(ValueError, match="go together"):
        sc.batch.update(query_start_loc=[0, 1, 2, 3], block_tables=tables)
    # query_start_loc must have num_seqs + 1 entries: the library reads that many.
    with pytest.raises(ValueError, match="needs len\\(seq_lens\\) \\+ 1 = 4"):
        pa.Batch(be, sc.cache, seq_lens=[6, 18, 41], query_start_loc=[0, 1, 2],
                 block_tables=tables)
    with pytest.raises(TypeError, match="needs query_lens"):
        pa.Batch(be, sc.cache, block_tables=tables)
    # The library's own checks, with its status and message.
    for seq_lens, qsl in (([6, 18, 41], [1, 1, 2, 3]),   # query_start_loc[0] != 0
                          ([6, 18, 41], [0, 2, 1, 3]),   # decreasing
                          ([6, 0, 41], [0, 1, 2, 3])):   # seq_len below its query length
        with pytest.raises(pa.PagedAttnError) as e:
            pa.Batch(be, sc.cache, seq_lens=seq_lens, query_start_loc=qsl, block_tables=tables)
        assert e.value.code == pa.Status.INVALID_ARGUMENT and e.value.message


def test_arrays_shorter_than_the_library_reads_are_value_errors(be: pa.Backend) -> None:
    sc = Scenario(be, "f32", query_lens=(1, 3), context_lens=(5, 0), seed=63)
    info = sc.batch.info
    bad = [
        (dict(query_lens=[1, 3], context_lens=[5, 0], block_tables=sc.tables[:1]), "block_tables"),
        (dict(seq_lens=[6, 3], query_start_loc=[0, 1, 4], block_tables=sc.tables[:1]),
         "block_tables"),
        (dict(query_lens=[1, 3], context_lens=[5, 0], block_tables=sc.tables,
              slot_mapping=[1, 2, 3]), "slot_mapping"),
        (dict(seq_lens=[6, 3], query_start_loc=[0, 1, 4], block_tables=sc.tables,
              slot_mapping=[1, 2, 3]), "slot_mapping"),
        (dict(query_lens=[1, 3], context_lens=[5, 0], block_tables=sc.tables, encoder_lens=[2],
              cross_block_tables=[[9], [10]], cross_cache=sc.cache), "encoder_lens"),
        (dict(query_lens=[1, 3], context_lens=[5, 0], block_tables=sc.tables,
              encoder_lens=[2, 2], cross_block_tables=[[9]], cross_cache=sc.cache),
         "cross_block_tables"),
    ]
    for kw, name in bad:
        with pytest.raises(ValueError, match=f"^{name} has"):
            pa.Batch(be, sc.cache, **kw)
        kw.pop("cross_cache", None)
        with pytest.raises(ValueError, match=f"^{name} has"):
            sc.batch.update(**kw)
    assert sc.batch.info == info
