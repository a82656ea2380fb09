"""Enumerations of the C API (dtypes, DLPack codes, layouts, attention types, features) and the
library's dtype queries."""

from __future__ import annotations

import ctypes
import enum
from typing import NamedTuple, Tuple, Type, TypeVar, Union

import numpy as np

from . import _ffi
from ._status import PagedAttnValueError, Status, _check, _lib
from ._tensor import checked_int


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
    SINKS = 1 << 12  # attention sinks (forward's ``sinks``)
    CHUNKED_LOCAL = 1 << 13  # forward's ``attention_chunk``
    HEAD_SCALES = 1 << 14  # per-KV-head fp8 scales (forward, KVCache.write)
    TREE_MASK = 1 << 15  # speculative-decoding tree masks (Batch's ``tree_mask``)
    MLA = 1 << 16  # latent caches and :func:`forward_mla`


KV_CACHE_HOST = 1  # PAGEDATTN_KV_CACHE_HOST
KV_CACHE_LATENT = 2  # PAGEDATTN_KV_CACHE_LATENT

_E = TypeVar("_E", bound=enum.IntEnum)


def enum_arg(cls: Type[_E], value: object, name: str) -> _E:
    """``value`` as a member of ``cls``: an integer first (a float such as 2.0 is a TypeError,
    as with :func:`checked_int`), then a member (ValueError otherwise)."""
    return cls(checked_int(value, "intc", name))


# Cache dtype names: the library's, numpy's / ml_dtypes' and torch's (without "torch.").
_DTYPE_NAMES = {"float32": Dtype.FLOAT32, "float16": Dtype.FLOAT16, "bfloat16": Dtype.BFLOAT16,
                "fp8_e4m3": Dtype.FP8_E4M3, "fp8_e5m2": Dtype.FP8_E5M2,
                "float8_e4m3fn": Dtype.FP8_E4M3, "float8_e5m2": Dtype.FP8_E5M2}


def dtype_arg(value: object, name: str = "dtype") -> Dtype:
    """``value`` as a cache :class:`Dtype`: a member or its integer, or a name (``"float16"``,
    ``"bfloat16"``, ``"fp8_e4m3"``, ``"float8_e4m3fn"``...), a numpy or ml_dtypes dtype, or a
    torch dtype.

    Raises:
        PagedAttnValueError: a name or dtype that is no cache dtype (``float64``), or an
            integer outside the enum.
        TypeError, OverflowError: anything else, as for other enum arguments.
    """
    if isinstance(value, Dtype):
        return value
    if isinstance(value, str):
        key = value
    elif type(value).__module__ == "torch":  # torch.float16 prints as "torch.float16"
        key = str(value)
    elif isinstance(value, np.dtype) or (isinstance(value, type) and
                                         issubclass(value, np.generic)):
        key = np.dtype(value).name
    else:
        try:
            return enum_arg(Dtype, value, name)
        except ValueError:
            raise PagedAttnValueError(Status.INVALID_ARGUMENT,
                                      f"{name} = {value!r} is not a pagedattn dtype") from None
    key = key.lower()
    found = _DTYPE_NAMES.get(key[6:] if key.startswith("torch.") else key)
    if found is None:
        raise PagedAttnValueError(
            Status.INVALID_ARGUMENT,
            f"{name}: {key} is not a cache dtype (float32, float16, bfloat16, fp8_e4m3, "
            "fp8_e5m2; or pass pa.Dtype.FLOAT16...)")
    return found


def dtype_size(dtype: Union[Dtype, int]) -> int:
    """Bytes per element of a cache dtype (``pagedattn_dtype_size``); 0 for a value that is not
    a dtype.

    Raises:
        TypeError, OverflowError: ``dtype`` is not an integer, or does not fit the C ``int``.
    """
    return int(_lib().pagedattn_dtype_size(checked_int(dtype, "intc", "dtype")))


def dtype_name(dtype: Union[Dtype, int]) -> str:
    """The library's name for a dtype (``pagedattn_dtype_name``): ``"float32"``, ``"bfloat16"``,
    ``"fp8_e4m3"``...; ``"invalid"`` for an integer that is not a dtype.

    Raises:
        TypeError, OverflowError: only when ``dtype`` is not an integer, or does not fit the C
            ``int``.
    """
    return _lib().pagedattn_dtype_name(checked_int(dtype, "intc", "dtype")).decode()


def dtype_to_dlpack(dtype: Union[Dtype, int]) -> DLPackDtype:
    """The DLPack type of tensors of ``dtype`` (``pagedattn_dtype_to_dlpack``), e.g.
    ``DLPackDtype(DLPackCode.BFLOAT, 16, 1)`` for ``Dtype.BFLOAT16``.

    Raises:
        PagedAttnError: ``INVALID_ARGUMENT`` for a value that is not a dtype.
        TypeError, OverflowError: ``dtype`` is not an integer, or does not fit the C ``int``.
    """
    value = checked_int(dtype, "intc", "dtype")
    out = _ffi.DLDataType()
    _check(_lib().pagedattn_dtype_to_dlpack(ctypes.byref(out), value))
    return DLPackDtype(_dlpack_code(out.code), out.bits, out.lanes)


def dtype_from_dlpack(dtype: Union[DLPackDtype, Tuple[int, ...]]) -> Dtype:
    """The dtype of a DLPack type (``pagedattn_dtype_from_dlpack``): ``dtype`` is a
    :class:`DLPackDtype` or a ``(code, bits[, lanes])`` tuple, e.g. ``(DLPackCode.FLOAT, 16)`` ->
    ``Dtype.FLOAT16``.

    Raises:
        PagedAttnError: ``UNSUPPORTED`` (the message names code, bits and lanes) for a type the
            library has no use for, such as int32 or a vector type.
        ValueError: a tuple of the wrong length or with values outside the C fields' ranges.
        TypeError: a value that is not an integer.
    """
    if not 2 <= len(dtype) <= 3:
        raise ValueError(f"DLPack dtype: expected (code, bits[, lanes]), got {dtype!r}")
    fields = zip(tuple(dtype) + (1,), ("uint8", "uint8", "uint16"), ("code", "bits", "lanes"))
    try:
        code, bits, lanes = (checked_int(x, ctype, name) for x, ctype, name in fields)
    except OverflowError as e:  # documented as ValueError, which callers may catch
        raise ValueError(f"DLPack dtype {dtype!r}: {e}") from None
    out = ctypes.c_int(0)
    _check(_lib().pagedattn_dtype_from_dlpack(ctypes.byref(out), _ffi.DLDataType(code, bits,
                                                                                    lanes)))
    return Dtype(out.value)


def _dlpack_code(code: int) -> int:
    try:
        return DLPackCode(code)
    except ValueError:
        return code


__all__ = [
    "AttentionType", "DLPackCode", "DLPackDtype", "Dtype", "Feature", "Layout", "dtype_arg",
    "dtype_from_dlpack", "dtype_name", "dtype_size", "dtype_to_dlpack",
]
