"""Turning numpy arrays and ``__dlpack__`` objects into ``pagedattn_tensor`` descriptors.

numpy arrays are described directly (their memory is used in place). Any other object with
``__dlpack__`` (a torch tensor, a CuPy array...) is consumed zero-copy: its DLPack capsule's
``DLTensor`` is laid out exactly like ``pagedattn_tensor``, so its pointer is passed as is. The
capsule is kept alive until the call returns and then released by its producer.

numpy has no bfloat16: wrap a ``uint16`` array holding bfloat16 bit patterns in
:class:`BFloat16Array` (see :func:`to_bfloat16` / :func:`from_bfloat16`).

Integers bound for C (:func:`int_array` for arrays, :func:`checked_int` for scalars) are checked
against their C type first: ctypes would silently keep only the low bits.
"""

from __future__ import annotations

import ctypes
import operator
from typing import Any, List, Optional, Tuple

import numpy as np

from . import _ffi

# DLPack codes (tensor.h).
DLPACK_INT = 0
DLPACK_UINT = 1
DLPACK_FLOAT = 2
DLPACK_BFLOAT = 4
DEVICE_CPU = 1
_KNOWN_DEVICES = {1: "cpu", 2: "cuda", 3: "cuda_host", 10: "rocm", 11: "rocm_host"}

_pyapi = ctypes.pythonapi
_pyapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_pyapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_pyapi.PyCapsule_IsValid.restype = ctypes.c_int
_pyapi.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]


class BFloat16Array:
    """A numpy ``uint16`` array whose elements are bfloat16 bit patterns.

    Pass it wherever a tensor is accepted to mean "bfloat16"; the memory is used in place.
    ``.array`` is the underlying ``uint16`` array; :meth:`to_float32` decodes it.
    """

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        if not isinstance(array, np.ndarray) or array.dtype != np.uint16:
            raise TypeError("BFloat16Array needs a numpy uint16 array of bfloat16 bit patterns")
        self.array = array

    @property
    def shape(self) -> Tuple[int, ...]:
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
    """Decodes bfloat16 bit patterns (a uint16 array or :class:`BFloat16Array`) to float32."""
    if isinstance(bits, BFloat16Array):
        bits = bits.array
    b = np.ascontiguousarray(np.asarray(bits, dtype=np.uint16))
    return (b.astype(np.uint32) << 16).view(np.float32)


class TensorArg:
    """A ``pagedattn_tensor`` for one call, plus everything that must outlive the call."""

    def __init__(self) -> None:
        self.struct: Optional[_ffi.TensorStruct] = None
        self.pointer: Any = None  # ctypes POINTER(TensorStruct)
        self.keep: List[Any] = []
        self.shape: Tuple[int, ...] = ()
        self.code = 0
        self.bits = 0
        self.device_type = DEVICE_CPU
        self.device_id = 0

    @property
    def data_ptr(self) -> int:
        t = self.pointer.contents
        return (t.data or 0) + int(t.byte_offset)


def _numpy_dtype(arr: np.ndarray, name: str) -> Tuple[int, int]:
    kind = arr.dtype.kind
    if kind == "f":
        return DLPACK_FLOAT, arr.dtype.itemsize * 8
    if kind == "i":
        return DLPACK_INT, arr.dtype.itemsize * 8
    if kind == "u":
        return DLPACK_UINT, arr.dtype.itemsize * 8
    raise TypeError(f"{name}: numpy dtype {arr.dtype} cannot cross to pagedattn "
                    "(use float32, float16, BFloat16Array, int32 or int64)")


def _from_numpy(arr: np.ndarray, name: str, code_bits: Optional[Tuple[int, int]],
                writable: bool) -> TensorArg:
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
    ta = TensorArg()
    nd = arr.ndim
    shape_arr = (_ffi.c_int64 * max(nd, 1))(*arr.shape)
    stride_arr = (_ffi.c_int64 * max(nd, 1))(*strides)
    t = _ffi.TensorStruct()
    t.data = arr.ctypes.data
    t.device = _ffi.Device(DEVICE_CPU, 0)
    t.ndim = nd
    t.dtype = _ffi.DLDataType(code, bits, 1)
    t.shape = ctypes.cast(shape_arr, ctypes.POINTER(_ffi.c_int64))
    t.strides = ctypes.cast(stride_arr, ctypes.POINTER(_ffi.c_int64))
    t.byte_offset = 0
    ta.struct = t
    ta.pointer = ctypes.pointer(t)
    ta.keep = [arr, shape_arr, stride_arr, t]
    ta.shape = tuple(arr.shape)
    ta.code, ta.bits = code, bits
    return ta


