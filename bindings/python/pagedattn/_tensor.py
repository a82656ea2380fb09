"""Turning numpy arrays and ``__dlpack__`` objects into ``pagedattn_tensor`` descriptors.

Every tensor reaches C as the address of a DLPack ``DLTensor``, which is laid out exactly like
``pagedattn_tensor``:

- numpy arrays export themselves through numpy's own ``__dlpack__`` (zero copy; the capsule
  carries the shape and strides, so nothing is built in Python). Read-only arrays, which numpy
  does not export, get a ``TensorStruct`` built here instead.
- ``ml_dtypes`` arrays (``bfloat16``, ``float8_e4m3fn``, ``float8_e5m2``) and
  :class:`BFloat16Array` are exported as same-sized unsigned integers and their DLPack type code
  is then set to the real one. ``ml_dtypes`` is never imported: arrays are recognised by their
  dtype.
- Any other object with ``__dlpack__`` (a torch tensor, a CuPy array...) is consumed zero copy.
  On a GPU backend the consumer's stream is passed per the DLPack protocol (see
  :func:`dlpack_stream`).

The capsule is kept alive until the call returns and is then released by its producer.

Integers bound for C (:func:`int_array` for arrays, :func:`checked_int` for scalars) are checked
against their C type first: ctypes would silently keep only the low bits.
"""

from __future__ import annotations

import ctypes
import operator
import struct
import sys
from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import _ffi

# DLPack codes (tensor.h).
DLPACK_INT = 0
DLPACK_UINT = 1
DLPACK_FLOAT = 2
DLPACK_BFLOAT = 4
DLPACK_FLOAT8_E4M3FN = 10
DLPACK_FLOAT8_E5M2 = 12
DEVICE_CPU = 1
DEVICE_CUDA = 2
DEVICE_ROCM = 10
_KNOWN_DEVICES = {1: "cpu", 2: "cuda", 3: "cuda_host", 10: "rocm", 11: "rocm_host"}

_pyapi = ctypes.pythonapi
_pyapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_pyapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_pointer = _pyapi.PyCapsule_GetPointer
# Byte offset of the DLPack type code in a DLTensor.
_CODE_OFFSET = _ffi.TensorStruct.dtype.offset + _ffi.DLDataType.code.offset


class BFloat16Array:
    """A numpy ``uint16`` array whose elements are bfloat16 bit patterns.

    Pass it wherever a tensor is accepted to mean "bfloat16"; the memory is used in place.
    ``.array`` is the underlying ``uint16`` array; :meth:`to_float32` decodes it. With
    ``ml_dtypes`` installed, a numpy array of dtype ``ml_dtypes.bfloat16`` works as well.
    """

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        if not isinstance(array, np.ndarray) or array.dtype != np.uint16:
            raise TypeError("BFloat16Array needs a numpy uint16 array of bfloat16 bit patterns")
        self.array = array

    @property
    def shape(self) -> Tuple[int, ...]:
        """The array's shape."""
        return tuple(self.array.shape)

    def to_float32(self) -> np.ndarray:
        """Decodes to float32 (exact)."""
        return from_bfloat16(self.array)

    def __repr__(self) -> str:
        return f"BFloat16Array(shape={self.shape})"


def to_bfloat16(x: Any) -> BFloat16Array:
    """Rounds float values to bfloat16 (round to nearest even) into a new :class:`BFloat16Array`."""
    f = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return BFloat16Array(rounded)


def from_bfloat16(bits: Any) -> np.ndarray:
    """Decodes bfloat16 values to float32: a uint16 array of bit patterns, a
    :class:`BFloat16Array` or an ``ml_dtypes.bfloat16`` array."""
    if isinstance(bits, BFloat16Array):
        bits = bits.array
    elif isinstance(bits, np.ndarray) and _is_ml_dtype(bits.dtype, "bfloat16"):
        bits = bits.view(np.uint16)
    b = np.ascontiguousarray(np.asarray(bits, dtype=np.uint16))
    return (b.astype(np.uint32) << 16).view(np.float32)


def _is_ml_dtype(dt: np.dtype, name: str) -> bool:
    """True for ``ml_dtypes``' dtype ``name`` (recognised without importing ml_dtypes)."""
    return dt.name == name and _from_ml_dtypes(dt)


