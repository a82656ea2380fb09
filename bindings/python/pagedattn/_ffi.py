"""Low-level ctypes layer: finding libpagedattn, the C structs, and the function prototypes.

Nothing here is public API; :mod:`pagedattn` wraps it. The structs mirror
``include/pagedattn/*.h`` field by field (ctypes applies the same C alignment rules). A struct
that grew since 0.1 is mirrored whole: the library takes only the 0.1 layout and its own.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shlex
import shutil
import subprocess
import threading
from typing import List, Optional

c_int32 = ctypes.c_int32
c_uint32 = ctypes.c_uint32
c_int64 = ctypes.c_int64
c_uint64 = ctypes.c_uint64
c_uint8 = ctypes.c_uint8
c_uint16 = ctypes.c_uint16
c_float = ctypes.c_float
c_size_t = ctypes.c_size_t
c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p


class Device(ctypes.Structure):
    """DLDevice / pagedattn_device."""

    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(ctypes.Structure):
    """DLDataType / pagedattn_dlpack_dtype."""

    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class TensorStruct(ctypes.Structure):
    """DLTensor / pagedattn_tensor."""

    _fields_ = [
        ("data", c_void_p),
        ("device", Device),
        ("ndim", c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(c_int64)),
        ("strides", ctypes.POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


class CapabilitiesStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("name", c_char_p),
        ("device", Device),
        ("features", c_uint32),
        ("dtypes", c_uint32),
        ("cache_dtypes", c_uint32),
        ("layouts", c_uint32),
        ("block_sizes", c_uint32),
        ("head_sizes", c_uint32),
        ("max_num_threads", c_int32),
        ("total_memory", c_uint64),
        ("target", c_char_p),
        ("settings", c_char_p),
        # Since 0.2's MLA: bit i = latent row size 32*(i+1).
        ("latent_sizes", c_uint32),
    ]


class MemoryUsageStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("bytes_in_use", c_uint64),
        ("memory_limit", c_uint64),
        ("num_caches", c_int32),
        ("num_batches", c_int32),
    ]


# void (*)(void* user_data, pagedattn_log_level level, const char* message)
LogFn = ctypes.CFUNCTYPE(None, c_void_p, ctypes.c_int, c_char_p)


class BackendOptionsStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("device_index", c_int32),
        ("num_threads", c_int32),
        ("flags", c_uint32),
        ("memory_limit", c_uint64),
    ]


class BackendInfoStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("name", c_char_p),
        ("available", c_int32),
        ("reason", c_char_p),
    ]


class KVCacheDescStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("num_layers", c_int32),
        ("num_blocks", c_int32),
        ("block_size", c_int32),
        ("num_kv_heads", c_int32),
        ("head_size", c_int32),
        ("dtype", ctypes.c_int),
        ("layout", ctypes.c_int),
        ("flags", c_uint32),
    ]


class KVCacheMemoryStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("k_layers", ctypes.POINTER(c_void_p)),
        ("v_layers", ctypes.POINTER(c_void_p)),
        ("block_stride", c_int64),
        ("slot_stride", c_int64),
        ("head_stride", c_int64),
        ("device", Device),
    ]


_P32 = ctypes.POINTER(c_int32)
_P64 = ctypes.POINTER(c_int64)


class BatchDescStruct(ctypes.Structure):
    # The array fields are const int32_t* / const int64_t* in C; declared as addresses so that
    # a data address can be stored without building a ctypes pointer object.
    _fields_ = [
        ("struct_size", c_uint32),
        ("num_seqs", c_int32),
        ("query_lens", c_void_p),
        ("context_lens", c_void_p),
        ("block_tables", c_void_p),
        ("block_table_stride", c_int32),
        ("slot_mapping", c_void_p),
        ("encoder_lens", c_void_p),
        ("cross_block_tables", c_void_p),
        ("cross_block_table_stride", c_int32),
        ("max_num_seqs", c_int32),
        ("max_num_tokens", c_int64),
        ("max_blocks_per_seq", c_int32),
        ("max_num_encoder_tokens", c_int64),
        ("max_seq_len", c_int64),
        # Since 0.2 (struct_size from pagedattn_batch_desc_init_sized covers them).
        ("lens_form", ctypes.c_int),
        ("seq_lens", c_void_p),
        ("query_start_loc", c_void_p),
        ("tree_mask", c_void_p),  # const uint8_t*
        ("tree_mask_indptr", c_void_p),
        ("max_tree_mask_bytes", c_int64),
    ]


class BatchInfoStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("num_seqs", c_int32),
        ("num_tokens", c_int64),
        ("num_encoder_tokens", c_int64),
        ("num_decode_seqs", c_int32),
        ("num_prefill_seqs", c_int32),
        ("max_query_len", c_int32),
        ("max_seq_len", c_int64),
        ("max_num_seqs", c_int32),
        ("max_num_tokens", c_int64),
        ("max_blocks_per_seq", c_int32),
        ("block_size", c_int32),
        ("host_bytes", c_uint64),
        ("workspace_bytes", c_uint64),
        ("max_num_encoder_tokens", c_int64),
        ("max_seq_len_capacity", c_int64),
        ("max_tree_mask_bytes", c_int64),
    ]


class AttentionOptionsStruct(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("num_heads", c_int32),
        ("num_kv_heads", c_int32),
        ("head_size", c_int32),
        ("scale", c_float),
        ("soft_cap", c_float),
        ("sliding_window", c_int32),
        ("attention_type", ctypes.c_int),
        ("write_kv", c_int32),
        ("k_scale", c_float),
        ("v_scale", c_float),
        ("alibi_slopes", c_void_p),  # const pagedattn_tensor*
        ("flags", c_uint32),
        # Since 0.2 (struct_size from pagedattn_attention_options_init_sized covers them).
        ("sinks", c_void_p),  # const pagedattn_tensor*
        ("attention_chunk", c_int32),
        ("k_head_scales", c_void_p),  # const pagedattn_tensor*
        ("v_head_scales", c_void_p),  # const pagedattn_tensor*
    ]


_status = ctypes.c_int

# name: (restype, argtypes)
_PROTOTYPES = {
    "pagedattn_status_string": (c_char_p, [ctypes.c_int]),
    "pagedattn_last_error": (c_char_p, []),
    "pagedattn_version": (c_int32, [_P32, _P32, _P32]),
    "pagedattn_version_string": (c_char_p, []),
    "pagedattn_dtype_name": (c_char_p, [ctypes.c_int]),
    "pagedattn_dtype_size": (c_size_t, [ctypes.c_int]),
    "pagedattn_dtype_to_dlpack": (_status, [ctypes.POINTER(DLDataType), ctypes.c_int]),
    "pagedattn_dtype_from_dlpack": (_status, [ctypes.POINTER(ctypes.c_int), DLDataType]),
    "pagedattn_backend_options_init": (_status, [ctypes.POINTER(BackendOptionsStruct)]),
    "pagedattn_backend_count": (c_int32, []),
    "pagedattn_backend_get_info": (_status, [ctypes.POINTER(BackendInfoStruct), c_int32]),
    "pagedattn_backend_create": (
        _status,
        [ctypes.POINTER(c_void_p), c_char_p, ctypes.POINTER(BackendOptionsStruct)],
    ),
    "pagedattn_backend_destroy": (None, [c_void_p]),
    "pagedattn_backend_get_capabilities": (
        _status,
        [ctypes.POINTER(CapabilitiesStruct), c_void_p],
    ),
    "pagedattn_backend_get_memory_usage": (
        _status,
        [ctypes.POINTER(MemoryUsageStruct), c_void_p],
    ),
    "pagedattn_set_log_callback": (_status, [LogFn, c_void_p, ctypes.c_int]),
    "pagedattn_backend_synchronize": (_status, [c_void_p, c_void_p]),
    "pagedattn_kv_cache_desc_init": (_status, [ctypes.POINTER(KVCacheDescStruct)]),
    "pagedattn_kv_cache_bytes_per_block": (
        _status,
        [ctypes.POINTER(c_uint64), ctypes.POINTER(KVCacheDescStruct)],
    ),
    "pagedattn_kv_cache_create": (
        _status,
        [ctypes.POINTER(c_void_p), c_void_p, ctypes.POINTER(KVCacheDescStruct)],
    ),
    "pagedattn_kv_cache_wrap": (
        _status,
        [
            ctypes.POINTER(c_void_p),
            c_void_p,
            ctypes.POINTER(KVCacheDescStruct),
            ctypes.POINTER(KVCacheMemoryStruct),
        ],
    ),
    "pagedattn_kv_cache_destroy": (None, [c_void_p]),
    "pagedattn_kv_cache_get_desc": (_status, [ctypes.POINTER(KVCacheDescStruct), c_void_p]),
    "pagedattn_kv_cache_get_layer": (
        _status,
        [ctypes.POINTER(c_void_p), ctypes.POINTER(c_void_p), _P64, c_void_p, c_int32],
    ),
    # Tensor arguments are passed as addresses (of a DLPack capsule's DLTensor or of a
    # TensorStruct): see _tensor.py.
    "pagedattn_kv_cache_write": (
        _status,
        [c_void_p, c_int32, c_void_p, c_void_p, c_void_p, c_float, c_float, c_void_p],
    ),
    # cache, layer, key, value, slot_mapping, k_head_scales, v_head_scales, stream
    "pagedattn_kv_cache_write_scaled": (_status, [c_void_p, c_int32] + [c_void_p] * 6),
    # cache, layer, kv_c, k_pe, slot_mapping, scale, stream
    "pagedattn_kv_cache_write_latent": (
        _status,
        [c_void_p, c_int32, c_void_p, c_void_p, c_void_p, c_float, c_void_p],
    ),
    "pagedattn_kv_cache_copy_blocks": (_status, [c_void_p, _P32, c_size_t, c_void_p]),
    "pagedattn_kv_cache_swap_blocks": (_status, [c_void_p, c_void_p, _P32, c_size_t, c_void_p]),
    "pagedattn_kv_cache_read_blocks": (
        _status,
        [c_void_p, _P32, c_size_t, c_void_p, c_size_t, c_void_p],
    ),
    "pagedattn_kv_cache_load_blocks": (
        _status,
        [c_void_p, _P32, c_size_t, c_void_p, c_size_t, c_void_p],
    ),
    "pagedattn_batch_desc_init": (_status, [ctypes.POINTER(BatchDescStruct)]),
    "pagedattn_batch_desc_init_sized": (_status, [ctypes.POINTER(BatchDescStruct), c_uint32]),
    "pagedattn_batch_create": (
        _status,
        [ctypes.POINTER(c_void_p), c_void_p, c_void_p, c_void_p, c_void_p],
    ),
    "pagedattn_batch_update": (_status, [c_void_p, c_void_p]),
    "pagedattn_batch_destroy": (None, [c_void_p]),
    "pagedattn_batch_get_info": (_status, [ctypes.POINTER(BatchInfoStruct), c_void_p]),
    "pagedattn_batch_get_slot_mapping": (
        _status,
        [ctypes.POINTER(_P64), ctypes.POINTER(c_int64), c_void_p],
    ),
    "pagedattn_batch_get_query_start": (
        _status,
        [ctypes.POINTER(_P32), ctypes.POINTER(c_int32), c_void_p],
    ),
    "pagedattn_batch_get_cross_slot_mapping": (
        _status,
        [ctypes.POINTER(_P64), ctypes.POINTER(c_int64), c_void_p],
    ),
    "pagedattn_attention_options_init": (_status, [ctypes.POINTER(AttentionOptionsStruct)]),
    "pagedattn_attention_options_init_sized": (
        _status,
        [ctypes.POINTER(AttentionOptionsStruct), c_uint32],
    ),
    # backend, batch, cache, layer, options, q, k, v, out, lse, stream
    "pagedattn_forward": (_status, [c_void_p, c_void_p, c_void_p, c_int32] + [c_void_p] * 7),
    # backend, batch, cache, layer, options, q_nope, q_pe, out, lse, stream
    "pagedattn_forward_mla": (_status, [c_void_p, c_void_p, c_void_p, c_int32] + [c_void_p] * 6),
    # backend, out, lse_out, o1, lse1, o2, lse2, stream
    "pagedattn_merge_states": (_status, [c_void_p] * 8),
}

# The library major version this binding is written against (PAGEDATTN_VERSION_MAJOR): a
# library of another major version has another ABI and is refused at load.
EXPECTED_MAJOR = 0
# The oldest minor version of that major with every call and struct field this binding uses.
MIN_MINOR = 2

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None


def check_version(lib: ctypes.CDLL, path: str, expected_major: Optional[int] = None) -> None:
    """Raises :class:`OSError` unless the library's major version (``pagedattn_version``) is
    ``expected_major`` (default :data:`EXPECTED_MAJOR`), as ``version.h`` asks of dynamic
    loaders."""
    want = EXPECTED_MAJOR if expected_major is None else expected_major
    major, minor, patch = c_int32(), c_int32(), c_int32()
    lib.pagedattn_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
    if major.value != want:
        raise OSError(
            f"pagedattn: {path} is libpagedattn {major.value}.{minor.value}.{patch.value}, but "
            f"this binding needs major version {want} (a different major version has a "
            "different ABI); install a matching libpagedattn or pagedattn binding"
        )
    if expected_major is None and minor.value < MIN_MINOR:
        raise OSError(
            f"pagedattn: {path} is libpagedattn {major.value}.{minor.value}.{patch.value}, but "
            f"this binding needs {want}.{MIN_MINOR} or newer (it calls what {want}.{MIN_MINOR} "
            "added); install a newer libpagedattn"
        )


def _pkg_config(*args: str) -> str:
    """The output of ``pkg-config ARGS pagedattn``; empty without pkg-config or on failure."""
    pkg_config = shutil.which("pkg-config")
    if not pkg_config:
        return ""
    try:
        r = subprocess.run([pkg_config, *args, "pagedattn"], capture_output=True, text=True,
                           timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return r.stdout.strip() if r.returncode == 0 else ""


def _pkg_config_dirs() -> List[str]:
    """The directories ``pkg-config pagedattn`` names: its ``-L`` flags first (what Rust and Go
    link with; the only right one in meson's uninstalled .pc, whose libdir is the install's),
    then its libdir."""
    dirs: List[str] = []
    try:
        flags = shlex.split(_pkg_config("--libs-only-L"))
    except ValueError:
        flags = []
    for flag in flags:
        if flag.startswith("-L") and len(flag) > 2:
            dirs.append(flag[2:])
    libdir = _pkg_config("--variable=libdir")
    if libdir:
        dirs.append(libdir)
    return list(dict.fromkeys(dirs))


def _candidates() -> List[str]:
    """Where to look for libpagedattn, in order (see :func:`load`)."""
    found: List[str] = []
    env_file = os.environ.get("PAGEDATTN_LIBRARY")
    if env_file:
        return [env_file]  # an explicit choice: never fall back silently
    env_dir = os.environ.get("PAGEDATTN_LIB_DIR")
    if env_dir:
        return [os.path.join(env_dir, n) for n in ("libpagedattn.so", "libpagedattn.so.0")]
    for libdir in _pkg_config_dirs():
        found.append(os.path.join(libdir, "libpagedattn.so"))
        found.append(os.path.join(libdir, "libpagedattn.so.0"))
    system = ctypes.util.find_library("pagedattn")
    if system:
        found.append(system)
    found.append("libpagedattn.so.0")
    found.append("libpagedattn.so")
    return found


def load() -> ctypes.CDLL:
    """Loads libpagedattn once and returns it.

    Search order: the file named by ``PAGEDATTN_LIBRARY``; else ``libpagedattn.so`` in
    ``PAGEDATTN_LIB_DIR``; else the directories of ``pkg-config --libs-only-L pagedattn``, then
    its libdir (so installed and meson-uninstalled .pc files both work); else the system
    loader. Raises :class:`OSError` listing every place tried, or naming the library found
    when its major version is not :data:`EXPECTED_MAJOR`.
    """
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        errors = []
        for path in _candidates():
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                errors.append(f"{path}: {e}")
                continue
            # Before the prototypes: an older library lacks some of the functions.
            check_version(lib, path)  # an explicit choice too: refused, never skipped
            for name, (res, args) in _PROTOTYPES.items():
                fn = getattr(lib, name)
                fn.restype = res
                fn.argtypes = args
            _lib_path = path
            _lib = lib
            return lib
        raise OSError(
            "pagedattn: cannot load libpagedattn (set PAGEDATTN_LIBRARY to the file or "
            "PAGEDATTN_LIB_DIR to its directory); tried:\n  " + "\n  ".join(errors)
        )


def library_path() -> str:
    """The path (or name) libpagedattn was loaded from."""
    load()
    assert _lib_path is not None
    return _lib_path
