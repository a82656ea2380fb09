"""Backends: :func:`backends`, :class:`Backend` and its :class:`Capabilities`."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple

from . import _ffi
from ._handle import _Handle
from ._status import _check, _lib
from ._tensor import DEVICE_CUDA, DEVICE_ROCM, checked_int, stream_arg
from ._types import Dtype, Feature, Layout

if TYPE_CHECKING:  # both import Backend
    from ._batch import Batch
    from ._cache import KVCache


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
    target: str    # the SIMD target (CPU; as PAGEDATTN_CPU_TARGET spells it) or architecture
    settings: str  # every choice made at creation and every environment variable read
    # Latent (MLA) row sizes, ascending; empty without Feature.MLA.
    latent_sizes: Tuple[int, ...] = ()


@dataclass(frozen=True)
class MemoryUsage:
    """What a backend holds now (``pagedattn_memory_usage``)."""

    bytes_in_use: int  # caches it allocated, batch metadata and workspaces: what the limit bounds
    memory_limit: int  # 0 = unlimited
    num_caches: int
    num_batches: int


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
        TypeError, OverflowError: an option that is not an integer or does not fit its C field
            (int32; memory_limit uint64).

    ``close()`` is idempotent; afterwards every method raises ``INVALID_HANDLE``, while the
    caches and batches created from the backend keep working until they are closed themselves.
    """

    _kind = "Backend"

    def __init__(self, name: str = "auto", *, device_index: int = 0, num_threads: int = 0,
                 memory_limit: int = 0) -> None:
        lib = _lib()
        opts = _ffi.BackendOptionsStruct()
        _check(lib.pagedattn_backend_options_init(ctypes.byref(opts)))
        opts.device_index = checked_int(device_index, "int32", "device_index")
        opts.num_threads = checked_int(num_threads, "int32", "num_threads")
        opts.memory_limit = checked_int(memory_limit, "uint64", "memory_limit")
        out = ctypes.c_void_p()
        _check(lib.pagedattn_backend_create(ctypes.byref(out), name.encode(), ctypes.byref(opts)))
        super().__init__(out.value, lib.pagedattn_backend_destroy)
        self._caps: Optional[Capabilities] = None
        # Computes on a GPU (CUDA or ROCm device memory): DLPack exports then get a stream.
        self._gpu = self.capabilities.device_type in (DEVICE_CUDA, DEVICE_ROCM)

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
                target=(c.target or b"").decode(),
                settings=(c.settings or b"").decode("utf-8", "replace"),
                latent_sizes=tuple(32 * (i + 1) for i in range(32) if c.latent_sizes & (1 << i)),
            )
        return self._caps

    def memory_usage(self) -> MemoryUsage:
        """The bytes this backend holds now and its live caches and batches (a snapshot)."""
        u = _ffi.MemoryUsageStruct()
        u.struct_size = ctypes.sizeof(u)
        _check(_lib().pagedattn_backend_get_memory_usage(ctypes.byref(u), self._handle()))
        return MemoryUsage(u.bytes_in_use, u.memory_limit, u.num_caches, u.num_batches)

    @property
    def name(self) -> str:
        """The backend's name (``"cpu"``, ...), also when created as ``"auto"``."""
        return self.capabilities.name

    def synchronize(self, stream: Optional[int] = None) -> None:
        """Waits for the work queued on ``stream`` (no-op on CPU)."""
        _check(_lib().pagedattn_backend_synchronize(self._handle(), stream_arg(stream)))

    def forward(self, batch: Optional["Batch"], cache: Optional["KVCache"], layer: int, q: Any,
                k: Any = None, v: Any = None, **kwargs: Any) -> Any:
        """Same as :func:`forward` with this backend."""
        from ._attention import forward  # imported here: _attention imports Backend
        return forward(self, batch, cache, layer, q, k, v, **kwargs)

    def forward_mla(self, batch: Optional["Batch"], cache: Optional["KVCache"], layer: int,
                    q_nope: Any, q_pe: Any = None, **kwargs: Any) -> Any:
        """Same as :func:`forward_mla` with this backend."""
        from ._attention import forward_mla
        return forward_mla(self, batch, cache, layer, q_nope, q_pe, **kwargs)

    def merge_states(self, o1: Any, lse1: Any, o2: Any, lse2: Any, **kwargs: Any) -> Any:
        """Same as :func:`merge_states` with this backend."""
        from ._attention import merge_states
        return merge_states(self, o1, lse1, o2, lse2, **kwargs)


__all__ = ["Backend", "BackendInfo", "Capabilities", "backends"]
