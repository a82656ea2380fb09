"""Scalar integers bound for C fields and arguments are checked against their C type before any
call: ctypes would keep only their low bits, so layer 2**32 ran layer 0 and
num_blocks=2**32+8 made an 8-block cache. A refused call raises OverflowError (TypeError for a
non-integer) naming the argument, and nothing is created or written."""

from __future__ import annotations

import contextlib
import ctypes
import re
from typing import Any, Callable, Iterator, List, Tuple

import numpy as np
import pytest

import pagedattn as pa
from pagedattn import _ffi

INT32 = [2**31, 2**32, 2**32 + 1, 2**32 + 8, -2**31 - 1]
INT64 = [2**63, 2**64, 2**64 + 8, -2**63 - 1]
UINT32 = [-1, 2**32, 2**32 + 8]
UINT64 = [-1, 2**64, 2**64 + 8]
NOT_INTEGERS = [2.0, np.float64(1.0), True, np.bool_(False), "1"]

NB, BS, HKV, H, D = 8, 4, 2, 4, 32


def cases(*groups: Tuple[str, str, List[int]]) -> List[Tuple[str, str, int]]:
    """(argument, C type, value) for every value of every group."""
    return [(arg, ctype, v) for arg, ctype, values in groups for v in values]


def overflow(arg: str, ctype: str, value: int) -> Any:
    return pytest.raises(OverflowError, match=rf"^{arg} = {value} does not fit {ctype}$")


@contextlib.contextmanager
def never_reaches(monkeypatch: pytest.MonkeyPatch, *names: str) -> Iterator[None]:
    """Fails the test if any of the C functions ``names`` is called inside the block: a
    refused call creates and writes nothing."""
    lib = _ffi.load()

    def spy(name: str) -> Callable[..., Any]:
        def refuse(*args: Any) -> Any:
            raise AssertionError(f"{name} was called")
        return refuse

    with monkeypatch.context() as m:
        for name in names:
            m.setattr(lib, name, spy(name))
        yield


