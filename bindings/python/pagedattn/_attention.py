"""Attention: :func:`forward` (one layer over a planned batch) and :func:`merge_states`."""

from __future__ import annotations

import ctypes
from typing import Any, Optional

import numpy as np

from . import _ffi
from ._backend import Backend
from ._batch import Batch
from ._cache import KVCache
from ._handle import _handle_or_null
from ._status import _check, _lib
from ._tensor import as_tensor, checked_int, empty_like, stream_arg
from ._types import AttentionType, enum_arg


def forward(backend: Backend, batch: Optional[Batch], cache: Optional[KVCache], layer: int,
            q: Any, k: Any = None, v: Any = None, *, out: Any = None, lse: Any = False,
            num_heads: Optional[int] = None, num_kv_heads: Optional[int] = None,
            head_size: Optional[int] = None, scale: float = 0.0, soft_cap: float = 0.0,
            sliding_window: int = 0, attention_type: AttentionType = AttentionType.DECODER,
            write_kv: Optional[bool] = None, k_scale: float = 1.0, v_scale: float = 1.0,
            alibi_slopes: Any = None, stream: Optional[int] = None) -> Any:
    """Runs one layer of attention for a planned batch (``pagedattn_forward``).

    Args:
        backend, batch, cache, layer: what to run (cache is the cross cache for CROSS, None only
            for ENCODER_ONLY; a None batch is passed on as NULL and refused by the library).
        q: ``[num_tokens, H, D]``; k, v: ``[rows, Hkv, D]`` or None (when ``write_kv`` is off
            for decoder/cross). numpy arrays, :class:`BFloat16Array` or ``__dlpack__`` objects.
        out: output tensor ``[num_tokens, H, D]`` of q's dtype; allocated like q if None.
        lse: False (none), True (allocate a float32 ``[num_tokens, H]`` numpy array) or a tensor.
        num_heads, head_size: default from q's shape; num_kv_heads: from k's shape, else the
            cache's.
        scale: score scale (0 = 1/sqrt(D)); soft_cap: 0 = off; sliding_window: 0 = off.
        attention_type: :class:`AttentionType`.
        write_kv: store k/v into the cache first (default: True unless ENCODER_ONLY or k is None).
        k_scale, v_scale: fp8 cache scales.
        alibi_slopes: float32 ``[H]`` tensor (or a list of floats), or None.
        stream: GPU stream handle (int) or None.

    Returns:
        ``out``, or ``(out, lse)`` when ``lse`` is requested.

    Raises:
        PagedAttnError: with the library's status and message; nothing is written on failure.
        TypeError, OverflowError: an integer argument (layer, num_heads, num_kv_heads,
            head_size, sliding_window, also taken from shapes) that is not an integer or does
            not fit int32, or a stream that is not an address; checked before anything runs.
    """
    bh = backend._handle()
    batch_h = _handle_or_null(batch)
    cache_h = _handle_or_null(cache)
    attention_type = enum_arg(AttentionType, attention_type, "attention_type")
    layer = checked_int(layer, "int32", "layer")
    sliding_window = checked_int(sliding_window, "int32", "sliding_window")
    stream = stream_arg(stream)
    tq = as_tensor(q, "q")
    if len(tq.shape) != 3 and (num_heads is None or head_size is None):
        raise ValueError(f"q: expected [num_tokens, H, D], got shape {tq.shape}")
    tk = None if k is None else as_tensor(k, "k")
    tv = None if v is None else as_tensor(v, "v")
    H = checked_int(num_heads if num_heads is not None else tq.shape[1], "int32", "num_heads")
    D = checked_int(head_size if head_size is not None else tq.shape[2], "int32", "head_size")
    if num_kv_heads is None:
        if tk is not None and len(tk.shape) == 3:
            num_kv_heads = tk.shape[1]
        elif cache is not None:
            num_kv_heads = cache.desc.num_kv_heads
        else:
            num_kv_heads = H
    num_kv_heads = checked_int(num_kv_heads, "int32", "num_kv_heads")
    if write_kv is None:
        write_kv = attention_type != AttentionType.ENCODER_ONLY and k is not None
    if out is None:
        out = empty_like(q, tuple(tq.shape))
    to = as_tensor(out, "out", writable=True)
    lse_obj = None
    tl = None
    if lse is True:
        lse_obj = np.empty((tq.shape[0], H), dtype=np.float32)
    elif lse is not False and lse is not None:
        lse_obj = lse
    if lse_obj is not None:
        tl = as_tensor(lse_obj, "lse", writable=True)
    ta = None
    if alibi_slopes is not None:
        if isinstance(alibi_slopes, (list, tuple)):
            alibi_slopes = np.asarray(alibi_slopes, dtype=np.float32)
        ta = as_tensor(alibi_slopes, "alibi_slopes")
    o = _ffi.AttentionOptionsStruct()
    _check(_lib().pagedattn_attention_options_init(ctypes.byref(o)))
    o.num_heads, o.num_kv_heads, o.head_size = H, num_kv_heads, D
    o.scale, o.soft_cap, o.sliding_window = scale, soft_cap, sliding_window
    o.attention_type = int(attention_type)
    o.write_kv = 1 if write_kv else 0
    o.k_scale, o.v_scale = k_scale, v_scale
    o.alibi_slopes = ta.pointer if ta is not None else None
    _check(_lib().pagedattn_forward(
        bh, batch_h, cache_h, layer, ctypes.byref(o), tq.pointer,
        tk.pointer if tk is not None else None, tv.pointer if tv is not None else None,
        to.pointer, tl.pointer if tl is not None else None, stream))
    return (out, lse_obj) if lse_obj is not None else out


def merge_states(backend: Backend, o1: Any, lse1: Any, o2: Any, lse2: Any, *, out: Any = None,
                 lse_out: Any = True, stream: Optional[int] = None) -> Any:
    """Merges two partial attention states over disjoint key sets into the exact result.

    ``o1``, ``o2``: ``[T, H, D]``; ``lse1``, ``lse2``: float32 ``[T, H]``. ``out`` may be o1 or
    o2 (in place); allocated like o1 if None. ``lse_out``: True (allocate), a tensor, or
    False/None (not requested).

    Returns:
        ``(out, lse_out)``, or ``out`` when ``lse_out`` is not requested.
    """
    bh = backend._handle()
    stream = stream_arg(stream)
    t1, t2 = as_tensor(o1, "o1"), as_tensor(o2, "o2")
    l1, l2 = as_tensor(lse1, "lse1"), as_tensor(lse2, "lse2")
    if out is None:
        out = empty_like(o1, tuple(t1.shape))
    to = as_tensor(out, "out", writable=True)
    lse_obj = None
    if lse_out is True:
        lse_obj = np.empty(tuple(l1.shape), dtype=np.float32)
    elif lse_out is not False and lse_out is not None:
        lse_obj = lse_out
    tl = None if lse_obj is None else as_tensor(lse_obj, "lse_out", writable=True)
    _check(_lib().pagedattn_merge_states(bh, to.pointer, tl.pointer if tl else None, t1.pointer,
                                         l1.pointer, t2.pointer, l2.pointer, stream))
    return (out, lse_obj) if lse_obj is not None else out


__all__ = ["forward", "merge_states"]
