"""Torch CPU tensors through DLPack (zero copy), against the float64 reference and numpy path."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pagedattn as pa
from reference import rel_err
from test_api import TOL, Scenario

torch = pytest.importorskip("torch", reason="python3-torch not installed: DLPack tests skipped")


@pytest.mark.parametrize("tdt,dt", [("float32", "f32"), ("float16", "f16"), ("bfloat16", "bf16")])
def test_torch_tensors_through_dlpack(be: pa.Backend, tdt: str, dt: str) -> None:
    sc = Scenario(be, dt, seed=16)

    def tt(x: Any):
        if isinstance(x, pa.BFloat16Array):
            return torch.from_numpy(x.to_float32()).to(torch.bfloat16)
        return torch.from_numpy(np.asarray(x)).to(getattr(torch, tdt))

    q, k, v = tt(sc.q), tt(sc.k), tt(sc.v)
    out = torch.full(tuple(q.shape), float("nan"), dtype=getattr(torch, tdt))
    lse = torch.empty((q.shape[0], sc.H), dtype=torch.float32)
    pa.forward(be, sc.batch, sc.cache, 0, q, k, v, out=out, lse=lse)
    got = out.to(torch.float64).numpy()
    ref, ref_lse = sc.reference()
    assert rel_err(got, ref) <= TOL[dt]
    assert np.allclose(lse.numpy(), ref_lse, rtol=max(TOL[dt], 1e-5), atol=1e-5)
    # Same library, same inputs: the numpy path gives the same bits.
    sc2 = Scenario(be, dt, seed=16)
    np_out = pa.forward(be, sc2.batch, sc2.cache, 0, sc2.q, sc2.k, sc2.v)
    np_bits = np_out.array if isinstance(np_out, pa.BFloat16Array) else np_out
    assert out.view(torch.int16).numpy().tobytes() == np_bits.tobytes()
    # A torch output allocated by the binding when out= is omitted.
    auto = pa.forward(be, sc2.batch, sc2.cache, 0, q, k, v, write_kv=False)
    assert isinstance(auto, torch.Tensor) and auto.dtype == q.dtype


def test_torch_wrap_and_refusals(be: pa.Backend) -> None:
    kc = torch.zeros((4, 16, 2, 64), dtype=torch.float32)
    vc = torch.zeros((4, 16, 2, 64), dtype=torch.float32)
    cache = pa.KVCache.wrap(be, [kc], [vc])
    cache.write(0, torch.ones((1, 2, 64)), torch.ones((1, 2, 64)),
                torch.tensor([17], dtype=torch.int64))
    assert kc[1, 1].eq(1).all() and kc.sum() == 128
    batch = pa.Batch(be, cache, [1], [0], [[2]])
    with pytest.raises(pa.PagedAttnError) as e:  # float64 is refused by the library
        pa.forward(be, batch, cache, 0, torch.zeros((1, 4, 64), dtype=torch.float64),
                   torch.zeros((1, 2, 64), dtype=torch.float64),
                   torch.zeros((1, 2, 64), dtype=torch.float64))
    assert e.value.code == pa.Status.BAD_TENSOR and isinstance(e.value, TypeError)
    assert e.value.message.startswith("q: dtype float64 is not")
    with pytest.raises(TypeError, match="__dlpack__"):
        pa.forward(be, batch, cache, 0, torch.zeros((1, 4, 64), requires_grad=True),
                   torch.zeros((1, 2, 64)), torch.zeros((1, 2, 64)))


def test_bench_compare_torch_cpu_meets_float64() -> None:
    """bench/compare_torch_cpu.py on small shapes: it runs through this binding, judges every
    contender against its own float64 reference, prints each one's error, and exits 1 when ours
    (bf16 and fp8 caches, prefill, MLA decode and prefill) exceeds the library's tolerance. A
    peer's error is printed, never used as the oracle (torch 1.13's bf16 path is beyond bf16
    tolerance on some CPUs)."""
    import os
    import re
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench",
                          "compare_torch_cpu.py")
    r = subprocess.run([sys.executable, script, "--batch", "3", "--context", "100", "--heads", "8",
                        "--kv-heads", "2", "--head-size", "64", "--prefill-seqs", "2",
                        "--prefill-len", "70", "--mla-heads", "16", "--rounds", "1",
                        "--inner", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    fp8 = hasattr(torch, "float8_e4m3fn")  # fp8 and mla-fp8: skipped, and said so, on torch < 2.1
    cases = 3 if fp8 else 2
    if "mla cases skipped" not in r.stdout:  # MLA decode (16 heads, bf16; fp8) and prefill
        cases += 3 if fp8 else 2
    if "ipex cases skipped" not in r.stdout:  # IPEX installed for this torch: its 3 cases too
        cases += 3
    judged = re.findall(r"vs float64 \(tolerance ([0-9.e-]+)\): ours ([0-9.e+-]+|inf)", r.stdout)
    assert len(judged) == cases and "OURS WRONG" not in r.stdout, r.stdout
    for tol, err in judged:
        assert float(err) <= float(tol), r.stdout


def _fields(address: int) -> tuple:
    t = pa._ffi.TensorStruct.from_address(address)
    return (t.data, t.device.device_type, t.device.device_id, t.ndim, t.dtype.code,
            t.dtype.bits, t.dtype.lanes, [t.shape[i] for i in range(t.ndim)],
            [t.strides[i] for i in range(t.ndim)], t.byte_offset)


@pytest.mark.parametrize("tdt", ["float32", "float16", "bfloat16", "float64", "int32", "int64",
                                 "int8", "uint8"])
def test_torch_fast_path_matches_the_dlpack_export(tdt: str) -> None:
    """Plain CPU tensors are described from their attributes, field for field as DLPack
    exports them (views with offsets and strides, 0-d tensors); again from the kept
    descriptors on a second call, and anew after an in-place resize."""
    from pagedattn import _tensor

    base = torch.zeros((3, 6, 4), dtype=getattr(torch, tdt))
    for t in (base, base[1:, ::2], base[2, 1], torch.zeros((), dtype=base.dtype)):
        for _ in range(2):
            addr, keep = _tensor.describe(t, "q")
            assert not isinstance(keep, tuple) or type(keep[1]).__name__ != "PyCapsule"
            ref, ref_keep = _tensor._dlpack_address(t, "q", False, None)
            assert _fields(addr) == _fields(ref)
    t = torch.zeros((2, 3), dtype=base.dtype)
    before = _fields(_tensor.describe(t, "q")[0])
    t.resize_(4, 5)
    addr, keep = _tensor.describe(t, "q")
    assert _fields(addr)[7:9] == ([4, 5], [5, 1]) and _fields(addr) != before


def test_torch_fast_path_keeps_the_dlpack_checks(be: pa.Backend) -> None:
    """What the DLPack export refuses is still refused by it: tensors that need grad, dtypes
    DLPack has no code for (bool), other layouts."""
    from pagedattn import _tensor

    with pytest.raises(TypeError, match=r"^q: __dlpack__\(\) failed: .*grad"):
        _tensor.describe(torch.zeros((1, 4, 64), requires_grad=True), "q")
    with pytest.raises(TypeError, match=r"^q: __dlpack__\(\) failed: .*Bool"):
        _tensor.describe(torch.zeros((1, 4, 64), dtype=torch.bool), "q")
    with pytest.raises(TypeError, match=r"^q: __dlpack__\(\) failed"):
        _tensor.describe(torch.zeros((2, 2)).to_sparse(), "q")
    # A described tensor stays alive with its descriptor until the call returns.
    addr, keep = _tensor.describe(torch.ones((1, 2, 64)), "k")
    assert isinstance(keep[0], torch.Tensor) and _fields(addr)[7] == [1, 2, 64]
