"""The pagedattn Python API over the C ABI (see the package docstring)."""

from __future__ import annotations

import ctypes
import enum
import weakref
from dataclasses import dataclass
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _ffi
from ._tensor import BFloat16Array, TensorArg, as_tensor, empty_like, int_array


class Status(enum.IntEnum):
    """``pagedattn_status`` values (pinned by the ABI)."""

    OK = 0
    INVALID_ARGUMENT = 1
    NULL_POINTER = 2
    STRUCT_SIZE = 3
    BAD_TENSOR = 4
    WRONG_DEVICE = 5
    OUT_OF_RANGE = 6
    OVERFLOW = 7
    UNSUPPORTED = 8
    CAPACITY = 9
    OUT_OF_MEMORY = 10
    UNKNOWN_BACKEND = 11
    BACKEND_UNAVAILABLE = 12
    PLUGIN = 13
    PLUGIN_ABI = 14
    DEVICE = 15
    INVALID_HANDLE = 16
    INTERNAL = 17

    @property
    def c_name(self) -> str:
        """The C constant's name, e.g. ``PAGEDATTN_ERROR_BAD_TENSOR``."""
        return "PAGEDATTN_OK" if self == 0 else "PAGEDATTN_ERROR_" + self.name

    @classmethod
    def from_c_name(cls, name: str) -> "Status":
        """The status whose C constant is ``name``."""
        for s in cls:
            if s.c_name == name:
                return s
        raise ValueError(f"unknown status name {name!r}")


class Dtype(enum.IntEnum):
    """``pagedattn_dtype``: element types of caches (tensors carry DLPack dtypes).

    ``Dtype.BFLOAT16.library_name`` is the library's name (``"bfloat16"``), ``.itemsize`` its
    size in bytes, and :meth:`to_dlpack` / :meth:`from_dlpack` map to and from the DLPack type
    that tensors of this dtype carry (all answered by libpagedattn itself).
    """

    FLOAT32 = 1
    FLOAT16 = 2
    BFLOAT16 = 3
    FP8_E4M3 = 4
    FP8_E5M2 = 5

    @property
    def library_name(self) -> str:
        """The library's name for the dtype (``pagedattn_dtype_name``): ``"float32"``,
        ``"float16"``, ``"bfloat16"``, ``"fp8_e4m3"`` or ``"fp8_e5m2"``."""
        return dtype_name(self)

    @property
    def itemsize(self) -> int:
        """Bytes per element (``pagedattn_dtype_size``)."""
        return dtype_size(self)

    def to_dlpack(self) -> "DLPackDtype":
        """The DLPack type of tensors of this dtype (``pagedattn_dtype_to_dlpack``)."""
        return dtype_to_dlpack(self)

    @classmethod
    def from_dlpack(cls, dtype: Union["DLPackDtype", Tuple[int, ...]]) -> "Dtype":
        """The dtype of a DLPack type (``pagedattn_dtype_from_dlpack``); see
        :func:`dtype_from_dlpack`."""
        return dtype_from_dlpack(dtype)


class DLPackCode(enum.IntEnum):
    """DLPack type codes (``DLDataTypeCode``, ``PAGEDATTN_DLPACK_*``); the fp8 codes are
    DLPack 1.1's."""

    INT = 0
    UINT = 1
    FLOAT = 2
    BFLOAT = 4
    FLOAT8_E4M3FN = 10
    FLOAT8_E5M2 = 12


class DLPackDtype(NamedTuple):
    """A DLPack ``DLDataType`` (``pagedattn_dlpack_dtype``): a type code (a :class:`DLPackCode`
    when it is one the library names), the bits per lane and the lanes (1 for scalars)."""

    code: int
    bits: int
    lanes: int = 1


class Layout(enum.IntEnum):
    """Cache layouts: NHD ``[block][slot][head][dim]``, HND ``[block][head][slot][dim]``."""

    NHD = 0
    HND = 1


class AttentionType(enum.IntEnum):
    """``pagedattn_attention_type``."""

    DECODER = 0
    ENCODER = 1
    ENCODER_ONLY = 2
    CROSS = 3