def _from_dlpack(obj: Any, name: str) -> TensorArg:
    try:
        capsule = obj.__dlpack__()
    except Exception as e:  # the producer's own refusal (e.g. a tensor that needs grad)
        raise TypeError(f"{name}: __dlpack__() failed: {e}") from e
    if not _pyapi.PyCapsule_IsValid(capsule, b"dltensor"):
        raise TypeError(f"{name}: __dlpack__() did not return an unconsumed 'dltensor' capsule")
    addr = _pyapi.PyCapsule_GetPointer(capsule, b"dltensor")
    # DLManagedTensor starts with its DLTensor, which is laid out as pagedattn_tensor.
    ptr = ctypes.cast(ctypes.c_void_p(addr), ctypes.POINTER(_ffi.TensorStruct))
    t = ptr.contents
    if t.device.device_type not in _KNOWN_DEVICES:
        raise ValueError(f"{name}: DLPack device type {t.device.device_type} is not one pagedattn "
                         "knows (cpu, cuda, cuda_host, rocm, rocm_host)")
    if t.dtype.lanes != 1:
        raise TypeError(f"{name}: vector dtypes (lanes={t.dtype.lanes}) are not supported")
    ta = TensorArg()
    ta.pointer = ptr
    # The capsule owns the DLManagedTensor: keeping it alive keeps the memory and descriptor
    # valid; when it is released unconsumed its producer frees them.
    ta.keep = [obj, capsule]
    ta.shape = tuple(t.shape[i] for i in range(t.ndim))
    ta.code, ta.bits = t.dtype.code, t.dtype.bits
    ta.device_type, ta.device_id = t.device.device_type, t.device.device_id
    return ta


def as_tensor(obj: Any, name: str, *, writable: bool = False) -> TensorArg:
    """Describes ``obj`` (numpy array, :class:`BFloat16Array`, or ``__dlpack__`` object)."""
    if isinstance(obj, BFloat16Array):
        return _from_numpy(obj.array, name, (DLPACK_BFLOAT, 16), writable)
    if isinstance(obj, np.ndarray):
        return _from_numpy(obj, name, None, writable)
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj, name)
    raise TypeError(f"{name}: expected a numpy array, a BFloat16Array or an object with "
                    f"__dlpack__, got {type(obj).__name__}")


def empty_like(obj: Any, shape: Tuple[int, ...], dtype_of: Any = None) -> Any:
    """A new uninitialised tensor of ``shape`` with the dtype (and kind) of ``dtype_of or obj``."""
    ref = obj if dtype_of is None else dtype_of
    if isinstance(ref, BFloat16Array):
        return BFloat16Array(np.empty(shape, dtype=np.uint16))
    if isinstance(ref, np.ndarray):
        return np.empty(shape, dtype=ref.dtype)
    new_empty = getattr(ref, "new_empty", None)  # torch
    if callable(new_empty):
        return new_empty(shape)
    raise TypeError(f"cannot allocate an output like {type(ref).__name__}: pass out= explicitly")


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
    if stream is None or isinstance(stream, ctypes.c_void_p):
        return None if stream is None else stream.value
    return checked_int(stream, "uintp", "stream")


def int_array(x: Any, dtype: Any, name: str) -> np.ndarray:
    """A C-contiguous integer numpy array (copied only if needed) with range checking; an
    element that does not fit is named with its index, as :func:`checked_int` names scalars."""
    arr = np.asarray(x)
    ctype = np.dtype(dtype).name

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
    lo, hi, _ = _LIMITS[ctype]
    # Compared as Python ints: numpy compares uint64 with int64 bounds in float64, where
    # 2**63 equals the int64 maximum.
    if arr.size and (int(arr.min()) < lo or int(arr.max()) > hi):
        i = next(i for i, v in enumerate(arr.flat) if not lo <= int(v) <= hi)
        raise OverflowError(f"{element(i)} = {arr.flat[i]} does not fit {ctype}")
    return np.ascontiguousarray(arr, dtype=dtype)


def _i32p(arr: Optional[np.ndarray]) -> Any:
    return None if arr is None else arr.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))


def _i64p(arr: Optional[np.ndarray]) -> Any:
    return None if arr is None else arr.ctypes.data_as(ctypes.POINTER(ctypes.c_int64))

