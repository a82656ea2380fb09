"""Runs every case of the C runner's output directory through the Python API (FORMAT.md) and
requires byte-identical outputs and identical refusals."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest

import pagedattn as pa

CONF_DIR = os.environ.get("PAGEDATTN_CONFORMANCE_DIR")

_NP = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}
_CACHE_DT = {"f32": pa.Dtype.FLOAT32, "f16": pa.Dtype.FLOAT16, "bf16": pa.Dtype.BFLOAT16,
             "fp8_e4m3": pa.Dtype.FP8_E4M3, "fp8_e5m2": pa.Dtype.FP8_E5M2}
_ATT = {"decoder": pa.AttentionType.DECODER, "encoder": pa.AttentionType.ENCODER,
        "encoder_only": pa.AttentionType.ENCODER_ONLY, "cross": pa.AttentionType.CROSS}
_LAYOUT = {"nhd": pa.Layout.NHD, "hnd": pa.Layout.HND}


def read_meta(path: Path) -> Dict[str, List[str]]:
    meta: Dict[str, List[str]] = {}
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, rest = line.partition(" ")
        meta[key] = [rest] if key == "message" else rest.split()
    return meta


def case_names() -> List[str]:
    if not CONF_DIR:
        return []
    return [n for n in (Path(CONF_DIR) / "index.txt").read_text().split() if n]


class Case:
    def __init__(self, name: str) -> None:
        self.dir = Path(CONF_DIR) / name
        self.m = read_meta(self.dir / "meta.txt")

    def s(self, k: str) -> str:
        return self.m[k][0] if self.m[k] else ""

    def i(self, k: str) -> int:
        return int(self.s(k))

    def f(self, k: str) -> float:
        return float(self.s(k))

    def ints(self, k: str) -> List[int]:
        return [int(x) for x in self.m.get(k, [])]

    def has(self, f: str) -> bool:
        return (self.dir / f).exists()

    def arr(self, f: str, dtype, shape: Tuple[int, ...]):
        a = np.fromfile(self.dir / f, dtype=dtype).reshape(shape)
        return a

    def model(self, f: str, shape: Tuple[int, ...], key: str = "dtype"):
        dt = self.s(key)
        a = self.arr(f, _NP[dt], shape)
        return wrap(a, dt)


# "numpy": numpy arrays / BFloat16Array; "torch": torch tensors over the same memory (DLPack).
KIND = {"value": "numpy"}


def wrap(a: np.ndarray, dt: str):
    """The tensor object the current kind passes for array ``a`` of model dtype ``dt``."""
    if KIND["value"] == "torch":
        import torch
        if dt == "bf16":  # torch has no uint16: reinterpret through int16
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)
    return pa.BFloat16Array(a) if dt == "bf16" else a


def run(c: Case):
    """Runs the case's call sequence; returns (status, step, message, outputs)."""
    outs: Dict[str, bytes] = {}
    step = "none"
    poisoned = None
    be = cache = dst = batch = None
    L, nb, bs = c.i("num_layers"), c.i("num_blocks"), c.i("block_size")
    H, Hkv, D = c.i("num_heads"), c.i("num_kv_heads"), c.i("head_size")
    T, S, nctx, kvr = c.i("num_tokens"), c.i("num_seqs"), c.i("num_ctx"), c.i("kv_rows")
    att = c.s("attention")
    op = c.s("op")
    ks, vs = c.f("k_scale"), c.f("v_scale")
    # Per-KV-head scales (head_scales 1) replace k_scale / v_scale in the writes.
    head_scales = c.i("head_scales") != 0
    khs = wrap(c.arr("k_head_scales.bin", np.float32, (Hkv,)), "f32") if head_scales else None
    vhs = wrap(c.arr("v_head_scales.bin", np.float32, (Hkv,)), "f32") if head_scales else None
    try:
        step = "backend_create"
        be = pa.Backend(c.s("backend"), num_threads=1)
        if att != "encoder_only":
            step = "cache_create"
            cache = pa.KVCache.create(be, num_layers=L, num_blocks=nb, block_size=bs,
                                      num_kv_heads=Hkv, head_size=D,
                                      dtype=_CACHE_DT[c.s("cache_dtype")],
                                      layout=_LAYOUT[c.s("layout")])
        if nctx:
            step = "kv_cache_write"
            ck = c.model("ctx_k.bin", (L, nctx, Hkv, D))
            cv = c.model("ctx_v.bin", (L, nctx, Hkv, D))
            slots = c.arr("ctx_slots.bin", np.int64, (nctx,))
            for layer in range(L):
                if isinstance(ck, pa.BFloat16Array):
                    k_l, v_l = pa.BFloat16Array(ck.array[layer]), pa.BFloat16Array(cv.array[layer])
                else:
                    k_l, v_l = ck[layer], cv[layer]
                if head_scales:
                    cache.write(layer, k_l, v_l, wrap(slots, "i64"), k_head_scales=khs,
                                v_head_scales=vhs)
                else:
                    cache.write(layer, k_l, v_l, wrap(slots, "i64"), k_scale=ks, v_scale=vs)
        if op == "forward":
            step = "batch_create"
            stride = c.i("table_stride")
            tables = None if att == "encoder_only" else c.arr("tables.bin", np.int32, (S, stride))
            cross = att == "cross"
            xt = c.arr("cross_tables.bin", np.int32, (S, c.i("cross_table_stride"))) if cross else None
            # Tree masks (tree 1) as the runner packed them: bytes and offsets.
            tree = c.i("tree") != 0
            tm = (c.dir / "tree_mask.bin").read_bytes() if tree else None
            tmi = c.arr("tree_mask_indptr.bin", np.int64, (S + 1,)) if tree else None
            # Capacities as the C runner plans them (0 = this batch's size), not the binding's
            # defaults.
            batch = pa.Batch(be, cache, c.ints("query_lens"), c.ints("context_lens"), tables,
                             cross_cache=cache if cross else None,
                             encoder_lens=c.ints("encoder_lens") if cross else None,
                             cross_block_tables=xt, max_blocks_per_seq=0, max_seq_len=0,
                             tree_mask=tm, tree_mask_indptr=tmi, max_tree_mask_bytes=0)
            step = "batch_get_slot_mapping"
            outs["slots.bin"] = batch.slot_mapping.tobytes()
            step = "forward"
            q = c.model("q.bin", (T, H, D))
            k = c.model("k.bin", (kvr, Hkv, D)) if kvr else None
            v = c.model("v.bin", (kvr, Hkv, D)) if kvr else None
            odt = c.s("out_dtype")
            out_np = np.frombuffer(bytearray(b"\xff" * (T * H * D * np.dtype(_NP[odt]).itemsize)),
                                   dtype=_NP[odt]).reshape(T, H, D)
            out = wrap(out_np, odt)
            poisoned = out_np
            lse_np = np.full((T, H), np.nan, dtype=np.float32)
            lse = wrap(lse_np, "f32") if c.i("lse") else False
            alibi = wrap(c.arr("alibi.bin", np.float32, (H,)), "f32") if c.i("alibi") else None
            sinks = wrap(c.arr("sinks.bin", np.float32, (c.i("sinks_len"),)), "f32") \
                if c.i("sinks") else None
            pa.forward(be, None if c.i("null_batch") else batch, cache, c.i("layer"), q, k, v,
                       out=out, lse=lse, num_heads=H, num_kv_heads=c.i("opt_num_kv_heads"),
                       head_size=D, scale=c.f("scale"), soft_cap=c.f("soft_cap"),
                       sliding_window=c.i("sliding_window"), attention_type=_ATT[att],
                       write_kv=bool(c.i("write_kv")), k_scale=ks, v_scale=vs, alibi_slopes=alibi,
                       sinks=sinks, attention_chunk=c.i("attention_chunk"), k_head_scales=khs,
                       v_head_scales=vhs)
            outs["out.bin"] = out_np.tobytes()
            if c.i("lse"):
                outs["lse.bin"] = lse_np.tobytes()
        elif op == "copy_blocks":
            step = "copy_blocks"
            cache.copy_blocks(c.ints("pairs"))
        elif op == "swap_blocks":
            step = "dst_cache_create"
            dst = pa.KVCache.create(be, num_layers=L, num_blocks=c.i("dst_num_blocks"),
                                    block_size=bs, num_kv_heads=Hkv, head_size=D,
                                    dtype=_CACHE_DT[c.s("cache_dtype")],
                                    layout=_LAYOUT[c.s("dst_layout")])
            step = "swap_blocks"
            dst.swap_blocks(cache, c.ints("pairs"))
        status, step, message = pa.Status.OK, "none", ""
    except pa.PagedAttnError as e:
        status, message = e.code, e.message
        if step == "forward" and poisoned is not None:
            assert not (poisoned.view(np.uint8) != 0xFF).any(), "a refused forward wrote out"
    written = dst if op == "swap_blocks" else cache
    if written is not None:
        n = c.i("dst_num_blocks") if op == "swap_blocks" else nb
        outs["cache.bin"] = written.read_blocks(list(range(n))).tobytes()
    for h in (batch, dst, cache, be):
        if h is not None:
            h.close()
    return status, step, message, outs