class Feature(enum.IntFlag):
    """``PAGEDATTN_FEATURE_*`` capability bits."""

    ALIBI = 1 << 0
    SOFT_CAP = 1 << 1
    SLIDING_WINDOW = 1 << 2
    CROSS_ATTENTION = 1 << 3
    ENCODER = 1 << 4
    FP8_CACHE = 1 << 5
    LSE = 1 << 6
    MERGE_STATES = 1 << 7
    CHUNKED_PREFILL = 1 << 8
    HOST_SWAP = 1 << 9
    GRAPH_CAPTURE = 1 << 10
    WRAP_CACHE = 1 << 11


KV_CACHE_HOST = 1  # PAGEDATTN_KV_CACHE_HOST



class PagedAttnError(Exception):
    """A pagedattn call failed.

    Attributes:
        code: the :class:`Status`.
        message: the library's ``pagedattn_last_error()`` for the failing call (or, for errors
            the binding detects itself such as a closed handle, the binding's message).
    """

    def __init__(self, code: Union[Status, int], message: str) -> None:
        try:
            code = Status(code)
        except ValueError:
            pass
        self.code = code
        self.message = message
        name = code.c_name if isinstance(code, Status) else f"status {code}"
        super().__init__(f"{name}: {message}")


def _lib() -> ctypes.CDLL:
    return _ffi.load()


def _check(status: int) -> None:
    """Raises :class:`PagedAttnError` for a failing status, reading the thread's message now."""
    if status != 0:
        raw = _lib().pagedattn_last_error()
        raise PagedAttnError(status, raw.decode("utf-8", "replace") if raw else "")


def status_string(status: Union[Status, int]) -> str:
    """The C name of a status (``pagedattn_status_string``)."""
    return _lib().pagedattn_status_string(int(status)).decode()


def last_error() -> str:
    """``pagedattn_last_error()`` of this thread (normally read for you by the exceptions)."""
    return _lib().pagedattn_last_error().decode("utf-8", "replace")


def version() -> Tuple[int, int, int]:
    """The loaded library's (major, minor, patch)."""
    a, b, c = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int32()
    _lib().pagedattn_version(ctypes.byref(a), ctypes.byref(b), ctypes.byref(c))
    return a.value, b.value, c.value


def version_string() -> str:
    """The loaded library's version string, e.g. ``"0.1.0"``."""
    return _lib().pagedattn_version_string().decode()


def dtype_size(dtype: Union[Dtype, int]) -> int:
    """Bytes per element of a cache dtype (``pagedattn_dtype_size``); 0 for a value that is not
    a dtype."""
    return int(_lib().pagedattn_dtype_size(int(dtype)))


def dtype_name(dtype: Union[Dtype, int]) -> str:
    """The library's name for a dtype (``pagedattn_dtype_name``): ``"float32"``, ``"bfloat16"``,
    ``"fp8_e4m3"``...; ``"invalid"`` for a value that is not a dtype (never raises)."""
    return _lib().pagedattn_dtype_name(int(dtype)).decode()


def dtype_to_dlpack(dtype: Union[Dtype, int]) -> DLPackDtype:
    """The DLPack type of tensors of ``dtype`` (``pagedattn_dtype_to_dlpack``), e.g.
    ``DLPackDtype(DLPackCode.BFLOAT, 16, 1)`` for ``Dtype.BFLOAT16``.

    Raises:
        PagedAttnError: ``INVALID_ARGUMENT`` for a value that is not a dtype.
    """
    out = _ffi.DLDataType()
    _check(_lib().pagedattn_dtype_to_dlpack(ctypes.byref(out), int(dtype)))
    return DLPackDtype(_dlpack_code(out.code), out.bits, out.lanes)


def dtype_from_dlpack(dtype: Union[DLPackDtype, Tuple[int, ...]]) -> Dtype:
    """The dtype of a DLPack type (``pagedattn_dtype_from_dlpack``): ``dtype`` is a
    :class:`DLPackDtype` or a ``(code, bits[, lanes])`` tuple, e.g. ``(DLPackCode.FLOAT, 16)`` ->
    ``Dtype.FLOAT16``.

    Raises:
        PagedAttnError: ``UNSUPPORTED`` (the message names code, bits and lanes) for a type the
            library has no use for, such as int32 or a vector type.
        ValueError: a tuple of the wrong length or with values outside the C fields' ranges.
    """
    if not 2 <= len(dtype) <= 3:
        raise ValueError(f"DLPack dtype: expected (code, bits[, lanes]), got {dtype!r}")
    code, bits, lanes = (tuple(int(x) for x in dtype) + (1,))[:3]
    if not (0 <= code <= 0xFF and 0 <= bits <= 0xFF and 0 <= lanes <= 0xFFFF):
        raise ValueError(f"DLPack dtype {dtype!r}: code and bits must fit uint8, lanes uint16")
    out = ctypes.c_int(0)
    _check(_lib().pagedattn_dtype_from_dlpack(ctypes.byref(out), _ffi.DLDataType(code, bits,
                                                                                    lanes)))
    return Dtype(out.value)


