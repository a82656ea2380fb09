"""pagedattn: attention over a paged KV cache for LLM serving — Python binding (pure ctypes).

The package loads ``libpagedattn.so`` on first use: from ``PAGEDATTN_LIBRARY`` (a file), else
``PAGEDATTN_LIB_DIR`` (a directory), else the libdir of ``pkg-config pagedattn``, else the system
loader, and refuses a library of another major version (``OSError``). Plugins (oneDNN, CUDA,
HIP) are found by the library itself (``PAGEDATTN_PLUGIN_PATH``).

Tensors are numpy arrays (float32, float16, ``ml_dtypes.bfloat16`` when ml_dtypes is installed;
int32/int64 for slots), :class:`BFloat16Array` (numpy ``uint16`` holding bfloat16 bits), or any
object with ``__dlpack__`` (a torch tensor, zero copy). Outputs the binding allocates follow the
inputs' array type (numpy in, numpy out; torch in, torch out). :func:`forward` and
:func:`merge_states` return ``out``, or ``(out, lse)`` when an lse is requested, as does
:func:`forward_mla` (multi-head latent attention over a ``KVCache(..., latent=True)``). Every
failing call raises :class:`PagedAttnError` carrying the :class:`Status` and the library's
message.

Example (one decode step)::

    import numpy as np, pagedattn as pa
    with pa.Backend("cpu") as be, pa.KVCache(be, num_layers=1, num_blocks=16, block_size=16,
            num_kv_heads=2, head_size=64, dtype=pa.Dtype.FLOAT32) as cache:
        batch = pa.Batch(be, cache, query_lens=[1, 1], context_lens=[5, 17],
                         block_tables=[[7], [2, 11]])
        out = pa.forward(be, batch, cache, 0, q, k, v)   # q [2, 8, 64], k/v [2, 2, 64] float32
"""

from ._attention import forward, forward_mla, merge_states
from ._backend import Backend, BackendInfo, Capabilities, MemoryUsage, backends
from ._batch import Batch, BatchInfo, pack_tree_masks
from ._cache import CacheDesc, KVCache, bytes_per_block
from ._ffi import library_path
from ._log import LogLevel, log_to_logging, set_log_callback
from ._status import (PagedAttnError, PagedAttnTypeError, PagedAttnValueError, Status,
                      last_error, status_string, version, version_string)
from ._tensor import BFloat16Array, from_bfloat16, to_bfloat16
from ._types import (
    AttentionType,
    DLPackCode,
    DLPackDtype,
    Dtype,
    Feature,
    Layout,
    dtype_from_dlpack,
    dtype_name,
    dtype_size,
    dtype_to_dlpack,
)

__version__ = "0.2.0"

__all__ = [
    "AttentionType", "Backend", "BackendInfo", "Batch", "BatchInfo", "BFloat16Array",
    "CacheDesc", "Capabilities", "DLPackCode", "DLPackDtype", "Dtype", "Feature", "KVCache",
    "Layout", "LogLevel", "MemoryUsage", "PagedAttnError", "PagedAttnTypeError",
    "PagedAttnValueError", "Status", "backends", "bytes_per_block", "dtype_from_dlpack",
    "dtype_name", "dtype_size", "dtype_to_dlpack",
    "forward", "forward_mla", "from_bfloat16", "last_error", "library_path", "log_to_logging",
    "merge_states",
    "pack_tree_masks", "set_log_callback", "status_string", "to_bfloat16", "version", "version_string",
]
