#!/usr/bin/env python3
"""Per-call overhead of the Python binding on a tiny decode step, in microseconds.

One sequence, one new token, H=8, Hkv=2, D=64, block size 16, 5 tokens of context: the kernel
does almost nothing, so the figures are the binding's own cost (argument checks, tensor
descriptors, the ctypes call) plus the library's validation. Each figure is the median, over
``--repeats`` rounds, of the mean time of ``--inner`` back-to-back calls.

Rows:
  forward            pa.forward(be, batch, cache, 0, q, k, v, out=out)
  forward (alloc)    the same without out= (the binding allocates the output)
  forward (lse)      out= and lse=True
  forward (new q)    (torch) q from a pool of 2048 tensors, so that its descriptor is new
  C call alone       pagedattn_forward through ctypes with every argument prepared once
                     (numpy float32 only): the floor any Python caller pays
  Batch()            planning a one-sequence decode batch from Python lists
  Batch.update       re-planning it in place from Python lists
  Batch.update (np)  the same from int32 numpy arrays
  C call alone       pagedattn_batch_update through ctypes with its desc built once

Run from the repository root after building (the build tree's library, CPU backend):
    PAGEDATTN_LIBRARY=build/lib/libpagedattn.so /usr/bin/python3 bindings/python/bench_overhead.py
Options: --threads N (backend threads, default 1), --inner N, --repeats N.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import statistics
import sys
import time
from typing import Any, Callable, List, Tuple

import numpy as np

import pagedattn as pa

H, HKV, D, BS, CTX = 8, 2, 64, 16, 5


def per_call_us(fn: Callable[[], Any], inner: int, repeats: int) -> float:
    """Median over ``repeats`` rounds of the mean time of ``inner`` calls, in microseconds."""
    for _ in range(max(1, inner // 4)):  # warm-up
        fn()
    rounds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        rounds.append((time.perf_counter() - t0) / inner)
    return statistics.median(rounds) * 1e6


def c_call_alone(be: pa.Backend, batch: pa.Batch, cache: pa.KVCache, q: np.ndarray,
                 k: np.ndarray, v: np.ndarray, out: np.ndarray) -> Callable[[], int]:
    """A closure calling pagedattn_forward directly, every argument built once (own ctypes
    handle on the same library, so the binding's prototypes are not touched)."""
    lib = ctypes.CDLL(pa.library_path())
    fn = lib.pagedattn_forward
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int32] + [ctypes.c_void_p] * 7

    class Tensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                    ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                    ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                    ("lanes", ctypes.c_uint16), ("shape", ctypes.c_void_p),
                    ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]

    keep: List[Any] = []

    def describe(a: np.ndarray) -> int:
        shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        strides = (ctypes.c_int64 * a.ndim)(*[s // a.itemsize for s in a.strides])
        t = Tensor(a.ctypes.data, 1, 0, a.ndim, 2, 8 * a.itemsize, 1,
                   ctypes.addressof(shape), ctypes.addressof(strides), 0)
        keep.extend([a, shape, strides, t])
        return ctypes.addressof(t)

    opts = pa._ffi.AttentionOptionsStruct()
    lib.pagedattn_attention_options_init(ctypes.byref(opts))
    opts.num_heads, opts.num_kv_heads, opts.head_size, opts.write_kv = H, HKV, D, 1
    keep.append(opts)
    args = (be._handle(), batch._handle(), cache._handle(), 0, ctypes.addressof(opts),
            describe(q), describe(k), describe(v), describe(out), None, None)

    def call() -> int:
        status = fn(*args)
        if status:
            raise RuntimeError(f"pagedattn_forward failed: {status}")
        return status

    call.keep = keep  # type: ignore[attr-defined]
    return call


def c_update_alone(batch: pa.Batch, ql: List[int], cl: List[int],
                   table: List[List[int]]) -> Callable[[], int]:
    """A closure calling pagedattn_batch_update directly with a desc built once."""
    lib = ctypes.CDLL(pa.library_path())
    fn = lib.pagedattn_batch_update
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    i32, i64, ptr = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p

    class Desc(ctypes.Structure):  # pagedattn_batch_desc
        _fields_ = [("struct_size", ctypes.c_uint32), ("num_seqs", i32), ("query_lens", ptr),
                    ("context_lens", ptr), ("block_tables", ptr), ("block_table_stride", i32),
                    ("slot_mapping", ptr), ("encoder_lens", ptr), ("cross_block_tables", ptr),
                    ("cross_block_table_stride", i32), ("max_num_seqs", i32),
                    ("max_num_tokens", i64), ("max_blocks_per_seq", i32),
                    ("max_num_encoder_tokens", i64), ("max_seq_len", i64)]

    q = (i32 * len(ql))(*ql)
    c = (i32 * len(cl))(*cl)
    t = (i32 * (len(table) * len(table[0])))(*[x for r in table for x in r])
    d = Desc()
    lib.pagedattn_batch_desc_init(ctypes.byref(d))
    d.num_seqs, d.block_table_stride = len(ql), len(table[0])
    d.query_lens, d.context_lens, d.block_tables = (ctypes.addressof(x) for x in (q, c, t))
    args = (batch._handle(), ctypes.addressof(d))

    def call() -> int:
        status = fn(*args)
        if status:
            raise RuntimeError(f"pagedattn_batch_update failed: {status}")
        return status

    call.keep = (q, c, t, d)  # type: ignore[attr-defined]
    return call


def main() -> int:
    """Runs every row and prints it as it is measured."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--inner", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=25)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        torch = None

    rows: List[Tuple[str, str, float]] = []

    def bench(name: str, kind: str, fn: Callable[[], Any]) -> None:
        us = per_call_us(fn, args.inner, args.repeats)
        rows.append((name, kind, us))
        print(f"{name:<20} {kind:<14} {us:8.2f} us", flush=True)

    print(f"pagedattn {pa.version_string()} from {pa.library_path()}; "
          f"python {sys.version.split()[0]}, numpy {np.__version__}, "
          f"torch {torch.__version__ if torch else 'not installed'}")
    print(f"decode: 1 sequence, context {CTX}, H={H}, Hkv={HKV}, D={D}, block size {BS}, "
          f"{args.threads} thread(s); median of {args.repeats} x {args.inner} calls")
    rng = np.random.default_rng(0)
    with pa.Backend("cpu", num_threads=args.threads) as be:
        for np_dt, pa_dt, label in ((np.float32, pa.Dtype.FLOAT32, "float32"),
                                    (np.float16, pa.Dtype.FLOAT16, "float16")):
            cache = pa.KVCache.create(be, num_layers=1, num_blocks=8, block_size=BS,
                                      num_kv_heads=HKV, head_size=D, dtype=pa_dt)
            ctx = rng.uniform(-1, 1, (CTX, HKV, D)).astype(np_dt)
            cache.write(0, ctx, ctx, list(range(3 * BS, 3 * BS + CTX)))
            batch = pa.Batch(be, cache, [1], [CTX], [[3]])
            q = rng.uniform(-1, 1, (1, H, D)).astype(np_dt)
            k = rng.uniform(-1, 1, (1, HKV, D)).astype(np_dt)
            v = rng.uniform(-1, 1, (1, HKV, D)).astype(np_dt)
            out = np.empty_like(q)
            kind = f"numpy {label}"
            bench("forward", kind, lambda: pa.forward(be, batch, cache, 0, q, k, v, out=out))
            bench("forward (alloc)", kind, lambda: pa.forward(be, batch, cache, 0, q, k, v))
            bench("forward (lse)", kind,
                  lambda: pa.forward(be, batch, cache, 0, q, k, v, out=out, lse=True))
            if np_dt is np.float32:
                bench("C call alone", kind, c_call_alone(be, batch, cache, q, k, v, out))
            if torch is not None:
                tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
                tout = torch.empty_like(tq)
                kind = f"torch {label}"
                bench("forward", kind,
                      lambda: pa.forward(be, batch, cache, 0, tq, tk, tv, out=tout))
                bench("forward (alloc)", kind,
                      lambda: pa.forward(be, batch, cache, 0, tq, tk, tv))
                bench("forward (lse)", kind,
                      lambda: pa.forward(be, batch, cache, 0, tq, tk, tv, out=tout, lse=True))
                # q taken in turn from 2048 tensors over distinct memory: no descriptor is
                # reused between calls (the binding keeps at most 1024).
                qs = itertools.cycle(torch.from_numpy(np.repeat(q[None], 2048, 0)).unbind(0))
                bench("forward (new q)", kind,
                      lambda: pa.forward(be, batch, cache, 0, next(qs), tk, tv, out=tout))
            batch.close()
            cache.close()

        cache = pa.KVCache.create(be, num_layers=1, num_blocks=8, block_size=BS,
                                  num_kv_heads=HKV, head_size=D, dtype=pa.Dtype.FLOAT32)

        def plan() -> None:
            pa.Batch(be, cache, [1], [CTX], [[3]]).close()

        batch = pa.Batch(be, cache, [1], [CTX], [[3]], max_seq_len=BS, max_blocks_per_seq=1)
        ql, cl, bt = (np.array(x, dtype=np.int32) for x in ([1], [CTX + 1], [[3]]))
        bench("Batch()", "lists", plan)
        bench("Batch.update", "lists", lambda: batch.update([1], [CTX + 1], [[3]]))
        bench("Batch.update (np)", "int32 arrays", lambda: batch.update(ql, cl, bt))
        bench("C call alone", "update", c_update_alone(batch, [1], [CTX + 1], [[3]]))
        batch.close()
        cache.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