@pytest.mark.skipif(not CONF_DIR, reason="PAGEDATTN_CONFORMANCE_DIR not set "
                    "(run_tests.sh runs the C conformance runner first)")
@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("name", case_names() or ["<none>"])
def test_conformance_case(name: str, kind: str) -> None:
    if kind == "torch":
        pytest.importorskip("torch", reason="python3-torch not installed: torch conformance skipped")
    KIND["value"] = kind
    c = Case(name)
    status, step, message, outs = run(c)
    assert status.c_name == c.s("status"), f"{name}: {status.c_name} at {step}: {message}"
    assert step == c.s("fail_step")
    if status != pa.Status.OK:
        assert message, "a refusal must carry the library's message"
        assert message == c.s("message")
    for f, got in outs.items():
        if c.has(f):
            want = (c.dir / f).read_bytes()
            assert got == want, f"{name}: {f} differs from the C runner's ({len(got)} vs {len(want)} bytes)"
    if status == pa.Status.OK and c.s("op") == "forward":
        assert "out.bin" in outs and c.has("out.bin")


def test_conformance_dir_has_cases() -> None:
    if not CONF_DIR:
        pytest.skip("PAGEDATTN_CONFORMANCE_DIR not set: conformance cases not run")
    names = case_names()
    assert len(names) >= 20
    refusals = [n for n in names if Case(n).s("status") != "PAGEDATTN_OK"]
    assert len(refusals) >= 5
