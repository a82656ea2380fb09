"""Statuses and errors: :class:`Status`, :class:`PagedAttnError`, the check every call goes
through, and the library's version."""

from __future__ import annotations

import ctypes
import enum
import re
from typing import Tuple, Union

from . import _ffi
from ._tensor import checked_int


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


class PagedAttnError(Exception):
    """A pagedattn call failed.

    Attributes:
        code: the :class:`Status`.
        message: the library's ``pagedattn_last_error()`` for the failing call, with DLPack
            dtypes named in plain words (or, for errors the binding detects itself such as a
            closed handle, the binding's message).

    A refused dtype raises the subclass :class:`PagedAttnTypeError` (also a ``TypeError``), or
    :class:`PagedAttnValueError` (also a ``ValueError``) for a value that names no dtype.
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


class PagedAttnTypeError(PagedAttnError, TypeError):
    """A tensor or cache dtype the call cannot take (``float64`` q, int32 slots of the wrong
    kind, q of another dtype than the cache...): a :class:`PagedAttnError` and a
    :class:`TypeError`."""


class PagedAttnValueError(PagedAttnError, ValueError):
    """A dtype value that names no dtype (an unknown name, an integer outside the enum): a
    :class:`PagedAttnError` and a :class:`ValueError`."""


# DLPack type codes by plain name prefix; fp8 and bool have fixed names.
_DLPACK_PREFIXES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex"}
_DLPACK_FIXED = {(6, 8): "bool", (10, 8): "float8_e4m3fn", (12, 8): "float8_e5m2"}
_DLPACK_DTYPE = re.compile(r"\{code (\d+), bits (\d+), lanes (\d+)\}")


def dlpack_dtype_name(code: int, bits: int, lanes: int = 1) -> str:
    """A DLPack dtype in plain words: ``float64``, ``bfloat16``, ``float8_e4m3fn``,
    ``float32x4`` for vectors; ``{code 3, bits 64, lanes 1}`` for codes without a name."""
    name = _DLPACK_FIXED.get((code, bits))
    if name is None:
        prefix = _DLPACK_PREFIXES.get(code)
        if prefix is None:
            return f"{{code {code}, bits {bits}, lanes {lanes}}}"
        name = f"{prefix}{bits}"
    return name if lanes == 1 else f"{name}x{lanes}"


def _plain(m: "re.Match[str]") -> str:
    return dlpack_dtype_name(int(m.group(1)), int(m.group(2)), int(m.group(3)))


def error(status: int, message: str) -> PagedAttnError:
    """The exception for a failed call: DLPack dtypes in the message named in plain words, and
    a dtype refusal also a :class:`TypeError` (or :class:`ValueError` for a value that is no
    dtype)."""
    if "{code " in message:
        message = _DLPACK_DTYPE.sub(_plain, message)
    if "dtype" in message and status in (Status.INVALID_ARGUMENT, Status.BAD_TENSOR,
                                         Status.UNSUPPORTED):
        if "is not a valid pagedattn_dtype" in message:
            return PagedAttnValueError(status, message)
        return PagedAttnTypeError(status, message)
    return PagedAttnError(status, message)


def _lib() -> ctypes.CDLL:
    return _ffi.load()


def _check(status: int) -> None:
    """Raises :class:`PagedAttnError` for a failing status, reading the thread's message now."""
    if status != 0:
        raw = _lib().pagedattn_last_error()
        raise error(status, raw.decode("utf-8", "replace") if raw else "")


def status_string(status: Union[Status, int]) -> str:
    """The C name of a status (``pagedattn_status_string``).

    Raises:
        TypeError, OverflowError: ``status`` is not an integer, or does not fit the C ``int``.
    """
    return _lib().pagedattn_status_string(checked_int(status, "intc", "status")).decode()


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


__all__ = ["PagedAttnError", "PagedAttnTypeError", "PagedAttnValueError", "Status",
           "dlpack_dtype_name", "last_error", "status_string", "version", "version_string"]
