"""The library's log messages (``pagedattn_set_log_callback``), to a Python callable or to the
standard :mod:`logging` module."""

import enum
import logging
import threading
from typing import Callable, Optional

from . import _ffi
from ._status import PagedAttnError, Status, _check, _lib


class LogLevel(enum.IntEnum):
    """``pagedattn_log_level``: each level passes the ones above it too."""

    ERROR = 0  # a call failed: "<status name>: <message>"
    INFO = 1   # a backend created (its settings), what "auto" passed over
    DEBUG = 2  # caches and batches created and destroyed, with their sizes


_lock = threading.Lock()
# The ctypes trampoline the library holds: kept alive here until it is replaced.
_installed: Optional[_ffi.LogFn] = None
# Set while this thread runs the callback. The library holds a shared lock during the call and
# a setter waits for it, so a setter called from inside must be refused before taking _lock:
# another thread's setter may hold _lock while it waits for this very call to return.
_inside = threading.local()

_TO_LOGGING = {LogLevel.ERROR: logging.ERROR, LogLevel.INFO: logging.INFO,
               LogLevel.DEBUG: logging.DEBUG}


def set_log_callback(fn: Optional[Callable[[LogLevel, str], None]],
                     level: LogLevel = LogLevel.ERROR) -> None:
    """Sends the library's messages at ``level`` and above to ``fn(level, message)``; ``None``
    stops logging. Process-wide: replaces any earlier callback, which is no longer called once
    this returns. ``fn`` runs on the thread that made the call being logged (never on a worker
    thread); an exception it raises is reported by Python as unraisable and does not reach the
    call. Calls made from inside ``fn`` are not logged.

    Raises:
        PagedAttnError: ``INVALID_ARGUMENT`` when called from inside the callback.
        ValueError: ``level`` is not a :class:`LogLevel`.
    """
    global _installed
    level = LogLevel(level)
    if getattr(_inside, "active", False):
        raise PagedAttnError(Status.INVALID_ARGUMENT,
                             "set_log_callback called from inside the log callback")
    with _lock:
        if fn is None:
            _check(_lib().pagedattn_set_log_callback(_ffi.LogFn(), None, int(level)))
            _installed = None
            return

        def trampoline(_user: Optional[int], raw_level: int, message: bytes) -> None:
            _inside.active = True
            try:
                fn(LogLevel(raw_level), message.decode("utf-8", "replace"))
            finally:
                _inside.active = False

        cb = _ffi.LogFn(trampoline)
        _check(_lib().pagedattn_set_log_callback(cb, None, int(level)))
        _installed = cb  # the old trampoline is no longer called: it may go


def log_to_logging(level: LogLevel = LogLevel.INFO,
                   logger: Optional[logging.Logger] = None) -> None:
    """Routes the library's messages at ``level`` and above to ``logger`` (default
    ``logging.getLogger("pagedattn")``) at the matching :mod:`logging` level."""
    target = logger if logger is not None else logging.getLogger("pagedattn")
    set_log_callback(lambda lv, msg: target.log(_TO_LOGGING[lv], "%s", msg), level)