def _from_ml_dtypes(dt: np.dtype) -> bool:
    return getattr(dt.type, "__module__", "").startswith("ml_dtypes")


# ml_dtypes dtypes by name: (DLPack code, bits, unsigned dtype of the same size).
_ML_DTYPES = {
    "bfloat16": (DLPACK_BFLOAT, 16, np.dtype(np.uint16)),
    "float8_e4m3fn": (DLPACK_FLOAT8_E4M3FN, 8, np.dtype(np.uint8)),
    "float8_e5m2": (DLPACK_FLOAT8_E5M2, 8, np.dtype(np.uint8)),
}
_KIND_CODES = {"f": DLPACK_FLOAT, "i": DLPACK_INT, "u": DLPACK_UINT}
_BF16_BITS = (DLPACK_BFLOAT, 16, None)  # BFloat16Array: already uint16, only the code changes

# numpy dtype -> (code, bits, view dtype or None) or None (not exportable); filled on first use.
_CODES: Dict[np.dtype, Optional[Tuple[int, int, Optional[np.dtype]]]] = {}


def _code_of(dt: np.dtype) -> Optional[Tuple[int, int, Optional[np.dtype]]]:
    """How arrays of dtype ``dt`` cross: the DLPack (code, bits) and, for types numpy cannot
    export itself (ml_dtypes), the unsigned dtype to export them as. None if they cannot."""
    try:
        return _CODES[dt]
    except KeyError:
        pass
    entry = None
    if dt.byteorder != ">":
        if _from_ml_dtypes(dt):  # before the kinds: some (float8_e5m2) claim kind "f"
            entry = _ML_DTYPES.get(dt.name)
        elif dt.kind in _KIND_CODES:
            entry = (_KIND_CODES[dt.kind], dt.itemsize * 8, None)
    _CODES[dt] = entry
    return entry


def _numpy_dtype(arr: np.ndarray, name: str) -> Tuple[int, int]:
    entry = _code_of(arr.dtype)
    if entry is None:
        raise TypeError(f"{name}: numpy dtype {arr.dtype} cannot cross to pagedattn (use float32, "
                        "float16, ml_dtypes.bfloat16, BFloat16Array, int32 or int64)")
    return entry[0], entry[1]


