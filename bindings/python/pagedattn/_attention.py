"""Attention: :func:`forward` (one layer over a planned batch), :func:`forward_mla` (multi-head
latent attention over a latent cache) and :func:`merge_states`.

All follow one rule for what they return: ``out`` alone when no log-sum-exp is requested, the
pair ``(out, lse)`` when one is (``True`` to allocate it, or a tensor to write into). Tensors the
binding allocates follow the inputs' array type: numpy (ml_dtypes included) in, numpy out; a
:class:`BFloat16Array` in, a :class:`BFloat16Array` out (lse is always float32 numpy); torch in,
torch out on the same device.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import _ffi
from ._backend import Backend
from ._batch import Batch
from ._cache import KVCache
from ._status import _check, _lib
from ._tensor import (checked_int, describe, empty_float32_like, empty_like, float32_vector,
                      shape_of, stream_arg)
from ._types import AttentionType, enum_arg

_ENCODER_ONLY = AttentionType.ENCODER_ONLY
_ATTENTION_TYPES = {int(t): t for t in AttentionType}

# Options structs already built, by their field values. A struct is never changed once built,
# so concurrent forwards may share one.
_OPTIONS: Dict[Tuple[Any, ...], Tuple[_ffi.AttentionOptionsStruct, int]] = {}
_OPTIONS_MAX = 256


def _options(key: Tuple[Any, ...], alibi: Optional[int], sinks: Optional[int] = None,
             k_head_scales: Optional[int] = None,
             v_head_scales: Optional[int] = None) -> Tuple[Any, int]:
    """An AttentionOptionsStruct (the 0.2 struct, from ``_init_sized``) with the field values
    ``key`` (num_heads, num_kv_heads, head_size, scale, soft_cap, sliding_window,
    attention_type, write_kv, k_scale, v_scale, attention_chunk) and the tensor addresses (or
    None) ``alibi``, ``sinks``, ``k_head_scales`` and ``v_head_scales``, and its address."""
    cacheable = alibi is None and sinks is None and k_head_scales is None and \
        v_head_scales is None
    if cacheable:
        try:
            hit = _OPTIONS.get(key)
        except TypeError:  # an unhashable value (e.g. a 0-d numpy array as scale)
            hit, cacheable = None, False
        if hit is not None:
            return hit
    o = _ffi.AttentionOptionsStruct()
    _check(_lib().pagedattn_attention_options_init_sized(ctypes.byref(o), ctypes.sizeof(o)))
    (o.num_heads, o.num_kv_heads, o.head_size, o.scale, o.soft_cap, o.sliding_window,
     o.attention_type, o.write_kv, o.k_scale, o.v_scale, o.attention_chunk) = key
    o.alibi_slopes = alibi
    o.sinks = sinks
    o.k_head_scales = k_head_scales
    o.v_head_scales = v_head_scales
    entry = (o, ctypes.addressof(o))
    if cacheable:
        if len(_OPTIONS) >= _OPTIONS_MAX:
            _OPTIONS.clear()
        _OPTIONS[key] = entry
    return entry


def _lse_requested(lse: Any) -> bool:
    return lse is not False and lse is not None


def forward(backend: Backend, batch: Optional[Batch], cache: Optional[KVCache], layer: int,
            q: Any, k: Any = None, v: Any = None, *, out: Any = None, lse: Any = False,
            num_heads: Optional[int] = None, num_kv_heads: Optional[int] = None,
            head_size: Optional[int] = None, scale: float = 0.0, soft_cap: float = 0.0,
            sliding_window: int = 0, attention_type: AttentionType = AttentionType.DECODER,
            write_kv: Optional[bool] = None, k_scale: float = 1.0, v_scale: float = 1.0,
            alibi_slopes: Any = None, sinks: Any = None, attention_chunk: int = 0,
            k_head_scales: Any = None, v_head_scales: Any = None,
            stream: Optional[int] = None) -> Any:
    """Runs one layer of attention for a planned batch (``pagedattn_forward``).

    Args:
        backend, batch, cache, layer: what to run (cache is the cross cache for CROSS, None only
            for ENCODER_ONLY; a None batch is passed on as NULL and refused by the library).
        q: ``[num_tokens, H, D]``; k, v: ``[rows, Hkv, D]`` or None (when ``write_kv`` is off
            for decoder/cross). numpy arrays (float32, float16, ``ml_dtypes.bfloat16``),
            :class:`BFloat16Array` or ``__dlpack__`` objects such as torch tensors.
        out: output tensor ``[num_tokens, H, D]`` of q's dtype; if None, allocated like q (same
            array type: numpy, ml_dtypes, :class:`BFloat16Array` or torch on q's device).
        lse: False or None (not requested), True (allocate a float32 ``[num_tokens, H]`` tensor
            of q's array type: numpy for numpy/BFloat16Array inputs, torch for torch inputs),
            or a float32 tensor to write into.
        num_heads, head_size: default from q's shape; num_kv_heads: from k's shape, else the
            cache's.
        scale: score scale (0 = 1/sqrt(D)); soft_cap: 0 = off; sliding_window: 0 = off.
        attention_type: :class:`AttentionType`.
        write_kv: store k/v into the cache first (default: True unless ENCODER_ONLY or k is None).
        k_scale, v_scale: fp8 cache scales.
        alibi_slopes: float32 ``[H]`` tensor (or a list of floats), or None.
        sinks: attention sinks, a float32 ``[H]`` tensor (or a list of floats), or None: one
            logit per head that joins every row's softmax without a value (and its lse).
        attention_chunk: chunked local attention (decoder only): C > 0 lets the token at
            position p see only keys k <= p with k // C == p // C; 0 = off.
        k_head_scales, v_head_scales: per-KV-head fp8 scales, float32 ``[Hkv]`` tensors (or
            lists of floats), or None (then k_scale / v_scale). An fp8 cache loads head h as
            float(fp8) * scales[h], and a write with ``write_kv`` stores fp8(x / scales[h]);
            other caches ignore them.
        stream: GPU stream handle (int) or None (the default stream). On a GPU backend it is
            also passed to each ``__dlpack__`` producer per the DLPack protocol, so the
            producer orders its pending work before the call.

    Returns:
        ``out`` when ``lse`` is not requested; ``(out, lse)`` when it is (the tensor passed, or
        the one allocated). The same rule as :func:`merge_states`.

    Raises:
        PagedAttnError: with the library's status and message; nothing is written on failure.
        TypeError, OverflowError: an integer argument (layer, num_heads, num_kv_heads,
            head_size, sliding_window, attention_chunk, also taken from shapes) that is not an
            integer or does not fit int32, or a stream that is not an address; checked before
            anything runs.
    """
    bh = backend._handle()
    batch_h = None if batch is None else batch._handle()
    cache_h = None if cache is None else cache._handle()
    at = _ATTENTION_TYPES.get(attention_type) if type(attention_type) in (AttentionType, int) \
        else None
    if at is None:
        at = enum_arg(AttentionType, attention_type, "attention_type")
    layer = checked_int(layer, "int32", "layer")
    sliding_window = checked_int(sliding_window, "int32", "sliding_window")
    attention_chunk = checked_int(attention_chunk, "int32", "attention_chunk")
    stream = stream_arg(stream)
    gpu = backend._gpu
    qa, qkeep = describe(q, "q", False, gpu, stream)
    q_shape = q.shape if type(q) is np.ndarray else shape_of(q, qa)
    if len(q_shape) != 3 and (num_heads is None or head_size is None):
        raise ValueError(f"q: expected [num_tokens, H, D], got shape {tuple(q_shape)}")
    ka, kkeep = (None, None) if k is None else describe(k, "k", False, gpu, stream)
    va, vkeep = (None, None) if v is None else describe(v, "v", False, gpu, stream)
    H = checked_int(num_heads if num_heads is not None else q_shape[1], "int32", "num_heads")
    D = checked_int(head_size if head_size is not None else q_shape[2], "int32", "head_size")
    if num_kv_heads is None:
        k_shape = None if k is None else k.shape if type(k) is np.ndarray else shape_of(k, ka)
        if k_shape is not None and len(k_shape) == 3:
            num_kv_heads = k_shape[1]
        elif cache is not None:
            num_kv_heads = cache._geometry.num_kv_heads
        else:
            num_kv_heads = H
    num_kv_heads = checked_int(num_kv_heads, "int32", "num_kv_heads")
    if write_kv is None:
        write_kv = at is not _ENCODER_ONLY and k is not None
    if out is None:
        out = empty_like(q, tuple(q_shape))
    oa, okeep = describe(out, "out", True, gpu, stream)
    la = lkeep = None
    want_lse = _lse_requested(lse)
    if lse is True:
        lse = empty_float32_like(q, (q_shape[0], H), "lse")
    if want_lse:
        la, lkeep = describe(lse, "lse", True, gpu, stream)
    alibi, akeep = float32_vector(alibi_slopes, "alibi_slopes", gpu, stream)
    sk, skeep = float32_vector(sinks, "sinks", gpu, stream)
    khs, khkeep = float32_vector(k_head_scales, "k_head_scales", gpu, stream)
    vhs, vhkeep = float32_vector(v_head_scales, "v_head_scales", gpu, stream)
    options, options_addr = _options((H, num_kv_heads, D, scale, soft_cap, sliding_window,
                                      int(at), 1 if write_kv else 0, k_scale, v_scale,
                                      attention_chunk), alibi, sk, khs, vhs)
    _check(_lib().pagedattn_forward(bh, batch_h, cache_h, layer, options_addr, qa, ka, va, oa,
                                    la, stream))
    # alive until the call returned
    del qkeep, kkeep, vkeep, okeep, lkeep, akeep, skeep, khkeep, vhkeep, options
    return (out, lse) if want_lse else out


def forward_mla(backend: Backend, batch: Optional[Batch], cache: Optional[KVCache], layer: int,
                q_nope: Any, q_pe: Any = None, *, out: Any = None, lse: Any = False,
                value_size: Optional[int] = None, num_heads: Optional[int] = None,
                head_size: Optional[int] = None, scale: float = 0.0, soft_cap: float = 0.0,
                sliding_window: int = 0, k_scale: float = 1.0, alibi_slopes: Any = None,
                sinks: Any = None, attention_chunk: int = 0,
                stream: Optional[int] = None) -> Any:
    """Multi-head latent attention (MLA: DeepSeek V2/V3/R1, Kimi K2) in the absorbed form over a
    latent cache (``pagedattn_forward_mla``; ``Feature.MLA``).

    Every query head reads each key's one latent row of D values (R values of ``kv_c``, then
    D - R of rotary key, as :meth:`KVCache.write_latent` stored them): the score is
    ``scale * (q . row)`` over all D values, then soft cap, masks and softmax as decoder
    attention, and the output is the weights times the rows' leading R values.

    Args:
        backend, batch, cache, layer: what to run; ``cache`` must be latent (a plain cache is
            refused with ``INVALID_ARGUMENT``, as :func:`forward` refuses a latent one).
        q_nope: ``[num_tokens, H, R]``, the query's no-rope part already multiplied by W_UK;
            q_pe: ``[num_tokens, H, D - R]``. Or ``q_pe`` None and ``q_nope`` holding whole
            rows, ``[num_tokens, H, D]``. Same tensor types as :func:`forward`.
        out: ``[num_tokens, H, R]`` of q's dtype; if None, allocated like ``q_nope``.
        lse: as :func:`forward`.
        value_size: R, for allocating ``out``; default ``q_nope``'s last extent when ``q_pe``
            is given, else ``out``'s (so whole rows need ``out`` or ``value_size``).
        num_heads: default from ``q_nope``'s shape; head_size: D, default the cache's.
        scale: score scale (0 = 1/sqrt(D); DeepSeek's models pass their own softmax scale).
        soft_cap, sliding_window, attention_chunk, alibi_slopes, sinks: as :func:`forward`.
        k_scale: dequantises an fp8 latent cache.
        stream: as :func:`forward`.

    The forward writes nothing to the cache: write the step's rows with
    :meth:`KVCache.write_latent` first.

    Returns:
        ``out``, or ``(out, lse)`` when ``lse`` is requested (the rule of :func:`forward`).

    Raises:
        PagedAttnError: with the library's status and message (``UNSUPPORTED`` for a value size
            the backend lacks for D); nothing is written on failure.
        ValueError: whole rows without ``out`` or ``value_size``, or a q that is not 3-D.
        TypeError, OverflowError: integer arguments, as :func:`forward`.
    """
    bh = backend._handle()
    batch_h = None if batch is None else batch._handle()
    cache_h = None if cache is None else cache._handle()
    layer = checked_int(layer, "int32", "layer")
    sliding_window = checked_int(sliding_window, "int32", "sliding_window")
    attention_chunk = checked_int(attention_chunk, "int32", "attention_chunk")
    stream = stream_arg(stream)
    gpu = backend._gpu
    qa, qkeep = describe(q_nope, "q_nope", False, gpu, stream)
    q_shape = q_nope.shape if type(q_nope) is np.ndarray else shape_of(q_nope, qa)
    if len(q_shape) != 3:
        raise ValueError(f"q_nope: expected [num_tokens, H, R], got shape {tuple(q_shape)}")
    pa_, pkeep = (None, None) if q_pe is None else describe(q_pe, "q_pe", False, gpu, stream)
    H = checked_int(num_heads if num_heads is not None else q_shape[1], "int32", "num_heads")
    if head_size is None:
        if cache is not None:
            head_size = cache._geometry.head_size
        elif q_pe is None:
            head_size = q_shape[2]
        else:
            pe_shape = q_pe.shape if type(q_pe) is np.ndarray else shape_of(q_pe, pa_)
            head_size = q_shape[2] + pe_shape[-1]
    D = checked_int(head_size, "int32", "head_size")
    if out is None:
        if value_size is None:
            if q_pe is None:
                raise ValueError("forward_mla: with whole query rows (q_pe None) pass out= or "
                                 "value_size=")
            value_size = q_shape[2]
        out = empty_like(q_nope, (q_shape[0], H, checked_int(value_size, "int32", "value_size")))
    oa, okeep = describe(out, "out", True, gpu, stream)
    la = lkeep = None
    want_lse = _lse_requested(lse)
    if lse is True:
        lse = empty_float32_like(q_nope, (q_shape[0], H), "lse")
    if want_lse:
        la, lkeep = describe(lse, "lse", True, gpu, stream)
    alibi, akeep = float32_vector(alibi_slopes, "alibi_slopes", gpu, stream)
    sk, skeep = float32_vector(sinks, "sinks", gpu, stream)
    options, options_addr = _options((H, 1, D, scale, soft_cap, sliding_window,
                                      int(AttentionType.DECODER), 0, k_scale, 1.0,
                                      attention_chunk), alibi, sk)
    _check(_lib().pagedattn_forward_mla(bh, batch_h, cache_h, layer, options_addr, qa, pa_, oa,
                                        la, stream))
    del qkeep, pkeep, okeep, lkeep, akeep, skeep, options  # alive until the call returned
    return (out, lse) if want_lse else out


def merge_states(backend: Backend, o1: Any, lse1: Any, o2: Any, lse2: Any, *, out: Any = None,
                 lse_out: Any = True, stream: Optional[int] = None) -> Any:
    """Merges two partial attention states over disjoint key sets into the exact result
    (``pagedattn_merge_states``).

    Args:
        o1, o2: ``[T, H, D]`` partial outputs; lse1, lse2: their float32 ``[T, H]``
            log-sum-exps. numpy arrays, :class:`BFloat16Array` or ``__dlpack__`` objects.
        out: the merged output; may be o1 or o2 (in place); if None, allocated like o1.
        lse_out: True (the default: allocate a float32 ``[T, H]`` tensor like lse1, numpy or
            torch), a float32 tensor to write into, or False/None (not requested). A merged
            state is usually merged again, so the merged lse is requested unless turned off.
        stream: GPU stream handle (int) or None; passed to ``__dlpack__`` producers on GPU
            backends as in :func:`forward`.

    Returns:
        ``(out, lse_out)`` when the lse is requested (the default); ``out`` when it is not.
        The same rule as :func:`forward`.

    Raises:
        PagedAttnError: with the library's status and message.
    """
    bh = backend._handle()
    stream = stream_arg(stream)
    gpu = backend._gpu
    a1, k1 = describe(o1, "o1", False, gpu, stream)
    a2, k2 = describe(o2, "o2", False, gpu, stream)
    l1, kl1 = describe(lse1, "lse1", False, gpu, stream)
    l2, kl2 = describe(lse2, "lse2", False, gpu, stream)
    if out is None:
        out = empty_like(o1, tuple(shape_of(o1, a1)))
    oa, okeep = describe(out, "out", True, gpu, stream)
    want_lse = _lse_requested(lse_out)
    if lse_out is True:
        lse_out = empty_float32_like(lse1, tuple(shape_of(lse1, l1)), "lse_out")
    la = lkeep = None
    if want_lse:
        la, lkeep = describe(lse_out, "lse_out", True, gpu, stream)
    _check(_lib().pagedattn_merge_states(bh, oa, la, a1, l1, a2, l2, stream))
    del k1, k2, kl1, kl2, okeep, lkeep
    return (out, lse_out) if want_lse else out


__all__ = ["forward", "forward_mla", "merge_states"]