def _dlpack_code(code: int) -> int:
    try:
        return DLPackCode(code)
    except ValueError:
        return code


class _Handle:
    """An owned C handle: ``close()`` (idempotent), context manager, and a finalizer safety net.

    Lifetime rules shared by :class:`Backend`, :class:`KVCache` and :class:`Batch`:

    - ``close()`` destroys the C object now; closing again does nothing (like ``file.close()``).
      Leaving a ``with`` block closes it; an object never closed is destroyed by its finalizer
      when it is garbage-collected (or at interpreter exit).
    - After ``close()`` every method and property that needs the object (and every call that
      is given it, such as :func:`forward`) raises :class:`PagedAttnError` with
      ``Status.INVALID_HANDLE``; the binding checks this before reaching C, so nothing is read
      from freed memory. ``closed`` and ``repr()`` keep working.
    - Any order of closing is safe. The C library keeps a backend alive until the last cache and
      batch created from it are destroyed, so closing a :class:`Backend` first leaves its caches
      and batches fully usable (only calls that take the closed backend object itself raise);
      a batch stays valid after its cache is closed (a forward needs a live cache, though).
    """

    _kind = "handle"

    def __init__(self, ptr: int, destroy: Callable[[int], None]) -> None:
        self._ptr: Optional[int] = ptr
        # The finalizer holds only the pointer and the C function, never self.
        self._finalizer = weakref.finalize(self, destroy, ptr)

    def _handle(self) -> int:
        if self._ptr is None:
            raise PagedAttnError(Status.INVALID_HANDLE, f"pagedattn.{self._kind} is closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._ptr is None

    def close(self) -> None:
        """Destroys the C object now. Closing twice is harmless (the second call does nothing);
        any later use raises :class:`PagedAttnError` with ``Status.INVALID_HANDLE``. Objects
        created from this one stay usable (see the class docstring)."""
        self._ptr = None
        self._finalizer()  # runs the destroy at most once

    def __enter__(self):
        """Returns self; raises ``INVALID_HANDLE`` if already closed."""
        self._handle()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._ptr is None else hex(self._ptr)
        return f"<pagedattn.{self._kind} {state}>"


def _handle_or_null(h: Optional[_Handle]) -> Optional[int]:
    return None if h is None else h._handle()


@dataclass(frozen=True)
class BackendInfo:
    """One entry of :func:`backends`."""

    name: str
    available: bool
    reason: str


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do (``pagedattn_capabilities``)."""

    name: str
    device_type: int
    device_id: int
    features: Feature
    dtypes: Tuple[Dtype, ...]
    cache_dtypes: Tuple[Dtype, ...]
    layouts: Tuple[Layout, ...]
    block_sizes: Tuple[int, ...]
    head_sizes: Tuple[int, ...]
    max_num_threads: int
    total_memory: int


def backends() -> List[BackendInfo]:
    """Every backend the library knows of, available or not, with the reason if not."""
    lib = _lib()
    out = []
    for i in range(lib.pagedattn_backend_count()):
        info = _ffi.BackendInfoStruct()
        info.struct_size = ctypes.sizeof(info)
        _check(lib.pagedattn_backend_get_info(ctypes.byref(info), i))
        out.append(BackendInfo((info.name or b"").decode(), bool(info.available),
                               (info.reason or b"").decode("utf-8", "replace")))
    return out


def _bits(mask: int, values: Sequence[Any]) -> Tuple[Any, ...]:
    return tuple(v for v in values if mask & (1 << int(v)))


class Backend(_Handle):
    """A compute backend: ``"cpu"``, ``"onednn"``, ``"cuda"``, ``"hip"`` or ``"auto"``.

    Args:
        name: backend name (``"auto"`` picks the first available of cuda, hip, onednn, then cpu).
        device_index: GPU ordinal (0 on CPU).
        num_threads: CPU worker threads, 0 = one per online core.
        memory_limit: bytes this backend may allocate (0 = unlimited).

    Raises:
        PagedAttnError: e.g. ``UNKNOWN_BACKEND``, ``BACKEND_UNAVAILABLE`` (the message says why).

    ``close()`` is idempotent; afterwards every method raises ``INVALID_HANDLE``, while the
    caches and batches created from the backend keep working until they are closed themselves.
    """

    _kind = "Backend"

    def __init__(self, name: str = "auto", *, device_index: int = 0, num_threads: int = 0,
                 memory_limit: int = 0) -> None:
        lib = _lib()
        opts = _ffi.BackendOptionsStruct()
        _check(lib.pagedattn_backend_options_init(ctypes.byref(opts)))
        opts.device_index = device_index
        opts.num_threads = num_threads
        opts.memory_limit = memory_limit
        out = ctypes.c_void_p()
        _check(lib.pagedattn_backend_create(ctypes.byref(out), name.encode(), ctypes.byref(opts)))
        super().__init__(out.value, lib.pagedattn_backend_destroy)
        self._caps: Optional[Capabilities] = None

    @property
    def capabilities(self) -> Capabilities:
        """The backend's :class:`Capabilities`."""
        h = self._handle()
        if self._caps is None:
            c = _ffi.CapabilitiesStruct()
            c.struct_size = ctypes.sizeof(c)
            _check(_lib().pagedattn_backend_get_capabilities(ctypes.byref(c), h))
            self._caps = Capabilities(
                name=(c.name or b"").decode(),
                device_type=c.device.device_type,
                device_id=c.device.device_id,
                features=Feature(c.features),
                dtypes=_bits(c.dtypes, list(Dtype)),
                cache_dtypes=_bits(c.cache_dtypes, list(Dtype)),
                layouts=_bits(c.layouts, list(Layout)),
                block_sizes=tuple(1 << k for k in range(9) if c.block_sizes & (1 << k)),
                head_sizes=tuple(8 * (i + 1) for i in range(32) if c.head_sizes & (1 << i)),
                max_num_threads=c.max_num_threads,
                total_memory=c.total_memory,
            )
        return self._caps

    @property
    def name(self) -> str:
        """The backend's name (``"cpu"``, ...), also when created as ``"auto"``."""
        return self.capabilities.name

    def synchronize(self, stream: Optional[int] = None) -> None:
        """Waits for the work queued on ``stream`` (no-op on CPU)."""
        _check(_lib().pagedattn_backend_synchronize(self._handle(), stream))

    def forward(self, batch: Optional["Batch"], cache: Optional["KVCache"], layer: int, q: Any,
                k: Any = None, v: Any = None, **kwargs: Any) -> Any:
        """Same as :func:`forward` with this backend."""
        return forward(self, batch, cache, layer, q, k, v, **kwargs)

    def merge_states(self, o1: Any, lse1: Any, o2: Any, lse2: Any, **kwargs: Any) -> Any:
        """Same as :func:`merge_states` with this backend."""
        return merge_states(self, o1, lse1, o2, lse2, **kwargs)


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

    def _struct(self) -> _ffi.KVCacheDescStruct:
        d = _ffi.KVCacheDescStruct()
        _check(_lib().pagedattn_kv_cache_desc_init(ctypes.byref(d)))
        d.num_layers, d.num_blocks, d.block_size = self.num_layers, self.num_blocks, self.block_size
        d.num_kv_heads, d.head_size = self.num_kv_heads, self.head_size
        d.dtype, d.layout, d.flags = int(self.dtype), int(self.layout), self.flags
        return d

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block over all layers, K and V (``pagedattn_kv_cache_bytes_per_block``)."""
        out = ctypes.c_uint64()
        d = self._struct()
        _check(_lib().pagedattn_kv_cache_bytes_per_block(ctypes.byref(out), ctypes.byref(d)))
        return out.value


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_size: int,
                    dtype: Dtype, layout: Layout = Layout.NHD) -> int:
    """Bytes one block takes across all layers, K and V, so a pool can be sized from memory."""
    return CacheDesc(num_layers, 1, block_size, num_kv_heads, head_size, Dtype(dtype),
                     Layout(layout)).bytes_per_block


def _strides_of(t: TensorArg) -> Tuple[int, ...]:
    """Element strides of a described tensor (compact ones when its strides are NULL)."""
    s = t.pointer.contents
    if s.strides:
        return tuple(s.strides[i] for i in range(s.ndim))
    out, acc = [], 1
    for n in reversed(t.shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def _pairs_array(pairs: Any) -> np.ndarray:
    arr = int_array(pairs if len(np.shape(pairs)) else [], np.int32, "pairs").reshape(-1)
    if arr.size % 2:
        raise ValueError("pairs: need (src, dst) pairs, got an odd number of ids")
    return arr


def _i32p(arr: Optional[np.ndarray]) -> Any:
    return None if arr is None else arr.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))


def _i64p(arr: Optional[np.ndarray]) -> Any:
    return None if arr is None else arr.ctypes.data_as(ctypes.POINTER(ctypes.c_int64))


class KVCache(_Handle):
    """A paged KV cache. Create with :meth:`create` (library-owned memory) or :meth:`wrap`
    (caller memory used in place). Keeps its :class:`Backend` (and wrapped arrays) alive.

    ``close()`` is idempotent and frees library-owned memory; afterwards every method raises
    :class:`PagedAttnError` with ``INVALID_HANDLE``. It may be closed before or after its
    backend and the batches planned against it.
    """

    _kind = "KVCache"

    def __init__(self, ptr: int, backend: Backend, keep: Any = None) -> None:
        super().__init__(ptr, _lib().pagedattn_kv_cache_destroy)
        self.backend = backend
        self._keep = keep  # wrapped memory must stay valid until the cache is destroyed

    @classmethod
    def create(cls, backend: Backend, *, num_layers: int, num_blocks: int, block_size: int,
               num_kv_heads: int, head_size: int, dtype: Dtype = Dtype.BFLOAT16,
               layout: Layout = Layout.NHD, host: bool = False) -> "KVCache":
        """Allocates a zero-filled cache on the backend's device (``host=True``: pinned host
        memory of a GPU backend, for swaps).

        Raises:
            PagedAttnError: ``UNSUPPORTED`` (head/block size or dtype), ``INVALID_ARGUMENT``,
            ``OUT_OF_MEMORY``...
        """
        bh = backend._handle()
        desc = CacheDesc(num_layers, num_blocks, block_size, num_kv_heads, head_size, Dtype(dtype),
                         Layout(layout), KV_CACHE_HOST if host else 0)._struct()
        out = ctypes.c_void_p()
        _check(_lib().pagedattn_kv_cache_create(ctypes.byref(out), bh, ctypes.byref(desc)))
        return cls(out.value, backend)

    @classmethod
    def wrap(cls, backend: Backend, k_layers: Sequence[Any], v_layers: Sequence[Any], *,
             layout: Layout = Layout.NHD, dtype: Optional[Dtype] = None) -> "KVCache":
        """A cache over caller memory, used in place (zero copy).

        Each entry of ``k_layers`` / ``v_layers`` is one layer's blocks: a numpy array,
        :class:`BFloat16Array` or ``__dlpack__`` object of shape ``[num_blocks, block_size,
        num_kv_heads, head_size]`` (NHD) or ``[num_blocks, num_kv_heads, block_size, head_size]``
        (HND), any strides with a unit innermost stride, the same for every layer. ``dtype`` is
        taken from the arrays (float32/float16/bfloat16); fp8 caches pass ``uint8`` arrays and
        ``dtype=Dtype.FP8_E4M3`` or ``FP8_E5M2``. The arrays are kept alive by the cache.
        """
        backend._handle()  # a closed backend is INVALID_HANDLE before anything else
        if len(k_layers) == 0 or len(k_layers) != len(v_layers):
            raise ValueError("wrap: need as many V layers as K layers, at least one")
        layout = Layout(layout)
        args = [as_tensor(t, f"k_layers[{i}]", writable=True) for i, t in enumerate(k_layers)]
        args += [as_tensor(t, f"v_layers[{i}]", writable=True) for i, t in enumerate(v_layers)]
        first = args[0]
        if len(first.shape) != 4:
            raise ValueError(f"wrap: layers must be 4-D, got shape {first.shape}")
        t0 = first.pointer.contents
        strides0 = _strides_of(first)
        for a in args[1:]:
            if a.shape != first.shape or _strides_of(a) != strides0 or \
               (a.code, a.bits) != (first.code, first.bits) or \
               (a.device_type, a.device_id) != (first.device_type, first.device_id):
                raise ValueError("wrap: every layer needs the same shape, strides, dtype, device")
        if dtype is None:
            try:
                dtype = dtype_from_dlpack((first.code, first.bits))
            except PagedAttnError:
                raise TypeError(f"wrap: cannot infer the cache dtype from DLPack code "
                                f"{first.code} bits {first.bits}; pass dtype=") from None
        dtype = Dtype(dtype)
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
        desc = CacheDesc(len(k_layers), nb, bs, hkv, d, dtype, layout)._struct()
        n = len(k_layers)
        kptrs = (ctypes.c_void_p * n)(*[a.data_ptr for a in args[:n]])
        vptrs = (ctypes.c_void_p * n)(*[a.data_ptr for a in args[n:]])
        mem = _ffi.KVCacheMemoryStruct()
        mem.struct_size = ctypes.sizeof(mem)
        mem.k_layers = ctypes.cast(kptrs, ctypes.POINTER(ctypes.c_void_p))
        mem.v_layers = ctypes.cast(vptrs, ctypes.POINTER(ctypes.c_void_p))
        mem.block_stride, mem.slot_stride, mem.head_stride = block_s, slot_s, head_s
        mem.device = _ffi.Device(t0.device.device_type, t0.device.device_id)
        out = ctypes.c_void_p()
        _check(_lib().pagedattn_kv_cache_wrap(ctypes.byref(out), backend._handle(),
                                              ctypes.byref(desc), ctypes.byref(mem)))
        return cls(out.value, backend, keep=[a.keep for a in args])

    @property
    def desc(self) -> CacheDesc:
        """The cache's geometry."""
        d = _ffi.KVCacheDescStruct()
        _check(_lib().pagedattn_kv_cache_desc_init(ctypes.byref(d)))
        _check(_lib().pagedattn_kv_cache_get_desc(ctypes.byref(d), self._handle()))
        return CacheDesc(d.num_layers, d.num_blocks, d.block_size, d.num_kv_heads, d.head_size,
                         Dtype(d.dtype), Layout(d.layout), d.flags)

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block over all layers, K and V (also one record of :meth:`read_blocks`)."""
        return self.desc.bytes_per_block

    def layer(self, layer: int) -> Tuple[int, int, Tuple[int, int, int]]:
        """Layer ``layer``'s K and V base addresses and the (block, slot, head) element strides."""
        k, v = ctypes.c_void_p(), ctypes.c_void_p()
        strides = (ctypes.c_int64 * 3)()
        _check(_lib().pagedattn_kv_cache_get_layer(ctypes.byref(k), ctypes.byref(v), strides,
                                                   self._handle(), layer))
        return k.value or 0, v.value or 0, (strides[0], strides[1], strides[2])

    def write(self, layer: int, key: Any, value: Any, slot_mapping: Any, *, k_scale: float = 1.0,
              v_scale: float = 1.0, stream: Optional[int] = None) -> None:
        """Reshape-and-cache: stores ``key[t]``, ``value[t]`` (``[T, Hkv, D]``) at
        ``slot_mapping[t]`` of ``layer`` (-1 skips a token). ``slot_mapping`` is a list or an
        int32/int64 array (numpy or ``__dlpack__``). Nothing is written if a slot is out of range.
        """
        h = self._handle()
        if isinstance(slot_mapping, (list, tuple)) or (
                isinstance(slot_mapping, np.ndarray) and slot_mapping.dtype.kind in "iu"
                and slot_mapping.dtype not in (np.int32, np.int64)):
            slot_mapping = int_array(slot_mapping, np.int64, "slot_mapping")
        tk, tv = as_tensor(key, "key"), as_tensor(value, "value")
        ts = as_tensor(slot_mapping, "slot_mapping")
        _check(_lib().pagedattn_kv_cache_write(h, layer, tk.pointer, tv.pointer, ts.pointer,
                                               k_scale, v_scale, stream))

    def copy_blocks(self, pairs: Any, *, stream: Optional[int] = None) -> None:
        """Copies whole blocks (K and V, every layer): ``pairs`` is ``[(src, dst), ...]`` or a
        flat ``[src0, dst0, src1, dst1, ...]``. All pairs are checked before anything is copied."""
        h = self._handle()
        arr = _pairs_array(pairs)
        _check(_lib().pagedattn_kv_cache_copy_blocks(h, _i32p(arr), arr.size // 2, stream))

    def swap_blocks(self, src: "KVCache", pairs: Any, *, stream: Optional[int] = None) -> None:
        """Copies blocks from cache ``src`` into this cache: ``src`` block ``s`` -> block ``d`` of
        ``self`` for each ``(s, d)`` (same geometry; devices may differ)."""
        h, sh = self._handle(), src._handle()
        arr = _pairs_array(pairs)
        _check(_lib().pagedattn_kv_cache_swap_blocks(h, sh, _i32p(arr), arr.size // 2, stream))

    def read_blocks(self, block_ids: Any, *, stream: Optional[int] = None) -> np.ndarray:
        """Exports blocks to host memory: a ``uint8`` array ``[len(block_ids), bytes_per_block]``
        (per id, per layer: the K block then the V block, packed in the cache's layout)."""
        h = self._handle()
        ids = int_array(block_ids, np.int32, "block_ids").reshape(-1)
        bpb = self.bytes_per_block
        buf = np.zeros((ids.size, bpb), dtype=np.uint8)
        _check(_lib().pagedattn_kv_cache_read_blocks(h, _i32p(ids), ids.size,
                                                     buf.ctypes.data, buf.nbytes, stream))
        return buf

    def load_blocks(self, block_ids: Any, buffer: Any, *, stream: Optional[int] = None) -> None:
        """The inverse of :meth:`read_blocks`: loads blocks from a host buffer in its format."""
        h = self._handle()
        ids = int_array(block_ids, np.int32, "block_ids").reshape(-1)
        buf = np.ascontiguousarray(buffer)
        _check(_lib().pagedattn_kv_cache_load_blocks(h, _i32p(ids), ids.size, buf.ctypes.data,
                                                     buf.nbytes, stream))


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
        arr[i, :len(r)] = int_array(r, np.int32, name) if r else []
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
        desc.max_num_seqs, desc.max_num_tokens = max_num_seqs, max_num_tokens
        desc.max_blocks_per_seq, desc.max_num_encoder_tokens = max_blocks_per_seq, \
            max_num_encoder_tokens
        desc.max_seq_len = max_seq_len
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
        d.num_seqs = q.size
        d.query_lens, d.context_lens = _i32p(q), _i32p(c)
        d.block_tables, d.block_table_stride = _i32p(tables), width
        d.slot_mapping = _i64p(sm)
        d.encoder_lens = _i32p(enc)
        d.cross_block_tables, d.cross_block_table_stride = _i32p(xt), xwidth
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
    """
    bh = backend._handle()
    batch_h = _handle_or_null(batch)
    cache_h = _handle_or_null(cache)
    attention_type = AttentionType(attention_type)
    tq = as_tensor(q, "q")
    if len(tq.shape) != 3 and (num_heads is None or head_size is None):
        raise ValueError(f"q: expected [num_tokens, H, D], got shape {tq.shape}")
    tk = None if k is None else as_tensor(k, "k")
    tv = None if v is None else as_tensor(v, "v")
    H = num_heads if num_heads is not None else tq.shape[1]
    D = head_size if head_size is not None else tq.shape[2]
    if num_kv_heads is None:
        if tk is not None and len(tk.shape) == 3:
            num_kv_heads = tk.shape[1]
        elif cache is not None:
            num_kv_heads = cache.desc.num_kv_heads
        else:
            num_kv_heads = H
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


__all__ = [
    "AttentionType", "Backend", "BackendInfo", "Batch", "BatchInfo", "BFloat16Array",
    "CacheDesc", "Capabilities", "DLPackCode", "DLPackDtype", "Dtype", "Feature", "KVCache",
    "Layout", "PagedAttnError", "Status", "TensorArg", "backends", "bytes_per_block",
    "dtype_from_dlpack", "dtype_name", "dtype_size", "dtype_to_dlpack", "forward", "last_error",
    "merge_states", "status_string", "version", "version_string",
]
