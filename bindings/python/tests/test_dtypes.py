"""Dtype refusals name the dtype in plain words and are TypeErrors (or ValueErrors) as well as
PagedAttnErrors."""

from __future__ import annotations

import numpy as np
import pytest

import pagedattn as pa


def small_cache(be: pa.Backend, dtype=pa.Dtype.FLOAT32) -> pa.KVCache:
    return pa.KVCache(be, num_layers=1, num_blocks=4, block_size=16, num_kv_heads=2,
                      head_size=64, dtype=dtype)


def test_bad_tensor_dtype_is_a_type_error_naming_it(be: pa.Backend) -> None:
    cache = small_cache(be)
    batch = pa.Batch(be, cache, [1], [0], [[2]])
    q, kv = np.zeros((1, 4, 64)), np.zeros((1, 2, 64))  # float64
    with pytest.raises(TypeError) as e:
        pa.forward(be, batch, cache, 0, q, kv, kv)
    assert isinstance(e.value, pa.PagedAttnError) and isinstance(e.value, pa.PagedAttnTypeError)
    assert e.value.code == pa.Status.BAD_TENSOR
    assert e.value.message == "q: dtype float64 is not float32, float16 or bfloat16"
    assert "{code" not in str(e.value)
    with pytest.raises(pa.PagedAttnTypeError, match="key: dtype int32 is not"):
        cache.write(0, np.zeros((1, 2, 64), np.int32), np.zeros((1, 2, 64), np.int32), [3])
    with pytest.raises(pa.PagedAttnTypeError, match="slot_mapping: dtype float32 is not int32"):
        cache.write(0, kv.astype(np.float32), kv.astype(np.float32),
                    np.zeros(1, np.float32))
    # Another dtype than the cache's is a TypeError too (library message, dtypes by name).
    with pytest.raises(pa.PagedAttnTypeError, match="float16"):
        pa.forward(be, batch, cache, 0, q.astype(np.float16), kv.astype(np.float16),
                   kv.astype(np.float16))
    # Other refusals stay plain PagedAttnErrors.
    with pytest.raises(pa.PagedAttnError) as e:
        pa.forward(be, batch, cache, 0, q.astype(np.float32), kv.astype(np.float32),
                   kv.astype(np.float32), out=np.zeros((1, 4, 32), np.float32))
    assert not isinstance(e.value, TypeError) and e.value.code == pa.Status.BAD_TENSOR


def test_dlpack_dtype_names() -> None:
    from pagedattn._status import dlpack_dtype_name

    assert dlpack_dtype_name(2, 64) == "float64"
    assert dlpack_dtype_name(4, 16) == "bfloat16"
    assert dlpack_dtype_name(1, 8) == "uint8"
    assert dlpack_dtype_name(10, 8) == "float8_e4m3fn"
    assert dlpack_dtype_name(2, 32, 4) == "float32x4"
    assert dlpack_dtype_name(3, 64) == "{code 3, bits 64, lanes 1}"
    with pytest.raises(pa.PagedAttnTypeError, match="DLPack dtype float64 is not supported"):
        pa.Dtype.from_dlpack((2, 64))
    with pytest.raises(pa.PagedAttnValueError) as e:
        pa.dtype_to_dlpack(9)
    assert isinstance(e.value, ValueError) and e.value.code == pa.Status.INVALID_ARGUMENT


@pytest.mark.parametrize("given,want", [("float16", pa.Dtype.FLOAT16),
                                        ("BFloat16", pa.Dtype.BFLOAT16),
                                        ("fp8_e4m3", pa.Dtype.FP8_E4M3),
                                        ("float8_e5m2", pa.Dtype.FP8_E5M2),
                                        (np.float32, pa.Dtype.FLOAT32),
                                        (np.dtype(np.float16), pa.Dtype.FLOAT16),
                                        (2, pa.Dtype.FLOAT16)])
def test_cache_dtype_by_name(be: pa.Backend, given, want: pa.Dtype) -> None:
    with small_cache(be, given) as cache:
        assert cache.desc.dtype is want
    assert pa.bytes_per_block(1, 16, 2, 64, given) == pa.bytes_per_block(1, 16, 2, 64, want)


def test_cache_dtype_refusals(be: pa.Backend) -> None:
    for bad, words in [("float64", "float64 is not a cache dtype"),
                       (np.int32, "int32 is not a cache dtype"), ("half", "half is not"),
                       ("1", "1 is not a cache dtype")]:
        with pytest.raises(pa.PagedAttnValueError, match=words) as e:
            small_cache(be, bad)
        assert isinstance(e.value, ValueError) and "pa.Dtype.FLOAT16" in e.value.message
    with pytest.raises(ValueError, match="dtype = 9 is not a pagedattn dtype"):
        small_cache(be, 9)
    with pytest.raises(TypeError):
        small_cache(be, 2.0)


def test_cache_dtype_from_torch(be: pa.Backend) -> None:
    torch = pytest.importorskip("torch", reason="python3-torch not installed")
    with small_cache(be, torch.bfloat16) as cache:
        assert cache.desc.dtype is pa.Dtype.BFLOAT16
    with pytest.raises(pa.PagedAttnValueError, match="torch.float64 is not a cache dtype"):
        small_cache(be, torch.float64)
