"""The owned C handle shared by :class:`Backend`, :class:`KVCache` and :class:`Batch`."""

from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

from ._status import PagedAttnError, Status


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
