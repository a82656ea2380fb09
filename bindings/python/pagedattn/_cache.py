"""KV caches: :class:`CacheDesc`, :func:`bytes_per_block` and :class:`KVCache` (create, wrap,
write, latent (MLA) writes, block copies, swaps, reads and loads)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from . import _ffi
from ._backend import Backend
from ._handle import _Handle
from ._status import PagedAttnError, _check, _lib
from ._tensor import (_i32p, as_tensor, checked_int, describe, float32_vector, int_array,
                      stream_arg)
from ._types import (KV_CACHE_HOST, KV_CACHE_LATENT, Dtype, Layout, dtype_arg, dtype_from_dlpack,
                     enum_arg)

# The C type of each pagedattn_kv_cache_desc field, checked before it is stored.
_DESC_FIELDS = (("num_layers", "int32"), ("num_blocks", "int32"), ("block_size", "int32"),
                ("num_kv_heads", "int32"), ("head_size", "int32"), ("dtype", "intc"),
                ("layout", "intc"), ("flags", "uint32"))


@dataclass(frozen=True)
class CacheDesc:
    """A cache's geometry (``pagedattn_kv_cache_desc``)."""

    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: Dtype
    layout: Layout
    flags: int = 0

    @property
    def latent(self) -> bool:
        """Whether this is a latent (MLA) cache: one row of ``head_size`` values per token."""
        return bool(self.flags & KV_CACHE_LATENT)

    def _struct(self) -> _ffi.KVCacheDescStruct:
        values = [checked_int(getattr(self, f), ctype, f) for f, ctype in _DESC_FIELDS]
        d = _ffi.KVCacheDescStruct()
        _check(_lib().pagedattn_kv_cache_desc_init(ctypes.byref(d)))
        for (f, _), value in zip(_DESC_FIELDS, values):
            setattr(d, f, value)
        return d

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block over all layers, K and V (``pagedattn_kv_cache_bytes_per_block``)."""
        out = ctypes.c_uint64()
        d = self._struct()
        _check(_lib().pagedattn_kv_cache_bytes_per_block(ctypes.byref(out), ctypes.byref(d)))
        return out.value


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_size: int,
                    dtype: Dtype, layout: Layout = Layout.NHD, *, latent: bool = False) -> int:
    """Bytes one block takes across all layers, K and V, so a pool can be sized from memory
    (``latent=True``: an MLA cache, whose rows count once).

    Raises:
        TypeError, OverflowError: an argument that is not an integer or does not fit its C field
            (int32).
    """
    return CacheDesc(num_layers, 1, block_size, num_kv_heads, head_size,
                     dtype_arg(dtype),
                     enum_arg(Layout, layout, "layout"),
                     KV_CACHE_LATENT if latent else 0).bytes_per_block


def _pairs_array(pairs: Any) -> np.ndarray:
    arr = int_array(pairs if len(np.shape(pairs)) else [], np.int32, "pairs").reshape(-1)
    if arr.size % 2:
        raise ValueError("pairs: need (src, dst) pairs, got an odd number of ids")
    return arr


class KVCache(_Handle):
    """A paged KV cache: the K and V blocks of every layer, on a backend's device.

    Create one with the constructor (library-owned, zero-filled memory)::

        cache = pa.KVCache(backend, num_layers=32, num_blocks=4096, block_size=16,
                           num_kv_heads=8, head_size=128, dtype=pa.Dtype.FLOAT16)

    or over caller memory with :meth:`wrap` (numpy arrays or ``__dlpack__`` tensors used in
    place). :meth:`create` is the same as the constructor (kept for existing code).

    The cache dtype must be given: it is the model's (float32, float16, bfloat16) or an fp8
    type, and the library refuses q/k/v of another dtype. numpy users pass ``Dtype.FLOAT32`` or
    ``Dtype.FLOAT16`` (or ``Dtype.BFLOAT16`` with ``ml_dtypes.bfloat16`` arrays or
    :class:`BFloat16Array`).

    A cache keeps its :class:`Backend` (and wrapped arrays) alive. ``close()`` is idempotent and
    frees library-owned memory; afterwards every method raises :class:`PagedAttnError` with
    ``INVALID_HANDLE``. It may be closed before or after its backend and the batches planned
    against it.

    Args:
        backend: the backend whose device holds the cache.
        num_layers, num_blocks, block_size, num_kv_heads, head_size: the geometry.
        dtype: a :class:`Dtype` (required), or its name (``"float16"``, ``"bfloat16"``...),
            a numpy / ml_dtypes dtype or a torch dtype.
        layout: :class:`Layout` (NHD by default).
        host: allocate pinned host memory of a GPU backend (a swap target).
        latent: a latent cache for multi-head latent attention (MLA: DeepSeek V2/V3/R1, Kimi
            K2; ``Feature.MLA``): one row of ``head_size`` values per token (``kv_lora_rank``
            values, then the rotary key: 576 = 512 + 64 for DeepSeek V3), ``num_kv_heads=1``.
            Written by :meth:`write_latent`, read by :func:`forward_mla`.

    Raises:
        PagedAttnError: ``UNSUPPORTED`` (head/block size or dtype), ``INVALID_ARGUMENT``,
            ``OUT_OF_MEMORY``...
        TypeError, OverflowError: a size that is not an integer or does not fit int32 (nothing
            is allocated).
    """

    _kind = "KVCache"

    def __init__(self, backend: Backend, *, num_layers: int, num_blocks: int, block_size: int,
                 num_kv_heads: int, head_size: int, dtype: Union[Dtype, str],
                 layout: Layout = Layout.NHD, host: bool = False, latent: bool = False) -> None:
        bh = backend._handle()
        flags = (KV_CACHE_HOST if host else 0) | (KV_CACHE_LATENT if latent else 0)
        desc = CacheDesc(num_layers, num_blocks, block_size, num_kv_heads, head_size,
                         dtype_arg(dtype), enum_arg(Layout, layout, "layout"), flags)._struct()
        out = ctypes.c_void_p()
        _check(_lib().pagedattn_kv_cache_create(ctypes.byref(out), bh, ctypes.byref(desc)))
        self._adopt(out.value, backend, None)

    def _adopt(self, ptr: int, backend: Backend, keep: Any) -> None:
        """Takes ownership of the C cache ``ptr`` (destroyed on close) and records its
        geometry, which never changes."""
        super().__init__(ptr, _lib().pagedattn_kv_cache_destroy)
        self.backend = backend
        self._keep = keep  # wrapped memory must stay valid until the cache is destroyed
        d = _ffi.KVCacheDescStruct()
        _check(_lib().pagedattn_kv_cache_desc_init(ctypes.byref(d)))
        _check(_lib().pagedattn_kv_cache_get_desc(ctypes.byref(d), ptr))
        self._geometry = CacheDesc(d.num_layers, d.num_blocks, d.block_size, d.num_kv_heads,
                                   d.head_size, Dtype(d.dtype), Layout(d.layout), d.flags)

    @classmethod
    def create(cls, backend: Backend, *, num_layers: int, num_blocks: int, block_size: int,
               num_kv_heads: int, head_size: int, dtype: Union[Dtype, str],
               layout: Layout = Layout.NHD, host: bool = False,
               latent: bool = False) -> "KVCache":
        """Same as the constructor ``KVCache(backend, ...)``: allocates a zero-filled cache on
        the backend's device (``host=True``: pinned host memory of a GPU backend, for swaps;
        ``latent=True``: an MLA cache). ``dtype`` is required.

        Raises:
            PagedAttnError: ``UNSUPPORTED`` (head/block size or dtype), ``INVALID_ARGUMENT``,
            ``OUT_OF_MEMORY``...
            TypeError, OverflowError: a size that is not an integer or does not fit int32 (nothing
            is allocated).
        """
        return cls(backend, num_layers=num_layers, num_blocks=num_blocks, block_size=block_size,
                   num_kv_heads=num_kv_heads, head_size=head_size, dtype=dtype, layout=layout,
                   host=host, latent=latent)

    @classmethod
    def wrap(cls, backend: Backend, k_layers: Sequence[Any], v_layers: Optional[Sequence[Any]], *,
             layout: Layout = Layout.NHD, dtype: Optional[Dtype] = None,
             latent: bool = False) -> "KVCache":
        """A cache over caller memory, used in place (zero copy).

        Each entry of ``k_layers`` / ``v_layers`` is one layer's blocks: a numpy array
        (ml_dtypes included), :class:`BFloat16Array` or ``__dlpack__`` object of shape
        ``[num_blocks, block_size, num_kv_heads, head_size]`` (NHD) or ``[num_blocks,
        num_kv_heads, block_size, head_size]`` (HND), any strides with a unit innermost stride,
        the same for every layer. ``dtype`` is taken from the arrays (float32/float16/bfloat16,
        and fp8 from ``ml_dtypes.float8_e4m3fn`` / ``float8_e5m2``); fp8 caches may also pass
        ``uint8`` arrays and ``dtype=Dtype.FP8_E4M3`` or ``FP8_E5M2``. The arrays are kept
        alive by the cache.

        ``latent=True`` wraps a latent (MLA) cache: ``k_layers`` hold the rows (``num_kv_heads``
        1) and ``v_layers`` is None (a latent cache has no V).
        """
        backend._handle()  # a closed backend is INVALID_HANDLE before anything else
        if latent and v_layers is not None:
            raise ValueError("wrap: a latent cache has no V layers: pass v_layers=None")
        if v_layers is None and not latent:
            raise ValueError("wrap: v_layers is None, which only a latent cache allows")
        if v_layers is None:
            v_layers = []
        elif len(k_layers) != len(v_layers):
            raise ValueError("wrap: need as many V layers as K layers, at least one")
        if len(k_layers) == 0:
            raise ValueError("wrap: need as many V layers as K layers, at least one")
        layout = enum_arg(Layout, layout, "layout")
        args = [as_tensor(t, f"k_layers[{i}]", writable=True) for i, t in enumerate(k_layers)]
        args += [as_tensor(t, f"v_layers[{i}]", writable=True) for i, t in enumerate(v_layers)]
        first = args[0]
        if len(first.shape) != 4:
            raise ValueError(f"wrap: layers must be 4-D, got shape {first.shape}")
        strides0 = first.strides
        for a in args[1:]:
            if a.shape != first.shape or a.strides != strides0 or \
               (a.code, a.bits) != (first.code, first.bits) or a.device != first.device:
                raise ValueError("wrap: every layer needs the same shape, strides, dtype, device")
        if dtype is None:
            try:
                dtype = dtype_from_dlpack((first.code, first.bits))
            except PagedAttnError:
                raise TypeError(f"wrap: cannot infer the cache dtype from DLPack code "
                                f"{first.code} bits {first.bits}; pass dtype=") from None
        dtype = dtype_arg(dtype)
        if first.bits != 8 * dtype.itemsize:
            raise TypeError(f"wrap: {dtype.name} needs {8 * dtype.itemsize}-bit elements, "
                            f"got {first.bits}-bit")
        if strides0[3] != 1:
            raise ValueError("wrap: the innermost (head_size) stride must be 1")
        nb = first.shape[0]
        if layout == Layout.NHD:
            bs, hkv, d = first.shape[1], first.shape[2], first.shape[3]
            block_s, slot_s, head_s = strides0[0], strides0[1], strides0[2]
        else:
            hkv, bs, d = first.shape[1], first.shape[2], first.shape[3]
            block_s, head_s, slot_s = strides0[0], strides0[1], strides0[2]
        desc = CacheDesc(len(k_layers), nb, bs, hkv, d, dtype, layout,
                         KV_CACHE_LATENT if latent else 0)._struct()
        n = len(k_layers)
        kptrs = (ctypes.c_void_p * n)(*[a.data_ptr for a in args[:n]])
        mem = _ffi.KVCacheMemoryStruct()
        mem.struct_size = ctypes.sizeof(mem)
        mem.k_layers = ctypes.cast(kptrs, ctypes.POINTER(ctypes.c_void_p))
        if not latent:  # a latent cache passes NULL
            vptrs = (ctypes.c_void_p * n)(*[a.data_ptr for a in args[n:]])
            mem.v_layers = ctypes.cast(vptrs, ctypes.POINTER(ctypes.c_void_p))
        mem.block_stride, mem.slot_stride, mem.head_stride = block_s, slot_s, head_s
        mem.device = _ffi.Device(*first.device)
        out = ctypes.c_void_p()
        _check(_lib().pagedattn_kv_cache_wrap(ctypes.byref(out), backend._handle(),
                                              ctypes.byref(desc), ctypes.byref(mem)))
        cache = cls.__new__(cls)
        cache._adopt(out.value, backend, [a.keep for a in args])
        return cache

    @property
    def desc(self) -> CacheDesc:
        """The cache's geometry (read from the library when the cache was made)."""
        self._handle()
        return self._geometry

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block over all layers, K and V (also one record of :meth:`read_blocks`)."""
        return self.desc.bytes_per_block

    @property
    def latent(self) -> bool:
        """Whether this is a latent (MLA) cache."""
        return self.desc.latent

    def layer(self, layer: int) -> Tuple[int, int, Tuple[int, int, int]]:
        """Layer ``layer``'s K and V base addresses and the (block, slot, head) element strides."""
        k, v = ctypes.c_void_p(), ctypes.c_void_p()
        strides = (ctypes.c_int64 * 3)()
        _check(_lib().pagedattn_kv_cache_get_layer(ctypes.byref(k), ctypes.byref(v), strides,
                                                   self._handle(),
                                                   checked_int(layer, "int32", "layer")))
        return k.value or 0, v.value or 0, (strides[0], strides[1], strides[2])

    def write(self, layer: int, key: Any, value: Any, slot_mapping: Any, *, k_scale: float = 1.0,
              v_scale: float = 1.0, k_head_scales: Any = None, v_head_scales: Any = None,
              stream: Optional[int] = None) -> None:
        """Reshape-and-cache: stores ``key[t]``, ``value[t]`` (``[T, Hkv, D]``) at
        ``slot_mapping[t]`` of ``layer`` (-1 skips a token). ``slot_mapping`` is a list or an
        int32/int64 array (numpy or ``__dlpack__``). Nothing is written if a slot is out of range.

        fp8 caches store ``fp8(x / scale)``: with ``k_scale`` / ``v_scale``, one scale for all
        heads (``pagedattn_kv_cache_write``); with ``k_head_scales`` / ``v_head_scales``,
        float32 ``[Hkv]`` tensors (or lists of floats), one per KV head
        (``pagedattn_kv_cache_write_scaled``; a side left None has scale 1). Other caches
        ignore the scales.

        Raises:
            PagedAttnError: the library's refusals (``OUT_OF_RANGE`` slots, ``BAD_TENSOR``,
                ``INVALID_ARGUMENT`` for a scale that is not finite and > 0...).
            ValueError: per-head scales together with a scalar scale other than 1 (the
                per-head write takes no scalar scales).
        """
        h = self._handle()
        per_head = k_head_scales is not None or v_head_scales is not None
        if per_head and (k_scale != 1.0 or v_scale != 1.0):
            raise ValueError("write: k_head_scales / v_head_scales replace k_scale and v_scale; "
                             "pass one kind of scale")
        if isinstance(slot_mapping, (list, tuple)) or (
                isinstance(slot_mapping, np.ndarray) and slot_mapping.dtype.kind in "iu"
                and slot_mapping.dtype not in (np.int32, np.int64)):
            slot_mapping = int_array(slot_mapping, np.int64, "slot_mapping")
        layer = checked_int(layer, "int32", "layer")
        stream = stream_arg(stream)
        gpu = self.backend._gpu
        ka, kkeep = describe(key, "key", False, gpu, stream)
        va, vkeep = describe(value, "value", False, gpu, stream)
        sa, skeep = describe(slot_mapping, "slot_mapping", False, gpu, stream)
        if per_head:
            khs, khkeep = float32_vector(k_head_scales, "k_head_scales", gpu, stream)
            vhs, vhkeep = float32_vector(v_head_scales, "v_head_scales", gpu, stream)
            _check(_lib().pagedattn_kv_cache_write_scaled(h, layer, ka, va, sa, khs, vhs, stream))
            del khkeep, vhkeep
        else:
            _check(_lib().pagedattn_kv_cache_write(h, layer, ka, va, sa, k_scale, v_scale,
                                                   stream))
        del kkeep, vkeep, skeep  # alive until the call returned

    def write_latent(self, layer: int, kv_c: Any, k_pe: Any, slot_mapping: Any, *,
                     scale: float = 1.0, stream: Optional[int] = None) -> None:
        """Reshape-and-cache for a latent (MLA) cache (``pagedattn_kv_cache_write_latent``,
        vLLM's ``concat_and_cache_mla``): stores the row ``[kv_c[t], k_pe[t]]`` at
        ``slot_mapping[t]`` of ``layer`` (-1 skips a token).

        ``kv_c`` is ``[T, R]`` (the ``kv_lora_rank`` values) and ``k_pe`` ``[T, D - R]`` (the
        rotary key), each 2-D or 3-D with a middle extent of 1; or ``k_pe`` is None and ``kv_c``
        holds whole rows, ``[T, D]``. ``slot_mapping`` as in :meth:`write`. An fp8 cache stores
        ``fp8(x / scale)``; other caches ignore ``scale``.

        Raises:
            PagedAttnError: the library's refusals (``INVALID_ARGUMENT`` for a cache that is
                not latent, ``OUT_OF_RANGE`` slots, ``BAD_TENSOR``...); nothing is written.
        """
        h = self._handle()
        if isinstance(slot_mapping, (list, tuple)) or (
                isinstance(slot_mapping, np.ndarray) and slot_mapping.dtype.kind in "iu"
                and slot_mapping.dtype not in (np.int32, np.int64)):
            slot_mapping = int_array(slot_mapping, np.int64, "slot_mapping")
        layer = checked_int(layer, "int32", "layer")
        stream = stream_arg(stream)
        gpu = self.backend._gpu
        ca, ckeep = describe(kv_c, "kv_c", False, gpu, stream)
        pe, pkeep = (None, None) if k_pe is None else describe(k_pe, "k_pe", False, gpu, stream)
        sa, skeep = describe(slot_mapping, "slot_mapping", False, gpu, stream)
        _check(_lib().pagedattn_kv_cache_write_latent(h, layer, ca, pe, sa, scale, stream))
        del ckeep, pkeep, skeep  # alive until the call returned

    def copy_blocks(self, pairs: Any, *, stream: Optional[int] = None) -> None:
        """Copies whole blocks (K and V, every layer): ``pairs`` is ``[(src, dst), ...]`` or a
        flat ``[src0, dst0, src1, dst1, ...]``. All pairs are checked before anything is copied."""
        h = self._handle()
        arr = _pairs_array(pairs)
        _check(_lib().pagedattn_kv_cache_copy_blocks(h, _i32p(arr), arr.size // 2,
                                                     stream_arg(stream)))

    def swap_blocks(self, src: "KVCache", pairs: Any, *, stream: Optional[int] = None) -> None:
        """Copies blocks from cache ``src`` into this cache: ``src`` block ``s`` -> block ``d`` of
        ``self`` for each ``(s, d)`` (same geometry; devices may differ)."""
        h, sh = self._handle(), src._handle()
        arr = _pairs_array(pairs)
        _check(_lib().pagedattn_kv_cache_swap_blocks(h, sh, _i32p(arr), arr.size // 2,
                                                     stream_arg(stream)))

    def read_blocks(self, block_ids: Any, *, stream: Optional[int] = None) -> np.ndarray:
        """Exports blocks to host memory: a ``uint8`` array ``[len(block_ids), bytes_per_block]``
        (per id, per layer: the K block then the V block, packed in the cache's layout)."""
        h = self._handle()
        ids = int_array(block_ids, np.int32, "block_ids").reshape(-1)
        bpb = self.bytes_per_block
        buf = np.zeros((ids.size, bpb), dtype=np.uint8)
        _check(_lib().pagedattn_kv_cache_read_blocks(h, _i32p(ids), ids.size,
                                                     buf.ctypes.data, buf.nbytes,
                                                     stream_arg(stream)))
        return buf

    def load_blocks(self, block_ids: Any, buffer: Any, *, stream: Optional[int] = None) -> None:
        """The inverse of :meth:`read_blocks`: loads blocks from a host buffer in its format."""
        h = self._handle()
        ids = int_array(block_ids, np.int32, "block_ids").reshape(-1)
        buf = np.ascontiguousarray(buffer)
        _check(_lib().pagedattn_kv_cache_load_blocks(h, _i32p(ids), ids.size, buf.ctypes.data,
                                                     buf.nbytes, stream_arg(stream)))


__all__ = ["CacheDesc", "KVCache", "bytes_per_block"]
