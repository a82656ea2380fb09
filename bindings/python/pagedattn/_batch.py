"""Batches: :class:`Batch` (one step's validated and planned metadata) and :class:`BatchInfo`."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import numpy as np

from . import _ffi
from ._backend import Backend
from ._cache import KVCache
from ._handle import _Handle, _handle_or_null
from ._status import _check, _lib
from ._tensor import _INT_TYPES, _LIMITS, checked_int, int_array

_ROW_TYPES = {list, tuple}
_I32_MIN, _I32_MAX = _LIMITS["int32"][:2]
# int_array dtype -> (min, max, ctypes type) for lists built as ctypes arrays.
_BOUNDS = {np.int32: _LIMITS["int32"][:2] + (ctypes.c_int32,),
           np.int64: _LIMITS["int64"][:2] + (ctypes.c_int64,)}


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
    host_bytes: int       # planned host metadata (lengths, tables, slot mappings)
    workspace_bytes: int  # the backend's workspace (device memory on GPUs)
    max_num_encoder_tokens: int  # capacity
    max_seq_len_capacity: int    # what max_seq_len may reach through update
    max_tree_mask_bytes: int     # tree mask bytes a step may use (0: none)


class _Ints:
    """A flat C int32/int64 array handed to the library: the object owning the memory (a ctypes
    or numpy array), its address, its length and, for tables, its row count and width."""

    __slots__ = ("owner", "address", "size", "rows", "width")

    def __init__(self, owner: Any, address: Optional[int], size: int, rows: int = 0,
                 width: int = 0) -> None:
        self.owner, self.address, self.size, self.rows, self.width = \
            owner, address, size, rows, width


def _numpy_ints(arr: np.ndarray, rows: int = 0, width: int = 0) -> _Ints:
    if arr.size and arr.flags.writeable:  # a ctypes view of the buffer: the quick address
        address = ctypes.addressof(ctypes.c_char.from_buffer(arr))
    else:
        address = arr.ctypes.data
    return _Ints(arr, address, arr.size, rows, width)


def _ctypes_ints(values: List[int], ctype: Any, rows: int = 0, width: int = 0) -> _Ints:
    arr = (ctype * len(values))(*values)
    return _Ints(arr, ctypes.addressof(arr), len(values), rows, width)


def _owned(ints: Optional[_Ints]) -> Optional[_Ints]:
    """``ints`` in memory of its own (a caller's numpy array may change after the call)."""
    if ints is None or not isinstance(ints.owner, np.ndarray):
        return ints
    return _numpy_ints(ints.owner.copy(), ints.rows, ints.width)


def _ints(x: Any, dtype: Any, name: str) -> _Ints:
    """A 1-D length or slot array, range-checked (see :func:`int_array`)."""
    if (type(x) is list or type(x) is tuple) and x and set(map(type, x)) == _INT_TYPES:
        lo, hi, ctype = _BOUNDS[dtype]
        if lo <= min(x) and max(x) <= hi:  # Python ints that fit: no numpy round trip
            return _ctypes_ints(x, ctype)  # type: ignore[arg-type]
    arr = int_array(x, dtype, name)
    return _numpy_ints(arr if arr.ndim == 1 else arr.reshape(-1))


def _table(rows: Any, name: str) -> Optional[_Ints]:
    """Block tables as C-contiguous int32 ``[num_seqs, width]``; ragged rows are padded with 0
    (a valid id that is never read)."""
    if rows is None:
        return None
    if type(rows) is list and rows and {type(r) for r in rows} <= _ROW_TYPES:
        # Rows of Python ints (the common case): checked with the builtins, copied once.
        flat = [x for r in rows for x in r]
        if flat and set(map(type, flat)) == _INT_TYPES and \
                _I32_MIN <= min(flat) and max(flat) <= _I32_MAX:
            width = max(map(len, rows))
            if len(flat) != width * len(rows):
                flat = []
                for r in rows:
                    flat.extend(r)
                    flat.extend([0] * (width - len(r)))
            return _ctypes_ints(flat, ctypes.c_int32, len(rows), width)
    if isinstance(rows, np.ndarray) or (hasattr(rows, "__len__") and len(rows) and
                                        all(isinstance(r, np.ndarray) for r in rows) and
                                        len({len(r) for r in rows}) == 1):
        arr = int_array(np.asarray(rows), np.int32, name)
        if arr.ndim != 2:
            raise ValueError(f"{name}: expected a 2-D table, got shape {arr.shape}")
        return _numpy_ints(arr, arr.shape[0], arr.shape[1])
    rows = [list(r) for r in rows]
    width = max((len(r) for r in rows), default=0)
    arr = np.zeros((len(rows), max(width, 1)), dtype=np.int32)
    for i, r in enumerate(rows):
        arr[i, :len(r)] = int_array(r, np.int32, f"{name}[{i}]") if r else []
    return _numpy_ints(arr, arr.shape[0], arr.shape[1])


_TEMPLATE: List[_ffi.BatchDescStruct] = []


def _desc_template() -> _ffi.BatchDescStruct:
    """A batch desc as ``pagedattn_batch_desc_init_sized`` fills it (the 0.2 struct, CONTEXT
    form), made once and copied."""
    if not _TEMPLATE:
        d = _ffi.BatchDescStruct()
        _check(_lib().pagedattn_batch_desc_init_sized(ctypes.byref(d), ctypes.sizeof(d)))
        _TEMPLATE.append(d)
    return _TEMPLATE[0]


_LENS_CONTEXT, _LENS_SEQ = 0, 1  # PAGEDATTN_BATCH_LENS_*


def pack_tree_masks(masks: Any) -> Tuple[np.ndarray, np.ndarray]:
    """Packs per-sequence tree masks as the library reads them (docs/semantics.md 4.7).

    Args:
        masks: one entry per sequence: ``None`` (causal among its new tokens) or a ``q x q``
            boolean matrix (numpy, or anything ``np.asarray`` takes; integer matrices count
            non-zero as set) where ``m[r, j]`` says new token r sees new token j.

    Returns:
        ``(tree_mask, tree_mask_indptr)``: the uint8 bytes, each matrix row-major and least
        significant bit first (``np.packbits(m.reshape(-1), bitorder="little")``, exactly
        ``ceil(q*q / 8)`` bytes; an empty segment for ``None``), and the int64 byte offsets
        (``len(masks) + 1`` entries from 0).

    Raises:
        ValueError: a mask that is not a square matrix.
        TypeError: a mask that is neither boolean nor integer.
    """
    parts: List[np.ndarray] = []
    indptr = [0]
    for i, m in enumerate(masks):
        if m is not None:
            a = np.asarray(m)
            if a.ndim != 2 or a.shape[0] != a.shape[1]:
                raise ValueError(f"tree_mask[{i}]: expected a square q x q matrix, got shape "
                                 f"{a.shape}")
            if a.dtype != np.bool_:
                if a.dtype.kind not in "iu":
                    raise TypeError(f"tree_mask[{i}]: expected a boolean matrix, got dtype "
                                    f"{a.dtype}")
                a = a != 0
            packed = np.packbits(a.reshape(-1), bitorder="little")
            parts.append(packed)
            indptr.append(indptr[-1] + packed.size)
        else:
            indptr.append(indptr[-1])
    mask = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)
    return mask, np.asarray(indptr, dtype=np.int64)