def _from_numpy(arr: np.ndarray, name: str, code_bits: Optional[Tuple[int, int]],
                writable: bool) -> Tuple[int, Any]:
    """A TensorStruct built here for an array numpy does not export (read-only, odd strides):
    its address and what must outlive the call."""
    if writable and not arr.flags.writeable:
        raise ValueError(f"{name}: the array is read-only but pagedattn writes it")
    if arr.dtype.byteorder == ">":
        raise TypeError(f"{name}: big-endian arrays are not supported")
    code, bits = code_bits if code_bits else _numpy_dtype(arr, name)
    item = arr.dtype.itemsize
    strides = []
    for s in arr.strides:
        if s % item:
            raise ValueError(f"{name}: byte stride {s} is not a multiple of the element size {item}")
        strides.append(s // item)
    nd = arr.ndim
    shape_arr = (_ffi.c_int64 * max(nd, 1))(*arr.shape)
    stride_arr = (_ffi.c_int64 * max(nd, 1))(*strides)
    t = _ffi.TensorStruct()
    t.data = arr.ctypes.data
    t.device = _ffi.Device(DEVICE_CPU, 0)
    t.ndim = nd
    t.dtype = _ffi.DLDataType(code, bits, 1)
    t.shape = shape_arr
    t.strides = stride_arr
    t.byte_offset = 0
    return ctypes.addressof(t), (arr, shape_arr, stride_arr, t)


def _numpy_address(arr: np.ndarray, name: str, writable: bool,
                   entry: Any = None) -> Tuple[int, Any]:
    """Address of a DLTensor describing ``arr`` in place, and the capsule that owns it."""
    if entry is None:
        entry = _CODES.get(arr.dtype, False)
        if entry is False:
            entry = _code_of(arr.dtype)
    if entry is None or not arr.flags.writeable:
        return _from_numpy(arr, name, None if entry is None else entry[:2], writable)
    view = entry[2]
    try:
        capsule = arr.__dlpack__() if view is None else arr.view(view).__dlpack__()
    except BufferError:  # numpy's own refusals (e.g. strides it cannot express): build it here
        return _from_numpy(arr, name, entry[:2], writable)
    addr = _capsule_pointer(capsule, b"dltensor")
    if view is not None or entry is _BF16_BITS:
        ctypes.memset(addr + _CODE_OFFSET, entry[0], 1)
    return addr, capsule


def dlpack_stream(obj: Any, stream: Optional[int]) -> Optional[int]:
    """The ``stream=`` a consumer on a GPU backend passes to ``obj.__dlpack__`` (DLPack
    protocol): on CUDA the stream handle, with the legacy default stream (None or 0 here) as
    1; on ROCm the handle, with the default stream as 0; None for host memory, where the
    protocol requires None, and for producers without ``__dlpack_device__``."""
    device = getattr(obj, "__dlpack_device__", None)
    if device is None:
        return None
    device_type = int(device()[0])
    if device_type == DEVICE_CUDA:
        return stream if stream else 1
    if device_type == DEVICE_ROCM:
        return stream if stream else 0
    return None


def _dlpack_address(obj: Any, name: str, gpu: bool, stream: Optional[int]) -> Tuple[int, Any]:
    """Address of the DLTensor in ``obj.__dlpack__()``'s capsule, and the capsule."""
    try:
        s = dlpack_stream(obj, stream) if gpu else None
        capsule = obj.__dlpack__() if s is None else obj.__dlpack__(stream=s)
    except Exception as e:  # the producer's own refusal (e.g. a tensor that needs grad)
        raise TypeError(f"{name}: __dlpack__() failed: {e}") from e
    try:
        # DLManagedTensor starts with its DLTensor, which is laid out as pagedattn_tensor.
        addr = _capsule_pointer(capsule, b"dltensor")
    except ValueError:  # not a capsule, another name, or already consumed ("used_dltensor")
        raise TypeError(f"{name}: __dlpack__() did not return an unconsumed 'dltensor' "
                        "capsule") from None
    # The capsule owns the DLManagedTensor: keeping it (and obj) alive keeps the memory and the
    # descriptor valid; released unconsumed, its producer frees them.
    return addr, (obj, capsule)


# Plain CPU torch tensors skip the DLPack export (~1.2 us with its capsule): their descriptor is
# built here as int64 words, a DLTensor followed by its shape and strides (words 1 and 2 hold
# (device_type, device_id) and (ndim, code, bits, lanes), packed little-endian). A descriptor
# depends only on (data_ptr, dtype, shape, strides) and the library never writes it, so built
# ones are kept by that key and shared.
_FAST_TORCH = sys.byteorder == "little"
_TORCH_WORDS: Dict[Any, int] = {}  # torch dtype -> word 2 less ndim; filled when torch is seen
# ndim -> (ctypes array type of 6 + 2 * ndim int64s, the pack_into that fills one)
_WORD_ARRAYS: Dict[int, Tuple[Any, Any]] = {}
_TORCH_DESCS: Dict[Tuple[Any, ...], Tuple[int, Any]] = {}
_TORCH_DESCS_MAX = 1024


def _torch_words() -> Dict[Any, int]:
    """The dtypes torch exports through DLPack, as descriptor words."""
    torch = sys.modules["torch"]
    table = {"float32": (DLPACK_FLOAT, 32), "float16": (DLPACK_FLOAT, 16),
             "float64": (DLPACK_FLOAT, 64), "bfloat16": (DLPACK_BFLOAT, 16),
             "int8": (DLPACK_INT, 8), "int16": (DLPACK_INT, 16), "int32": (DLPACK_INT, 32),
             "int64": (DLPACK_INT, 64), "uint8": (DLPACK_UINT, 8)}
    for n, (code, bits) in table.items():
        _TORCH_WORDS[getattr(torch, n)] = (code << 32) | (bits << 40) | (1 << 48)
    _TORCH_WORDS["strided"] = torch.strided
    return _TORCH_WORDS


def _torch_address(obj: Any) -> Optional[Tuple[int, Any]]:
    """The descriptor of a plain CPU torch tensor, read from its attributes, and what must
    outlive the call; None for what the DLPack export handles (and checks): tensors that need
    grad, other devices and layouts, dtypes outside the table."""
    words = _TORCH_WORDS or _torch_words()
    try:
        if obj.requires_grad or not obj.is_cpu or obj.layout is not words["strided"]:
            return None
        key = (obj.data_ptr(), obj.dtype, obj.shape, obj.stride())
        hit = _TORCH_DESCS.get(key)
        if hit is None:
            word = words.get(key[1])
            if word is None:
                return None
            nd = len(key[2])
            kind = _WORD_ARRAYS.get(nd)
            if kind is None:
                n = 6 + 2 * nd
                kind = _WORD_ARRAYS[nd] = (_ffi.c_int64 * n, struct.Struct(f"<{n}q").pack_into)
            buf = kind[0]()
            a = ctypes.addressof(buf)
            kind[1](buf, 0, key[0], DEVICE_CPU, nd | word, a + 48, a + 48 + 8 * nd, 0,
                    *key[2], *key[3])
            if len(_TORCH_DESCS) >= _TORCH_DESCS_MAX:
                _TORCH_DESCS.clear()
            hit = _TORCH_DESCS[key] = (a, buf)
    except Exception:  # anything unusual (nested tensors...): the DLPack export decides
        return None
    return hit[0], (obj, hit[1])


def describe(obj: Any, name: str, writable: bool = False, gpu: bool = False,
             stream: Optional[int] = None) -> Tuple[int, Any]:
    """``obj`` as a ``pagedattn_tensor``: its address and an object to keep alive until the
    call returns. ``gpu``: the backend computes on a GPU, so ``__dlpack__`` gets ``stream``
    per the protocol.

    Raises:
        TypeError: not a tensor, a dtype numpy arrays cannot cross with, or a refused export.
        ValueError: a read-only array that would be written, or unusable strides.
    """
    if type(obj) is np.ndarray:
        # Plain dtypes of writable arrays, numpy's own export (what _numpy_address does first).
        entry = _CODES.get(obj.dtype)
        if entry is not None and entry[2] is None and obj.flags.writeable:
            try:
                capsule = obj.__dlpack__()
            except BufferError:
                return _from_numpy(obj, name, entry[:2], writable)
            return _capsule_pointer(capsule, b"dltensor"), capsule
        return _numpy_address(obj, name, writable)
    if isinstance(obj, BFloat16Array):
        return _numpy_address(obj.array, name, writable, _BF16_BITS)
    if isinstance(obj, np.ndarray):
        return _numpy_address(obj, name, writable)
    if _FAST_TORCH and type(obj).__name__ == "Tensor" and type(obj).__module__ == "torch":
        fast = _torch_address(obj)
        if fast is not None:
            return fast
    if hasattr(obj, "__dlpack__"):
        return _dlpack_address(obj, name, gpu, stream)
    raise TypeError(f"{name}: expected a numpy array, a BFloat16Array or an object with "
                    f"__dlpack__, got {type(obj).__name__}")


def float32_vector(x: Any, name: str, gpu: bool, stream: Optional[int]) -> Tuple[Any, Any]:
    """A float32 vector argument (ALiBi slopes, sinks, per-head scales) as a tensor address
    and the object keeping it alive: a list or tuple of floats becomes a numpy float32 array;
    numpy arrays and ``__dlpack__`` objects are passed as they are (the library checks the
    dtype and shape). ``(None, None)`` for None."""
    if x is None:
        return None, None
    if isinstance(x, (list, tuple)):
        x = np.asarray(x, dtype=np.float32)
    return describe(x, name, False, gpu, stream)


def shape_of(obj: Any, address: int) -> Tuple[int, ...]:
    """The shape of a described tensor: the object's own ``shape`` tuple when it has one (numpy,
    torch), else the DLTensor's."""
    if isinstance(obj, BFloat16Array):
        return obj.array.shape
    shape = getattr(obj, "shape", None)
    if isinstance(shape, tuple):
        return shape
    t = _ffi.TensorStruct.from_address(address)
    return tuple(t.shape[i] for i in range(t.ndim))


class TensorArg:
    """A described tensor for one call: its ``pagedattn_tensor`` address, what must outlive the
    call, its shape, and (read on demand) the descriptor's fields."""

    __slots__ = ("address", "keep", "shape")

    def __init__(self, address: int, keep: Any, shape: Tuple[int, ...]) -> None:
        self.address = address
        self.keep = keep
        self.shape = tuple(shape)

    @property
    def struct(self) -> _ffi.TensorStruct:
        """The descriptor (valid while ``keep`` lives)."""
        return _ffi.TensorStruct.from_address(self.address)

    @property
    def code(self) -> int:
        """DLPack type code."""
        return self.struct.dtype.code

    @property
    def bits(self) -> int:
        """Bits per element."""
        return self.struct.dtype.bits

    @property
    def device(self) -> Tuple[int, int]:
        """(DLPack device type, device id)."""
        d = self.struct.device
        return d.device_type, d.device_id

    @property
    def strides(self) -> Tuple[int, ...]:
        """Element strides (compact ones when the descriptor's strides are NULL)."""
        t = self.struct
        if t.strides:
            return tuple(t.strides[i] for i in range(t.ndim))
        out, acc = [], 1
        for n in reversed(self.shape):
            out.append(acc)
            acc *= n
        return tuple(reversed(out))

    @property
    def data_ptr(self) -> int:
        """Address of the first element."""
        t = self.struct
        return (t.data or 0) + int(t.byte_offset)


def as_tensor(obj: Any, name: str, *, writable: bool = False, gpu: bool = False,
              stream: Optional[int] = None) -> TensorArg:
    """Describes ``obj`` (numpy array, :class:`BFloat16Array`, or ``__dlpack__`` object) as a
    :class:`TensorArg`; DLPack exports are also checked for vector types and unknown devices
    (the library refuses both as well, with less specific messages)."""
    addr, keep = describe(obj, name, writable, gpu, stream)
    arg = TensorArg(addr, keep, shape_of(obj, addr))
    if not isinstance(obj, (np.ndarray, BFloat16Array)):
        t = arg.struct
        if t.device.device_type not in _KNOWN_DEVICES:
            raise ValueError(f"{name}: DLPack device type {t.device.device_type} is not one "
                             "pagedattn knows (cpu, cuda, cuda_host, rocm, rocm_host)")
        if t.dtype.lanes != 1:
            raise TypeError(f"{name}: vector dtypes (lanes={t.dtype.lanes}) are not supported")
    return arg


def empty_like(obj: Any, shape: Tuple[int, ...], dtype_of: Any = None) -> Any:
    """A new uninitialised tensor of ``shape`` with the dtype and kind of ``dtype_of or obj``:
    numpy (ml_dtypes included) for numpy, :class:`BFloat16Array` for one, ``new_empty`` (torch)
    otherwise."""
    ref = obj if dtype_of is None else dtype_of
    if isinstance(ref, BFloat16Array):
        return BFloat16Array(np.empty(shape, dtype=np.uint16))
    if isinstance(ref, np.ndarray):
        return np.empty(shape, dtype=ref.dtype)
    new_empty = getattr(ref, "new_empty", None)  # torch
    if callable(new_empty):
        return new_empty(shape)
    raise TypeError(f"cannot allocate an output like {type(ref).__name__}: pass out= explicitly")


def empty_float32_like(ref: Any, shape: Tuple[int, ...], what: str) -> Any:
    """A new uninitialised float32 tensor of ``shape`` of the same kind as ``ref``: numpy for
    numpy arrays and :class:`BFloat16Array`, torch (same device) for torch tensors."""
    if isinstance(ref, (np.ndarray, BFloat16Array)):
        return np.empty(shape, dtype=np.float32)
    torch = sys.modules.get("torch")  # a torch tensor means torch is imported already
    if torch is not None and isinstance(ref, torch.Tensor):
        return ref.new_empty(shape, dtype=torch.float32)
    raise TypeError(f"{what}=True cannot allocate a float32 tensor like {type(ref).__name__}: "
                    f"pass {what}= a tensor")


# (min, max, name) of the C integer types by numpy name, computed once: np.iinfo costs ~7 us.
_LIMITS = {t: (int(np.iinfo(t).min), int(np.iinfo(t).max), np.iinfo(t).dtype.name)
           for t in ("uint8", "uint16", "int32", "uint32", "int64", "uint64", "intc", "uintp")}


def checked_int(value: Any, ctype: str, name: str) -> int:
    """``value`` as an int for a C field or argument of type ``ctype`` (a numpy integer type
    name such as ``"int32"`` or ``"uint64"``), checked before it reaches ctypes.

    Accepts ints, numpy integers and anything with ``__index__``; like numpy's sizes, refuses
    bools and floats (even 2.0).

    Raises:
        TypeError: ``value`` is not an integer.
        OverflowError: it does not fit ``ctype``, e.g. "layer = 4294967296 does not fit int32".
    """
    if type(value) is int:  # the common case, checked without the general conversions
        lo, hi, cname = _LIMITS[ctype]
        if lo <= value <= hi:
            return value
        raise OverflowError(f"{name} = {value} does not fit {cname}")
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected an integer, got a bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}") from None
    lo, hi, cname = _LIMITS[ctype]
    if not lo <= v <= hi:
        raise OverflowError(f"{name} = {v} does not fit {cname}")
    return v