class World:
    """A one-layer float32 cache with context in it, a planned decode batch, q/k/v, and a
    snapshot of every block to check that refused calls wrote nothing."""

    def __init__(self, be: pa.Backend) -> None:
        rng = np.random.default_rng(34)
        self.be = be
        self.cache = pa.KVCache.create(be, num_layers=1, num_blocks=NB, block_size=BS,
                                       num_kv_heads=HKV, head_size=D, dtype=pa.Dtype.FLOAT32)
        ctx = rng.uniform(-1, 1, (5, HKV, D)).astype(np.float32)
        self.cache.write(0, ctx, -ctx, [[3, 6][p // BS] * BS + p % BS for p in range(5)])
        self.batch = pa.Batch(be, self.cache, [1], [5], [[3, 6]])
        self.q = rng.uniform(-1, 1, (1, H, D)).astype(np.float32)
        self.k = rng.uniform(-1, 1, (1, HKV, D)).astype(np.float32)
        self.v = rng.uniform(-1, 1, (1, HKV, D)).astype(np.float32)
        self.out = np.full((1, H, D), np.nan, dtype=np.float32)
        self.snapshot = self.cache.read_blocks(range(NB))

    def forward(self, layer: Any = 0, **kw: Any) -> Any:
        kw.setdefault("out", self.out)
        return pa.forward(self.be, self.batch, self.cache, layer, self.q, self.k, self.v, **kw)

    def untouched(self) -> bool:
        return bool((self.cache.read_blocks(range(NB)) == self.snapshot).all()) and \
            bool(np.isnan(self.out).all())


@pytest.fixture
def w(be: pa.Backend) -> World:
    return World(be)


def strided(shape: Tuple[int, ...]) -> np.ndarray:
    """A writable float32 view of a huge shape over little memory (stride 0 everywhere but a
    small innermost dimension, which keeps a unit stride), for sizes taken from shapes."""
    inner = shape[-1] if shape[-1] <= 1024 else 1
    strides = (0,) * (len(shape) - 1) + (4 if inner > 1 else 0,)
    return np.lib.stride_tricks.as_strided(np.zeros(inner, dtype=np.float32), shape=shape,
                                           strides=strides)


# --- backend --------------------------------------------------------------------------------

@pytest.mark.parametrize("arg,ctype,value", cases(("device_index", "int32", INT32),
                                                  ("num_threads", "int32", INT32),
                                                  ("memory_limit", "uint64", UINT64)))
def test_backend_options(monkeypatch: pytest.MonkeyPatch, arg: str, ctype: str,
                         value: int) -> None:
    with never_reaches(monkeypatch, "pagedattn_backend_create"), overflow(arg, ctype, value):
        pa.Backend("cpu", **{arg: value})


# --- caches ---------------------------------------------------------------------------------

CACHE_SIZES = ["num_layers", "num_blocks", "block_size", "num_kv_heads", "head_size"]


@pytest.mark.parametrize("arg,ctype,value", cases(*[(a, "int32", INT32) for a in CACHE_SIZES]))
def test_cache_create_sizes(monkeypatch: pytest.MonkeyPatch, be: pa.Backend, arg: str,
                            ctype: str, value: int) -> None:
    geometry = dict(num_layers=1, num_blocks=8, block_size=16, num_kv_heads=2, head_size=64,
                    dtype=pa.Dtype.FLOAT16)
    geometry[arg] = value
    with never_reaches(monkeypatch, "pagedattn_kv_cache_create"), overflow(arg, ctype, value):
        pa.KVCache(be, **geometry)
    with never_reaches(monkeypatch, "pagedattn_kv_cache_create"), overflow(arg, ctype, value):
        pa.KVCache.create(be, **geometry)


@pytest.mark.parametrize("arg,ctype,value", cases(
    *[(a, "int32", INT32) for a in CACHE_SIZES if a != "num_blocks"]))
def test_bytes_per_block_sizes(arg: str, ctype: str, value: int) -> None:
    sizes = dict(num_layers=1, block_size=16, num_kv_heads=2, head_size=64)
    sizes[arg] = value
    with overflow(arg, ctype, value):
        pa.bytes_per_block(dtype=pa.Dtype.FLOAT16, **sizes)


@pytest.mark.parametrize("arg,ctype,value", cases(("num_blocks", "int32", INT32),
                                                  ("dtype", "int32", INT32),
                                                  ("layout", "int32", INT32),
                                                  ("flags", "uint32", UINT32)))
def test_cache_desc_fields(arg: str, ctype: str, value: int) -> None:
    fields = dict(num_layers=1, num_blocks=8, block_size=16, num_kv_heads=2, head_size=64,
                  dtype=pa.Dtype.FLOAT16, layout=pa.Layout.NHD, flags=0)
    fields[arg] = value
    with overflow(arg, ctype, value):
        pa.CacheDesc(**fields).bytes_per_block  # the property fills the C struct


@pytest.mark.parametrize("value", [v for v in INT32 if v > 0])
@pytest.mark.parametrize("dim,arg", [(0, "num_blocks"), (1, "block_size"), (2, "num_kv_heads")])
def test_wrap_sizes_taken_from_shapes(monkeypatch: pytest.MonkeyPatch, be: pa.Backend,
                                      dim: int, arg: str, value: int) -> None:
    shape = [8, 16, 2, 64]
    shape[dim] = value
    layer = strided(tuple(shape))
    with never_reaches(monkeypatch, "pagedattn_kv_cache_wrap"), overflow(arg, "int32", value):
        pa.KVCache.wrap(be, [layer], [layer])


@pytest.mark.parametrize("value", INT32)
def test_cache_layer_and_write_layer(w: World, value: int) -> None:
    with overflow("layer", "int32", value):
        w.cache.layer(value)
    with overflow("layer", "int32", value):
        w.cache.write(value, w.k, w.v, [0])
    assert w.untouched()


@pytest.mark.parametrize("value", INT32 + [2**64 + 8])
def test_block_ids(w: World, value: int) -> None:
    other = pa.KVCache.create(w.be, num_layers=1, num_blocks=NB, block_size=BS,
                              num_kv_heads=HKV, head_size=D, dtype=pa.Dtype.FLOAT32)
    buf = w.cache.read_blocks([0])
    with pytest.raises(OverflowError, match=rf"^pairs\[0, 1\] = {value} does not fit int32$"):
        w.cache.copy_blocks([(0, value)])
    with pytest.raises(OverflowError, match=rf"^pairs\[0\] = {value} does not fit int32$"):
        w.cache.swap_blocks(other, [value, 0])
    with pytest.raises(OverflowError, match=rf"^block_ids\[1\] = {value} does not fit int32$"):
        w.cache.load_blocks([1, value], np.concatenate([buf, buf]))
    with pytest.raises(OverflowError, match=rf"^block_ids\[0\] = {value} does not fit int32$"):
        w.cache.read_blocks([value])
    assert w.untouched()


@pytest.mark.parametrize("slots", [[v] for v in INT64] + [np.array([2**63], dtype=np.uint64),
                                                         np.array([2**64 - 1], dtype=np.uint64)])
def test_write_slots(w: World, slots: Any) -> None:
    # uint64 arrays too: numpy compares them with int64 bounds in float64, where 2**63 fits.
    with pytest.raises(OverflowError,
                       match=rf"^slot_mapping\[0\] = {int(slots[0])} does not fit int64$"):
        w.cache.write(0, w.k, w.v, slots)
    assert w.untouched()


# --- batches --------------------------------------------------------------------------------

@pytest.mark.parametrize("arg,ctype,value", cases(("max_num_seqs", "int32", INT32),
                                                  ("max_num_tokens", "int64", INT64),
                                                  ("max_blocks_per_seq", "int32", INT32),
                                                  ("max_num_encoder_tokens", "int64", INT64),
                                                  ("max_seq_len", "int64", INT64)))
def test_batch_capacities(monkeypatch: pytest.MonkeyPatch, w: World, arg: str, ctype: str,
                          value: int) -> None:
    with never_reaches(monkeypatch, "pagedattn_batch_create"), overflow(arg, ctype, value):
        pa.Batch(w.be, w.cache, [1], [5], [[3, 6]], **{arg: value})


@pytest.mark.parametrize("value", INT32)
@pytest.mark.parametrize("arg", ["query_lens", "context_lens", "block_tables", "encoder_lens",
                                 "cross_block_tables"])
def test_batch_lengths_and_tables(monkeypatch: pytest.MonkeyPatch, w: World, arg: str,
                                  value: int) -> None:
    kw: dict = dict(query_lens=[1], context_lens=[5], block_tables=[[3, 6]])
    tables = arg.endswith("tables")
    kw[arg] = [[value]] if tables else [value]
    element = f"{arg}[0][0]" if tables else f"{arg}[0]"  # ragged rows are named row by row
    match = rf"^{re.escape(element)} = {value} does not fit int32$"
    info = w.batch.info
    with never_reaches(monkeypatch, "pagedattn_batch_create", "pagedattn_batch_update"):
        with pytest.raises(OverflowError, match=match):
            pa.Batch(w.be, w.cache, **kw)
        with pytest.raises(OverflowError, match=match):
            w.batch.update(**kw)
    assert w.batch.info == info  # the batch keeps its previous contents


@pytest.mark.parametrize("value", INT32)
@pytest.mark.parametrize("arg", ["seq_lens", "query_start_loc"])
def test_batch_seq_form_lengths(monkeypatch: pytest.MonkeyPatch, w: World, arg: str,
                                value: int) -> None:
    kw: dict = dict(seq_lens=[6], query_start_loc=[0, 1], block_tables=[[3, 6]])
    kw[arg] = [value] + kw[arg][1:]
    match = rf"^{arg}\[0\] = {value} does not fit int32$"
    info = w.batch.info
    with never_reaches(monkeypatch, "pagedattn_batch_create", "pagedattn_batch_update"):
        with pytest.raises(OverflowError, match=match):
            pa.Batch(w.be, w.cache, **kw)
        with pytest.raises(OverflowError, match=match):
            w.batch.update(**kw)
    assert w.batch.info == info


@pytest.mark.parametrize("value", INT64)
def test_batch_slot_mapping(w: World, value: int) -> None:
    with pytest.raises(OverflowError, match=rf"^slot_mapping\[0\] = {value} does not fit int64$"):
        pa.Batch(w.be, w.cache, [1], [5], [[3, 6]], slot_mapping=[value])


# --- forward --------------------------------------------------------------------------------

@pytest.mark.parametrize("arg,ctype,value", cases(("layer", "int32", INT32),
                                                  ("num_heads", "int32", INT32),
                                                  ("num_kv_heads", "int32", INT32),
                                                  ("head_size", "int32", INT32),
                                                  ("sliding_window", "int32", INT32),
                                                  ("attention_chunk", "int32", INT32)))
def test_forward_scalars_write_nothing(monkeypatch: pytest.MonkeyPatch, w: World, arg: str,
                                       ctype: str, value: int) -> None:
    with never_reaches(monkeypatch, "pagedattn_forward"), overflow(arg, ctype, value):
        if arg == "layer":
            w.forward(value)
        else:
            w.forward(**{arg: value})
    assert w.untouched()  # layer 2**32 used to run, and write k/v into, layer 0


@pytest.mark.parametrize("value", [v for v in INT32 if v > 0])
def test_forward_sizes_taken_from_shapes(w: World, value: int) -> None:
    with overflow("num_heads", "int32", value):
        pa.forward(w.be, w.batch, w.cache, 0, strided((1, value, D)), w.k, w.v, out=w.out)
    with overflow("head_size", "int32", value):
        pa.forward(w.be, w.batch, w.cache, 0, strided((1, H, value)), w.k, w.v, out=w.out)
    with overflow("num_kv_heads", "int32", value):
        pa.forward(w.be, w.batch, w.cache, 0, w.q, strided((1, value, D)), w.v, out=w.out)
    assert w.untouched()


def test_integers_that_fit_are_taken(w: World) -> None:
    """The checks refuse only what does not fit: numpy integers work like ints."""
    got = w.forward(np.int64(0), sliding_window=np.int32(0), num_heads=np.uint8(H)).copy()
    w.cache.load_blocks(range(NB), w.snapshot)
    assert np.isfinite(got).all()
    assert (w.forward(0, out=np.empty_like(w.out)) == got).all()
    with pa.Backend("cpu", num_threads=np.int32(1), memory_limit=np.uint64(2**64 - 1)) as be, \
            pa.KVCache.create(be, num_layers=np.int8(1), num_blocks=np.int64(7),
                              block_size=16, num_kv_heads=2, head_size=64,
                              dtype=np.int32(pa.Dtype.FLOAT32)) as cache, \
            pa.Batch(be, cache, [1], [5], [[3]], max_num_tokens=np.uint64(64)) as batch:
        assert cache.desc.num_blocks == 7 and cache.desc.dtype is pa.Dtype.FLOAT32
        assert batch.info.max_num_tokens == 64


# --- streams ----------------------------------------------------------------------------------

def stream_calls(w: World) -> List[Callable[[Any], Any]]:
    o = np.zeros((1, H, D), dtype=np.float32)
    lse = np.zeros((1, H), dtype=np.float32)
    other = pa.KVCache.create(w.be, num_layers=1, num_blocks=NB, block_size=BS,
                              num_kv_heads=HKV, head_size=D, dtype=pa.Dtype.FLOAT32)
    return [
        lambda s: w.be.synchronize(s),
        lambda s: w.forward(stream=s),
        lambda s: pa.merge_states(w.be, o, lse, o, lse, out=w.out, stream=s),
        lambda s: w.cache.write(0, w.k, w.v, [0], stream=s),
        lambda s: w.cache.copy_blocks([(0, 1)], stream=s),
        lambda s: w.cache.swap_blocks(other, [(0, 1)], stream=s),
        lambda s: w.cache.read_blocks([0], stream=s),
        lambda s: w.cache.load_blocks([1], w.snapshot[:1], stream=s),
    ]


@pytest.mark.parametrize("value", UINT64)
def test_streams(w: World, value: int) -> None:
    for call in stream_calls(w):
        with overflow("stream", "uint64", value):
            call(value)
        with pytest.raises(TypeError, match="^stream: expected an integer, got float$"):
            call(1.0)
    assert w.untouched()


def test_stream_kinds_accepted(w: World) -> None:
    for s in (None, 0, np.uint64(0), ctypes.c_void_p(None)):
        w.be.synchronize(s)
        w.cache.read_blocks([0], stream=s)


# --- dtypes and statuses ---------------------------------------------------------------------

@pytest.mark.parametrize("value", INT32)
def test_dtype_and_status_queries(value: int) -> None:
    for query in (pa.dtype_name, pa.dtype_size, pa.dtype_to_dlpack):
        with overflow("dtype", "int32", value):
            query(value)
    with overflow("status", "int32", value):
        pa.status_string(value)
    assert pa.dtype_name(99) == "invalid"  # a value in range that is not a dtype


@pytest.mark.parametrize("dl,field,ctype,value", [
    ((2**8, 16), "code", "uint8", 2**8), ((-1, 16), "code", "uint8", -1),
    ((2, 2**8), "bits", "uint8", 2**8), ((2, 2**32 + 16), "bits", "uint8", 2**32 + 16),
    ((2, 16, 2**16), "lanes", "uint16", 2**16), ((2, 16, -1), "lanes", "uint16", -1)])
def test_dtype_from_dlpack_fields(dl: Tuple[int, ...], field: str, ctype: str,
                                  value: int) -> None:
    # Documented as ValueError (the out-of-range field named), as before the checks.
    with pytest.raises(ValueError, match=rf"{field} = {value} does not fit {ctype}$"):
        pa.dtype_from_dlpack(dl)


# --- non-integers -----------------------------------------------------------------------------

@pytest.mark.parametrize("value", NOT_INTEGERS)
def test_non_integers_are_type_errors(w: World, value: Any) -> None:
    kind = "a bool" if isinstance(value, (bool, np.bool_)) else type(value).__name__
    calls: List[Tuple[str, Callable[[], Any]]] = [
        ("layer", lambda: w.forward(value)),
        ("sliding_window", lambda: w.forward(sliding_window=value)),
        ("attention_chunk", lambda: w.forward(attention_chunk=value)),
        ("attention_type", lambda: w.forward(attention_type=value)),
        ("layer", lambda: w.cache.write(value, w.k, w.v, [0])),
        ("layer", lambda: w.cache.layer(value)),
        ("num_blocks", lambda: pa.KVCache(w.be, num_layers=1, num_blocks=value, block_size=16,
                                          num_kv_heads=2, head_size=64, dtype=pa.Dtype.FLOAT16)),
        ("layout", lambda: pa.bytes_per_block(1, 16, 2, 64, pa.Dtype.FLOAT16, layout=value)),
        ("num_threads", lambda: pa.Backend("cpu", num_threads=value)),
        ("max_num_tokens", lambda: pa.Batch(w.be, w.cache, [1], [5], [[3, 6]],
                                            max_num_tokens=value)),
        ("dtype", lambda: pa.dtype_name(value)),
        ("code", lambda: pa.dtype_from_dlpack((value, 16))),
    ]
    if not isinstance(value, str):  # a cache dtype may be a name (test_dtypes.py)
        calls.append(("dtype", lambda: pa.KVCache.create(w.be, num_layers=1, num_blocks=8,
                                                         block_size=16, num_kv_heads=2,
                                                         head_size=64, dtype=value)))
    for arg, call in calls:
        with pytest.raises(TypeError, match=rf"^{arg}: expected an integer, got {kind}$"):
            call()
    assert w.untouched()