def _packed_mask(x: Any) -> Optional[np.ndarray]:
    """``x`` as a 1-D uint8 array if it is an already-packed mask (bytes, bytearray,
    memoryview, or a 1-D uint8 array), else None (a per-sequence list)."""
    if isinstance(x, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(x), dtype=np.uint8)
    if isinstance(x, (list, tuple)) or not hasattr(x, "__array__"):
        return None
    a = np.asarray(x)
    if a.ndim == 1 and a.dtype == np.uint8:
        return np.ascontiguousarray(a)
    return None


def _tree(tree_mask: Any, tree_mask_indptr: Any, n: int, query_lens: Any
          ) -> Tuple[Optional[_Ints], Optional[_Ints]]:
    """The packed tree mask bytes and their offsets, or (None, None) without masks.
    ``query_lens()`` gives the sequences' query lengths (checked against the matrices)."""
    if tree_mask is None:
        if tree_mask_indptr is not None:
            raise ValueError("tree_mask_indptr goes with a packed tree_mask")
        return None, None
    packed = _packed_mask(tree_mask)
    if packed is None:
        if tree_mask_indptr is not None:
            raise ValueError("tree_mask_indptr goes with a packed tree_mask (bytes or a uint8 "
                             "array); a list of matrices is packed by the binding")
        masks = list(tree_mask)
        if len(masks) != n:
            raise ValueError(f"tree_mask has {len(masks)} entries, needs {n} (one per "
                             f"sequence, None for causal)")
        qs = query_lens()
        for i, m in enumerate(masks):
            shape = np.shape(m) if m is not None else None
            if shape is not None and shape != (qs[i], qs[i]):
                raise ValueError(f"tree_mask[{i}] has shape {shape}, needs ({qs[i]}, {qs[i]}) "
                                 f"(sequence {i}'s query length)")
        packed, indptr = pack_tree_masks(masks)
        ip = _numpy_ints(indptr)
    else:
        if tree_mask_indptr is None:
            raise ValueError("a packed tree_mask needs tree_mask_indptr (num_seqs + 1 byte "
                             "offsets)")
        ip = _ints(tree_mask_indptr, np.int64, "tree_mask_indptr")
        if ip.size != n + 1:
            raise ValueError(f"tree_mask_indptr has {ip.size} entries, needs {n + 1} "
                             f"(num_seqs + 1)")
        # The library reads a sequence's bytes up to its next offset.
        reach = int(np.asarray(ip.owner).max())
        if packed.size < reach:
            raise ValueError(f"tree_mask has {packed.size} bytes, tree_mask_indptr reaches "
                             f"{reach}")
    return _numpy_ints(packed), ip


