"""Batches: :class:`Batch` (one step's validated and planned metadata) and :class:`BatchInfo`."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np

from . import _ffi
from ._backend import Backend
from ._cache import KVCache
from ._handle import _Handle, _handle_or_null
from ._status import _check, _lib
from ._tensor import _i32p, _i64p, checked_int, int_array


@dataclass(frozen=True)
class BatchInfo:
    """Summary of a planned batch (``pagedattn_batch_info``)."""

    num_seqs: int
    num_tokens: int
    num_encoder_tokens: int
    num_decode_seqs: int
    num_prefill_seqs: int
    max_query_len: int
    max_seq_len: int
    max_num_seqs: int
    max_num_tokens: int
    max_blocks_per_seq: int
    block_size: int


def _table(rows: Any, name: str) -> Tuple[Optional[np.ndarray], int]:
    """Block tables as a C-contiguous int32 [num_seqs, width] array; ragged rows are padded
    with 0 (a valid id that is never read)."""
    if rows is None:
        return None, 0
    if isinstance(rows, np.ndarray) or (hasattr(rows, "__len__") and len(rows) and
                                        all(isinstance(r, np.ndarray) for r in rows) and
                                        len({len(r) for r in rows}) == 1):
        arr = int_array(np.asarray(rows), np.int32, name)
        if arr.ndim != 2:
            raise ValueError(f"{name}: expected a 2-D table, got shape {arr.shape}")
        return arr, arr.shape[1]
    rows = [list(r) for r in rows]
    width = max((len(r) for r in rows), default=0)
    arr = np.zeros((len(rows), max(width, 1)), dtype=np.int32)
    for i, r in enumerate(rows):
        arr[i, :len(r)] = int_array(r, np.int32, f"{name}[{i}]") if r else []
    return arr, max(width, 1)


class Batch(_Handle):
    """A validated and planned batch (one step's metadata). Keeps its backend and caches alive.

    Args:
        backend: the backend that will run it.
        cache: the self-attention cache (block ids are checked against it); None only for an
            encoder-only batch without tables.
        query_lens: new tokens per sequence (0 = idle padded entry).
        context_lens: tokens already cached per sequence (default zeros).
        block_tables: ``[num_seqs, width]`` int32 array or a list of rows (ragged rows padded).
        slot_mapping: optional caller slot mapping (``[sum(query_lens)]``, -1 = padding).
        cross_cache, encoder_lens, cross_block_tables: cross attention (the cross cache may be
            the same object as ``cache``).
        max_num_seqs, max_num_tokens, max_blocks_per_seq, max_num_encoder_tokens, max_seq_len:
            capacities for :meth:`update` (0 = this batch's size).

    Raises:
        PagedAttnError: ``OUT_OF_RANGE`` (a block id outside the cache, a short table row),
        ``INVALID_ARGUMENT`` (negative lengths), ``INVALID_HANDLE`` (a closed backend or
        cache)...
        TypeError, OverflowError: a length, id or capacity that is not an integer or does not
        fit its C type (int32; max_num_tokens, max_num_encoder_tokens, max_seq_len and slots
        int64).

    ``close()`` is idempotent; afterwards every method raises ``INVALID_HANDLE``. A batch may be
    closed before or after its backend and caches.
    """

    _kind = "Batch"

    def __init__(self, backend: Backend, cache: Optional[KVCache], query_lens: Any,
                 context_lens: Any = None, block_tables: Any = None, *, slot_mapping: Any = None,
                 cross_cache: Optional[KVCache] = None, encoder_lens: Any = None,
                 cross_block_tables: Any = None, max_num_seqs: int = 0, max_num_tokens: int = 0,
                 max_blocks_per_seq: int = 0, max_num_encoder_tokens: int = 0,
                 max_seq_len: int = 0) -> None:
        bh = backend._handle()
        cache_h, cross_h = _handle_or_null(cache), _handle_or_null(cross_cache)
        desc, keep = self._desc(query_lens, context_lens, block_tables, slot_mapping, encoder_lens,
                                cross_block_tables)
        desc.max_num_seqs = checked_int(max_num_seqs, "int32", "max_num_seqs")
        desc.max_num_tokens = checked_int(max_num_tokens, "int64", "max_num_tokens")
        desc.max_blocks_per_seq = checked_int(max_blocks_per_seq, "int32", "max_blocks_per_seq")
        desc.max_num_encoder_tokens = checked_int(max_num_encoder_tokens, "int64",
                                                  "max_num_encoder_tokens")
        desc.max_seq_len = checked_int(max_seq_len, "int64", "max_seq_len")
        out = ctypes.c_void_p()
        _check(_lib().pagedattn_batch_create(ctypes.byref(out), bh, cache_h, cross_h,
                                             ctypes.byref(desc)))
        del keep
        super().__init__(out.value, _lib().pagedattn_batch_destroy)
        self.backend = backend
        self.cache = cache
        self.cross_cache = cross_cache

    @staticmethod
    def _desc(query_lens: Any, context_lens: Any, block_tables: Any, slot_mapping: Any,
              encoder_lens: Any, cross_block_tables: Any) -> Tuple[_ffi.BatchDescStruct, list]:
        q = int_array(query_lens, np.int32, "query_lens").reshape(-1)
        c = (np.zeros_like(q) if context_lens is None
             else int_array(context_lens, np.int32, "context_lens").reshape(-1))
        if c.size != q.size:
            raise ValueError(f"context_lens has {c.size} entries, query_lens {q.size}")
        tables, width = _table(block_tables, "block_tables")
        sm = None if slot_mapping is None else \
            int_array(slot_mapping, np.int64, "slot_mapping").reshape(-1)
        enc = None if encoder_lens is None else \
            int_array(encoder_lens, np.int32, "encoder_lens").reshape(-1)
        xt, xwidth = _table(cross_block_tables, "cross_block_tables")
        d = _ffi.BatchDescStruct()
        _check(_lib().pagedattn_batch_desc_init(ctypes.byref(d)))
        d.num_seqs = checked_int(q.size, "int32", "num_seqs")
        d.query_lens, d.context_lens = _i32p(q), _i32p(c)
        d.block_tables = _i32p(tables)
        d.block_table_stride = checked_int(width, "int32", "block_tables width")
        d.slot_mapping = _i64p(sm)
        d.encoder_lens = _i32p(enc)
        d.cross_block_tables = _i32p(xt)
        d.cross_block_table_stride = checked_int(xwidth, "int32", "cross_block_tables width")
        return d, [q, c, tables, sm, enc, xt]

    def update(self, query_lens: Any, context_lens: Any = None, block_tables: Any = None, *,
               slot_mapping: Any = None, encoder_lens: Any = None,
               cross_block_tables: Any = None) -> None:
        """Replaces the batch's contents in place (no larger than its capacities; for graph
        replay). On failure the batch keeps its previous contents.

        Raises:
            PagedAttnError: ``CAPACITY`` and the errors of the constructor.
        """
        h = self._handle()
        desc, keep = self._desc(query_lens, context_lens, block_tables, slot_mapping,
                                encoder_lens, cross_block_tables)
        _check(_lib().pagedattn_batch_update(h, ctypes.byref(desc)))
        del keep

    @property
    def info(self) -> BatchInfo:
        """The planned batch's :class:`BatchInfo`."""
        i = _ffi.BatchInfoStruct()
        i.struct_size = ctypes.sizeof(i)
        _check(_lib().pagedattn_batch_get_info(ctypes.byref(i), self._handle()))
        return BatchInfo(*(getattr(i, f) for f, _ in _ffi.BatchInfoStruct._fields_[1:]))

    @property
    def num_tokens(self) -> int:
        """sum(query_lens): rows of q/k/v/out."""
        return self.info.num_tokens

    def _get64(self, fn: Any) -> np.ndarray:
        p = ctypes.POINTER(ctypes.c_int64)()
        n = ctypes.c_int64()
        _check(fn(ctypes.byref(p), ctypes.byref(n), self._handle()))
        if n.value == 0:
            return np.zeros(0, dtype=np.int64)
        return np.ctypeslib.as_array(p, shape=(n.value,)).copy()

    @property
    def slot_mapping(self) -> np.ndarray:
        """The planned slot mapping (int64 ``[num_tokens]``, a copy)."""
        return self._get64(_lib().pagedattn_batch_get_slot_mapping)

    @property
    def cross_slot_mapping(self) -> np.ndarray:
        """Slots of the encoder tokens a writing cross forward stores (int64, a copy)."""
        return self._get64(_lib().pagedattn_batch_get_cross_slot_mapping)

    @property
    def query_start(self) -> np.ndarray:
        """First row of each sequence, then num_tokens (int32 ``[num_seqs + 1]``, a copy)."""
        p = ctypes.POINTER(ctypes.c_int32)()
        n = ctypes.c_int32()
        _check(_lib().pagedattn_batch_get_query_start(ctypes.byref(p), ctypes.byref(n),
                                                      self._handle()))
        if n.value == 0:
            return np.zeros(0, dtype=np.int32)
        return np.ctypeslib.as_array(p, shape=(n.value,)).copy()


__all__ = ["Batch", "BatchInfo"]
