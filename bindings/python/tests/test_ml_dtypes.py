"""ml_dtypes arrays (numpy's de-facto bfloat16 and fp8 types) as tensors. ml_dtypes is optional:
these tests skip, saying so, when it is not installed (that the binding never imports it is
tested in test_conventions.py, with or without it)."""

from __future__ import annotations

import numpy as np
import pytest

import pagedattn as pa
from reference import rel_err
from test_api import TOL, Scenario

ml_dtypes = pytest.importorskip(
    "ml_dtypes", reason="ml_dtypes not installed (optional): ml_dtypes tensors not tested")


def as_ml_bf16(x: pa.BFloat16Array) -> np.ndarray:
    return x.array.view(ml_dtypes.bfloat16)


@pytest.mark.parametrize("layout", [pa.Layout.NHD, pa.Layout.HND])
def test_bfloat16_arrays_in_bfloat16_arrays_out(be: pa.Backend, layout: pa.Layout) -> None:
    sc = Scenario(be, "bf16", layout=layout, seed=50)
    q, k, v = as_ml_bf16(sc.q), as_ml_bf16(sc.k), as_ml_bf16(sc.v)
    out, lse = pa.forward(be, sc.batch, sc.cache, 0, q, k, v, lse=True)
    assert isinstance(out, np.ndarray) and out.dtype == ml_dtypes.bfloat16
    assert out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (q.shape[0], sc.H)
    ref, ref_lse = sc.reference()
    assert rel_err(out.astype(np.float64), ref) <= TOL["bf16"]
    assert np.allclose(lse, ref_lse, rtol=TOL["bf16"], atol=1e-5)
    # The same bits as through BFloat16Array (k/v already stored: not written again).
    alt = pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v, write_kv=False)
    assert np.array_equal(alt.array, out.view(np.uint16))
    # A read-only array (which numpy does not export) and a strided view work as well.
    ro = q.copy()
    ro.flags.writeable = False
    assert np.array_equal(pa.forward(be, sc.batch, sc.cache, 0, ro, write_kv=False), out)
    T, H, D = q.shape
    big = np.zeros((T, H, 2 * D), ml_dtypes.bfloat16)
    big[:, :, :D] = q
    o2 = np.zeros((T, H, 2 * D), ml_dtypes.bfloat16)
    pa.forward(be, sc.batch, sc.cache, 0, big[:, :, :D], out=o2[:, :, D:], write_kv=False)
    assert np.array_equal(o2[:, :, D:], out) and not o2[:, :, :D].astype(np.float32).any()


def test_refusals_name_the_tensor(be: pa.Backend) -> None:
    sc = Scenario(be, "bf16", seed=51)
    q = as_ml_bf16(sc.q)
    ro = np.empty(q.shape, ml_dtypes.bfloat16)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="^out: the array is read-only"):
        pa.forward(be, sc.batch, sc.cache, 0, q, out=ro, write_kv=False)
    with pytest.raises(pa.PagedAttnError) as e:  # bfloat16 q against a float16 out
        pa.forward(be, sc.batch, sc.cache, 0, q, out=np.empty(q.shape, np.float16),
                   write_kv=False)
    assert e.value.code == pa.Status.BAD_TENSOR
    with pytest.raises(TypeError, match="int4 cannot cross"):
        pa.forward(be, sc.batch, sc.cache, 0, np.zeros(q.shape, ml_dtypes.int4), write_kv=False)


def test_cache_write_wrap_and_decode(be: pa.Backend) -> None:
    rng = np.random.default_rng(52)
    nb, bs, hkv, d = 4, 16, 2, 64
    kc = np.zeros((nb, bs, hkv, d), ml_dtypes.bfloat16)
    vc = np.zeros((nb, bs, hkv, d), ml_dtypes.bfloat16)
    cache = pa.KVCache.wrap(be, [kc], [vc])
    assert cache.desc.dtype is pa.Dtype.BFLOAT16
    row = rng.uniform(-1, 1, (1, hkv, d)).astype(ml_dtypes.bfloat16)
    cache.write(0, row, row, [2 * bs + 3])
    assert np.array_equal(kc[2, 3], row[0]) and np.array_equal(vc[2, 3], row[0])
    assert pa.from_bfloat16(kc[2, 3]).dtype == np.float32
    assert np.array_equal(pa.from_bfloat16(kc[2, 3]), row[0].astype(np.float32))


@pytest.mark.parametrize("name,dtype", [("float8_e4m3fn", pa.Dtype.FP8_E4M3),
                                        ("float8_e5m2", pa.Dtype.FP8_E5M2)])
def test_fp8_cache_dtype_inferred_from_the_arrays(be: pa.Backend, name: str,
                                                  dtype: pa.Dtype) -> None:
    layer = np.zeros((4, 16, 2, 64), getattr(ml_dtypes, name))
    cache = pa.KVCache.wrap(be, [layer], [layer.copy()])
    assert cache.desc.dtype is dtype
    # The same cache as uint8 arrays with the dtype given.
    same = pa.KVCache.wrap(be, [layer.view(np.uint8)], [layer.view(np.uint8).copy()],
                           dtype=dtype)
    assert same.desc == cache.desc


def test_alongside_torch(be: pa.Backend) -> None:
    """ml_dtypes installed next to a torch built against numpy 1 (Debian's 1.13): the README's
    install keeps numpy below 2, and torch and ml_dtypes bfloat16 give the same bits."""
    torch = pytest.importorskip("torch", reason="python3-torch not installed: not tested")
    try:
        torch.from_numpy(np.zeros(1, np.float32))
    except RuntimeError as e:  # "Numpy is not available": numpy 2 under a numpy 1 torch
        pytest.fail(f"numpy {np.__version__} breaks torch {torch.__version__} ({e}); install "
                    "with pip install 'numpy<2' ml_dtypes, as the README says")
    sc = Scenario(be, "bf16", seed=53)
    mine = pa.forward(be, sc.batch, sc.cache, 0, as_ml_bf16(sc.q), as_ml_bf16(sc.k),
                      as_ml_bf16(sc.v))
    tq = torch.from_numpy(sc.q.array.astype(np.int16)).view(torch.bfloat16)
    theirs = pa.forward(be, sc.batch, sc.cache, 0, tq, write_kv=False)
    assert theirs.view(torch.int16).numpy().tobytes() == mine.view(np.uint16).tobytes()