def _lens(query_lens: Any, context_lens: Any, seq_lens: Any, query_start_loc: Any
          ) -> Tuple[int, Optional[_Ints], Optional[_Ints], Optional[_Ints], Optional[_Ints]]:
    """The length arrays of one form: (num_seqs, query_lens, context_lens, seq_lens,
    query_start_loc), the other form's two None."""
    if seq_lens is not None or query_start_loc is not None:
        if query_lens is not None or context_lens is not None:
            raise ValueError("pass query_lens (and context_lens) or seq_lens and "
                             "query_start_loc, not both forms")
        if seq_lens is None or query_start_loc is None:
            raise ValueError("seq_lens and query_start_loc go together")
        sl = _ints(seq_lens, np.int32, "seq_lens")
        qsl = _ints(query_start_loc, np.int32, "query_start_loc")
        if qsl.size != sl.size + 1:
            raise ValueError(f"query_start_loc has {qsl.size} entries, needs len(seq_lens) + 1 "
                             f"= {sl.size + 1}")
        return sl.size, None, None, sl, qsl
    if query_lens is None:
        raise TypeError("a batch needs query_lens (or seq_lens and query_start_loc)")
    q = _ints(query_lens, np.int32, "query_lens")
    if context_lens is None:
        c = _ctypes_ints([0] * q.size, ctypes.c_int32)
    else:
        c = _ints(context_lens, np.int32, "context_lens")
    if c.size != q.size:
        raise ValueError(f"context_lens has {c.size} entries, query_lens {q.size}")
    return q.size, q, c, None, None