def stream_arg(stream: Any) -> Optional[int]:
    """A GPU stream for a ``void*`` argument: None (the default stream), an int address or a
    ``ctypes.c_void_p``."""
    if stream is None:
        return None
    if isinstance(stream, ctypes.c_void_p):
        return stream.value
    return checked_int(stream, "uintp", "stream")


_INT_TYPES = {int}
# int_array's target dtypes: dtype argument -> (numpy dtype, C type name, min, max).
_INT_DTYPES: Dict[Any, Tuple[np.dtype, str, int, int]] = {}
# (source dtype, target dtype) -> whether every source value fits the target.
_SAFE_CASTS: Dict[Tuple[np.dtype, np.dtype], bool] = {}


def int_array(x: Any, dtype: Any, name: str) -> np.ndarray:
    """A C-contiguous integer numpy array (copied only if needed) with range checking; an
    element that does not fit is named with its index, as :func:`checked_int` names scalars."""
    info = _INT_DTYPES.get(dtype)
    if info is None:
        dt = np.dtype(dtype)
        info = _INT_DTYPES[dtype] = (dt, dt.name) + _LIMITS[dt.name][:2]
    dt, ctype, lo, hi = info
    if type(x) is list or type(x) is tuple:
        # A flat list of Python ints (the common case): checked with the builtins.
        if not x:
            return np.zeros(0, dtype=dt)
        if set(map(type, x)) == _INT_TYPES and lo <= min(x) and max(x) <= hi:
            return np.array(x, dtype=dt)
    elif type(x) is np.ndarray and x.dtype.kind in "iu":
        safe = _SAFE_CASTS.get((x.dtype, dt))
        if safe is None:
            safe = _SAFE_CASTS[(x.dtype, dt)] = bool(np.can_cast(x.dtype, dt, "safe"))
        if safe:  # every value fits: no range check needed
            return np.ascontiguousarray(x, dtype=dt)
    arr = np.asarray(x)

    def element(i: int) -> str:
        if arr.ndim == 0:
            return name
        return f"{name}[{', '.join(str(j) for j in np.unravel_index(i, arr.shape))}]"

    if arr.dtype == object:  # Python ints beyond 64 bits, or things that are not integers
        for i, v in enumerate(arr.flat):
            checked_int(v, ctype, element(i))
        return np.ascontiguousarray(arr.astype(dtype))
    if arr.dtype.kind not in "iu" and arr.size:
        raise TypeError(f"{name}: expected integers, got {arr.dtype}")
    # Compared as Python ints: numpy compares uint64 with int64 bounds in float64, where
    # 2**63 equals the int64 maximum.
    if arr.size and (int(arr.min()) < lo or int(arr.max()) > hi):
        i = next(i for i, v in enumerate(arr.flat) if not lo <= int(v) <= hi)
        raise OverflowError(f"{element(i)} = {arr.flat[i]} does not fit {ctype}")
    return np.ascontiguousarray(arr, dtype=dtype)


def _i32p(arr: Optional[np.ndarray]) -> Any:
    return None if arr is None else arr.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
