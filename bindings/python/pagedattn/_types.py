"""Enumerations of the C API (dtypes, DLPack codes, layouts, attention types, features) and the
library's dtype queries."""

from __future__ import annotations

import ctypes
import enum
from typing import NamedTuple, Tuple, Union

from . import _ffi
from ._status import _check, _lib


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


__all__ = [
    "AttentionType", "DLPackCode", "DLPackDtype", "Dtype", "Feature", "Layout",
    "dtype_from_dlpack", "dtype_name", "dtype_size", "dtype_to_dlpack",
]