def _desc(query_lens: Any, context_lens: Any, block_tables: Any, slot_mapping: Any,
          encoder_lens: Any, cross_block_tables: Any,
          kept: Tuple[Optional[_Ints], Optional[_Ints]] = (None, None),
          seq_lens: Any = None, query_start_loc: Any = None, tree_mask: Any = None,
          tree_mask_indptr: Any = None
          ) -> Tuple[_ffi.BatchDescStruct, Tuple[Any, ...]]:
    """The C batch desc of one step and the arrays it points to (to keep alive). ``kept``:
    the encoder_lens and cross tables an update reuses when it does not pass them. The
    lengths are ``query_lens`` + ``context_lens`` (CONTEXT form) or ``seq_lens`` +
    ``query_start_loc`` (SEQ form); ``tree_mask`` is a list of matrices or packed bytes with
    ``tree_mask_indptr``."""
    n, q, c, sl, qsl = _lens(query_lens, context_lens, seq_lens, query_start_loc)

    def qlens() -> List[int]:
        if qsl is not None:
            return np.diff(np.asarray(qsl.owner, dtype=np.int64)).tolist()
        return np.asarray(q.owner if q is not None else [], dtype=np.int64).tolist()

    tm, tmi = _tree(tree_mask, tree_mask_indptr, n, qlens)
    tables = _table(block_tables, "block_tables")
    sm = None if slot_mapping is None else _ints(slot_mapping, np.int64, "slot_mapping")
    enc = None if encoder_lens is None else _ints(encoder_lens, np.int32, "encoder_lens")
    xt = _table(cross_block_tables, "cross_block_tables")
    # The library reads num_seqs table rows and encoder_lens, and a slot per token.
    if tables is not None and tables.rows < n:
        raise ValueError(f"block_tables has {tables.rows} rows, needs {n} (one per sequence)")
    if enc is not None and enc.size != n:
        raise ValueError(f"encoder_lens has {enc.size} entries, needs {n}")
    if xt is not None and xt.rows < n:
        raise ValueError(f"cross_block_tables has {xt.rows} rows, needs {n}")
    if sm is not None:
        if qsl is not None:
            tokens = max(int(np.asarray(qsl.owner)[-1]), 0)
        else:
            tokens = int(np.maximum(np.asarray(q.owner if q is not None else []), 0).sum())
        if sm.size < tokens:
            raise ValueError(f"slot_mapping has {sm.size} entries, needs {tokens} (one per token)")
    if enc is None and kept[0] is not None:
        enc = kept[0]
        if enc.size != n:
            raise ValueError(
                f"encoder_lens: the batch was planned with {enc.size} encoder_lens and this "
                f"update has {n} sequences; pass encoder_lens (and cross_block_tables)")
    if xt is None and kept[0] is not None and kept[1] is not None:
        xt = kept[1]
        if xt.rows != n:
            raise ValueError(
                f"cross_block_tables: the batch was planned with {xt.rows} rows and this "
                f"update has {n} sequences; pass cross_block_tables")
    d = _ffi.BatchDescStruct.from_buffer_copy(_desc_template())
    d.num_seqs = checked_int(n, "int32", "num_seqs")
    if sl is not None and qsl is not None:
        d.lens_form = _LENS_SEQ
        d.seq_lens, d.query_start_loc = sl.address, qsl.address
    elif q is not None and c is not None:
        d.query_lens, d.context_lens = q.address, c.address
    if tables is not None:
        d.block_tables = tables.address
        d.block_table_stride = checked_int(tables.width, "int32", "block_tables width")
    if sm is not None:
        d.slot_mapping = sm.address
    if enc is not None:
        d.encoder_lens = enc.address
    if xt is not None:
        d.cross_block_tables = xt.address
        d.cross_block_table_stride = checked_int(xt.width, "int32", "cross_block_tables width")
    if tm is not None and tmi is not None:
        d.tree_mask, d.tree_mask_indptr = tm.address, tmi.address
    return d, (q, c, tables, sm, enc, xt, sl, qsl, tm, tmi)


class Batch(_Handle):
    """A validated and planned batch (one step's metadata). Keeps its backend and caches alive.

    Args:
        backend: the backend that will run it.
        cache: the self-attention cache (block ids are checked against it); None only for an
            encoder-only batch without tables.
        query_lens: new tokens per sequence (0 = idle padded entry).
        context_lens: tokens already cached per sequence (default zeros).
        seq_lens, query_start_loc: the lengths in the SEQ form instead of ``query_lens`` and
            ``context_lens``, as vLLM v1 and FlashInfer hold them: ``seq_lens[i]`` = context
            + new tokens of sequence i, ``query_start_loc`` its ``num_seqs + 1`` row offsets
            (``[0, q0, q0 + q1, ...]``). Both forms plan the same batch.
        block_tables: ``[num_seqs, width]`` int32 array or a list of rows (ragged rows padded).
        slot_mapping: optional caller slot mapping (``[sum(query_lens)]``, -1 = padding).
        cross_cache, encoder_lens, cross_block_tables: cross attention (the cross cache may be
            the same object as ``cache``).
        max_num_seqs, max_num_tokens, max_num_encoder_tokens: capacities for :meth:`update`
            (0 = this batch's size).
        max_blocks_per_seq: capacity for the table width :meth:`update` may use (0 = the width
            of ``block_tables`` as passed).
        max_seq_len: capacity for context_len + query_len (and encoder_len); 0 = what the
            tables can address: ``max_blocks_per_seq * block_size``, or the cross tables' width
            times the cross cache's block size if larger.
        tree_mask: speculative-decoding tree masks (docs/semantics.md 4.7): a list with one
            entry per sequence, ``None`` (causal among its new tokens) or a boolean ``q x q``
            matrix (q its query length; ``m[r, j]``: new token r sees new token j; every
            diagonal entry set, none above it), packed by the binding
            (:func:`pack_tree_masks`); or already-packed bytes (``bytes`` or a 1-D uint8 array)
            with ``tree_mask_indptr``. The context is always visible. None: no masks.
        tree_mask_indptr: with packed bytes, the ``num_seqs + 1`` int64 byte offsets (from 0,
            non-decreasing) of each sequence's segment (empty = causal).
        max_tree_mask_bytes: capacity for the mask bytes of :meth:`update` steps (0 = this
            step's; set it to create a batch that later updates take into masked steps).

    So a batch planned from tables sized for the sequences' final lengths (a prefill step, say)
    takes the later decode steps through :meth:`update` without hand-set capacities.

    Raises:
        PagedAttnError: ``OUT_OF_RANGE`` (a block id outside the cache, a short table row),
        ``INVALID_ARGUMENT`` (negative lengths, a capacity below this batch), ``INVALID_HANDLE``
        (a closed backend or cache)...
        TypeError, OverflowError: a length, id or capacity that is not an integer or does not
        fit its C type (int32; max_num_tokens, max_num_encoder_tokens, max_seq_len and slots
        int64); no lengths at all.
        ValueError: both length forms, seq_lens without query_start_loc (or the reverse), a
        query_start_loc that is not ``len(seq_lens) + 1`` long, or an array shorter than the
        library reads (table rows or encoder_lens for fewer sequences, slot_mapping for fewer
        tokens); a tree mask list of another length than the sequences or a matrix of another
        shape than its sequence's ``q x q``, packed bytes without ``tree_mask_indptr`` (or the
        reverse), an indptr that is not ``num_seqs + 1`` long or reaches past the bytes.

    The library refuses (``INVALID_ARGUMENT``, naming the sequence, row and column) a diagonal
    bit clear, a bit above the diagonal, ``tree_mask_indptr[0] != 0`` or decreasing, and a
    segment shorter than ``ceil(q*q / 8)`` bytes; a forward on a batch planned with masks
    refuses ALiBi, a sliding window, an attention chunk and every attention type but the
    decoder.

    ``close()`` is idempotent; afterwards every method raises ``INVALID_HANDLE``. A batch may be
    closed before or after its backend and caches.
    """

    _kind = "Batch"

    def __init__(self, backend: Backend, cache: Optional[KVCache], query_lens: Any = None,
                 context_lens: Any = None, block_tables: Any = None, *, seq_lens: Any = None,
                 query_start_loc: Any = None, slot_mapping: Any = None,
                 cross_cache: Optional[KVCache] = None, encoder_lens: Any = None,
                 cross_block_tables: Any = None, max_num_seqs: int = 0, max_num_tokens: int = 0,
                 max_blocks_per_seq: int = 0, max_num_encoder_tokens: int = 0,
                 max_seq_len: int = 0, tree_mask: Any = None, tree_mask_indptr: Any = None,
                 max_tree_mask_bytes: int = 0) -> None:
        bh = backend._handle()
        cache_h, cross_h = _handle_or_null(cache), _handle_or_null(cross_cache)
        desc, keep = _desc(query_lens, context_lens, block_tables, slot_mapping, encoder_lens,
                           cross_block_tables, seq_lens=seq_lens, query_start_loc=query_start_loc,
                           tree_mask=tree_mask, tree_mask_indptr=tree_mask_indptr)
        desc.max_num_seqs = checked_int(max_num_seqs, "int32", "max_num_seqs")
        desc.max_num_tokens = checked_int(max_num_tokens, "int64", "max_num_tokens")
        desc.max_blocks_per_seq = checked_int(max_blocks_per_seq, "int32", "max_blocks_per_seq")
        desc.max_num_encoder_tokens = checked_int(max_num_encoder_tokens, "int64",
                                                  "max_num_encoder_tokens")
        desc.max_seq_len = checked_int(max_seq_len, "int64", "max_seq_len")
        desc.max_tree_mask_bytes = checked_int(max_tree_mask_bytes, "int64",
                                               "max_tree_mask_bytes")
        out = ctypes.c_void_p()
        _check(_lib().pagedattn_batch_create(ctypes.byref(out), bh, cache_h, cross_h,
                                             ctypes.addressof(desc)))
        super().__init__(out.value, _lib().pagedattn_batch_destroy)
        self.backend = backend
        self.cache = cache
        self.cross_cache = cross_cache
        # Cross attention metadata, kept for updates that do not repeat it.
        self._cross: Tuple[Optional[_Ints], Optional[_Ints]] = \
            (_owned(keep[4]), _owned(keep[5]))
        del keep

    def update(self, query_lens: Any = None, context_lens: Any = None, block_tables: Any = None,
               *, seq_lens: Any = None, query_start_loc: Any = None, slot_mapping: Any = None,
               encoder_lens: Any = None, cross_block_tables: Any = None, tree_mask: Any = None,
               tree_mask_indptr: Any = None) -> None:
        """Replaces the batch's contents in place (no larger than its capacities; for graph
        replay). On failure the batch keeps its previous contents. The lengths come in either
        form (see the constructor), whichever the batch was created with.

        A cross-attention batch keeps its ``encoder_lens`` and ``cross_block_tables`` when an
        update does not pass them (the encoder side does not change between decode steps);
        passing them replaces them. Kept ones must match the update's number of sequences.

        Tree masks belong to the step: an update without ``tree_mask`` is causal. Their bytes
        must fit the batch's ``max_tree_mask_bytes``.

        Raises:
            PagedAttnError: ``CAPACITY`` and the errors of the constructor.
            ValueError: kept encoder_lens or cross_block_tables for another number of sequences,
                and the constructor's length-form errors.
        """
        h = self._handle()
        desc, keep = _desc(query_lens, context_lens, block_tables, slot_mapping, encoder_lens,
                           cross_block_tables, self._cross, seq_lens, query_start_loc, tree_mask,
                           tree_mask_indptr)
        _check(_lib().pagedattn_batch_update(h, ctypes.addressof(desc)))
        if keep[4] is not None:
            self._cross = (_owned(keep[4]), _owned(keep[5]))
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


__all__ = ["Batch", "BatchInfo", "pack_tree_masks"]
