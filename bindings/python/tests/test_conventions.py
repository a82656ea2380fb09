"""What engine authors expect of a numpy / torch / DLPack binding: outputs of the inputs' array
type, one return rule for forward and merge_states, one way to construct each object, the
DLPack stream handshake, and batches whose updates keep what they are not given."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from typing import Any, List, Optional, Tuple

import numpy as np
import pytest

import pagedattn as pa
from pagedattn import _tensor
from reference import decoder_attention, rel_err
from test_api import Scenario


def _torch() -> Any:
    return pytest.importorskip("torch", reason="python3-torch not installed: torch cases skipped")


# --- return values and output types -----------------------------------------------------------

def test_forward_returns_out_alone_unless_lse_is_requested(be: pa.Backend) -> None:
    sc = Scenario(be, seed=40)
    args = (be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v)
    for lse in (False, None):
        out = pa.forward(*args, lse=lse, write_kv=False)
        assert isinstance(out, np.ndarray) and out.shape == sc.q.shape
    out, lse = pa.forward(*args, lse=True, write_kv=False)
    assert isinstance(lse, np.ndarray) and lse.dtype == np.float32 and lse.shape == (3, sc.H)
    buf = np.empty((3, sc.H), np.float32)
    pair = pa.forward(*args, lse=buf, write_kv=False)
    assert isinstance(pair, tuple) and pair[1] is buf and np.array_equal(buf, lse)


def test_merge_states_follows_the_same_rule(be: pa.Backend) -> None:
    rng = np.random.default_rng(41)
    o = rng.uniform(-1, 1, (2, 4, 32)).astype(np.float32)
    lse = rng.uniform(-1, 1, (2, 4)).astype(np.float32)
    out, merged = pa.merge_states(be, o, lse, o, lse)  # requested by default
    assert merged.dtype == np.float32 and np.allclose(merged, lse + np.log(2.0), atol=1e-5)
    for off in (False, None):
        alone = pa.merge_states(be, o, lse, o, lse, lse_out=off)
        assert isinstance(alone, np.ndarray) and np.array_equal(alone, out)
    buf = np.empty_like(lse)
    assert pa.merge_states(be, o, lse, o, lse, lse_out=buf)[1] is buf


def test_torch_inputs_give_torch_outputs(be: pa.Backend) -> None:
    torch = _torch()
    sc = Scenario(be, "f32", seed=42)
    q, k, v = (torch.from_numpy(np.ascontiguousarray(x)) for x in (sc.q, sc.k, sc.v))
    out, lse = pa.forward(be, sc.batch, sc.cache, 0, q, k, v, lse=True)
    assert isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor)
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (3, sc.H)
    assert lse.device == q.device
    ref, ref_lse = sc.reference()
    assert rel_err(out.numpy(), ref) <= 1e-5 and np.allclose(lse.numpy(), ref_lse, atol=1e-5)
    merged, merged_lse = pa.merge_states(be, out, lse, out, lse)
    assert isinstance(merged, torch.Tensor) and isinstance(merged_lse, torch.Tensor)
    assert torch.allclose(merged_lse, lse + np.log(2.0), atol=1e-5)


def test_bfloat16_array_inputs_give_numpy_float32_lse(be: pa.Backend) -> None:
    sc = Scenario(be, "bf16", seed=43)
    out, lse = pa.forward(be, sc.batch, sc.cache, 0, sc.q, sc.k, sc.v, lse=True)
    assert isinstance(out, pa.BFloat16Array)
    assert isinstance(lse, np.ndarray) and lse.dtype == np.float32


def test_lse_true_without_an_allocator_is_a_clear_error(be: pa.Backend) -> None:
    sc = Scenario(be, seed=44)

    class Foreign:  # a DLPack producer the binding cannot allocate like
        def __init__(self, a: np.ndarray) -> None:
            self.a = a
            self.shape = a.shape

        def __dlpack__(self, stream: Optional[int] = None) -> Any:
            return self.a.__dlpack__()

    out = np.empty_like(sc.q)
    with pytest.raises(TypeError, match="lse=True cannot allocate .* pass lse= a tensor"):
        pa.forward(be, sc.batch, sc.cache, 0, Foreign(sc.q), sc.k, sc.v, out=out, lse=True)


def test_the_binding_never_imports_ml_dtypes() -> None:
    """Runs without ml_dtypes too: a forward and a bfloat16 round trip leave it unimported."""
    probe = (
        "import sys, numpy as np, pagedattn as pa\n"
        "be = pa.Backend('cpu', num_threads=1)\n"
        "c = pa.KVCache(be, num_layers=1, num_blocks=2, block_size=16, num_kv_heads=1,\n"
        "               head_size=64, dtype=pa.Dtype.FLOAT32)\n"
        "b = pa.Batch(be, c, [1], [0], [[1]])\n"
        "x = np.ones((1, 1, 64), np.float32)\n"
        "pa.forward(be, b, c, 0, x, x, x, lse=True)\n"
        "pa.from_bfloat16(pa.to_bfloat16([1.0]).array)\n"
        "assert 'ml_dtypes' not in sys.modules, 'ml_dtypes was imported'\n"
    )
    pkg_dir = os.path.dirname(os.path.dirname(os.path.abspath(pa.__file__)))
    env = dict(os.environ, PYTHONPATH=pkg_dir + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr


# --- construction -------------------------------------------------------------------------------

def test_kv_cache_constructor_is_public_and_create_is_its_alias(be: pa.Backend) -> None:
    geometry = dict(num_layers=2, num_blocks=4, block_size=16, num_kv_heads=2, head_size=64,
                    dtype=pa.Dtype.FLOAT16)
    with pa.KVCache(be, **geometry) as a, pa.KVCache.create(be, **geometry) as b:
        assert type(a) is type(b) is pa.KVCache
        assert a.desc == b.desc == pa.CacheDesc(2, 4, 16, 2, 64, pa.Dtype.FLOAT16,
                                                pa.Layout.NHD, 0)
    params = inspect.signature(pa.KVCache).parameters
    assert list(params)[:2] == ["backend", "num_layers"] and "ptr" not in params
    assert list(inspect.signature(pa.KVCache.create).parameters) == list(params)
    doc = inspect.getdoc(pa.KVCache)
    assert doc.index("pa.KVCache(backend") < doc.index("wrap")


def test_kv_cache_dtype_is_required(be: pa.Backend) -> None:
    geometry = dict(num_layers=1, num_blocks=4, block_size=16, num_kv_heads=2, head_size=64)
    for make in (pa.KVCache, pa.KVCache.create):
        with pytest.raises(TypeError, match="dtype"):
            make(be, **geometry)
    # numpy users pick float32 or float16, and feed arrays of that dtype.
    for np_dt, dt in ((np.float32, pa.Dtype.FLOAT32), (np.float16, pa.Dtype.FLOAT16)):
        cache = pa.KVCache(be, dtype=dt, **geometry)
        row = np.ones((1, 2, 64), np_dt)
        cache.write(0, row, row, [0])
        batch = pa.Batch(be, cache, [1], [0], [[0]])  # the token at slot 0
        out = pa.forward(be, batch, cache, 0, np.ones((1, 4, 64), np_dt), write_kv=False)
        assert out.dtype == np_dt and np.allclose(out.astype(np.float32), 1.0)


# --- DLPack streams -----------------------------------------------------------------------------

class Producer:
    """A DLPack producer over a numpy array that records the stream it was asked for and
    claims to live on ``device``."""

    def __init__(self, a: np.ndarray, device: Optional[Tuple[int, int]]) -> None:
        self.a = a
        self.shape = a.shape
        self.calls: List[Any] = []
        if device is not None:
            self.__dlpack_device__ = lambda: device

    def __dlpack__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs.get("stream", "not passed"))
        return self.a.__dlpack__()


@pytest.mark.parametrize("device,stream,want", [
    ((2, 0), None, 1),            # CUDA: the default stream is the legacy default, 1
    ((2, 0), 0, 1),
    ((2, 0), 0x1234, 0x1234),     # CUDA: the stream handle itself
    ((2, 0), 2, 2),               # cudaStreamPerThread is the protocol's 2 as well
    ((10, 0), None, 0),           # ROCm: the default stream is 0
    ((10, 0), 0x5678, 0x5678),
    ((1, 0), 0x1234, "not passed"),  # host memory: stream must be None
    ((3, 0), None, "not passed"),
    (None, 0x1234, "not passed"),    # no __dlpack_device__: nothing to go by
])
def test_gpu_backends_pass_the_stream_to_dlpack_producers(be: pa.Backend, monkeypatch:
                                                           pytest.MonkeyPatch, device: Any,
                                                           stream: Optional[int],
                                                           want: Any) -> None:
    sc = Scenario(be, seed=45)
    # The CPU backend stands in for a GPU one; the producers' memory is host memory, which
    # the CPU backend computes on, so the call itself runs.
    monkeypatch.setattr(be, "_gpu", True)
    q, k, v = (Producer(np.ascontiguousarray(x), device) for x in (sc.q, sc.k, sc.v))
    out, lse = Producer(np.empty_like(sc.q), device), Producer(np.empty((3, sc.H), np.float32),
                                                               device)
    pa.forward(be, sc.batch, sc.cache, 0, q, k, v, out=out, lse=lse, stream=stream)
    for p in (q, k, v, out, lse):
        assert p.calls == [want]
    assert rel_err(out.a, sc.reference()[0]) <= 1e-5
    o, lse1 = Producer(out.a, device), Producer(lse.a, device)
    pa.merge_states(be, o, lse1, o, lse1, out=Producer(np.empty_like(out.a), device),
                    lse_out=False, stream=stream)
    assert o.calls == [want, want] and lse1.calls == [want, want]
    row = Producer(np.zeros((1, sc.Hkv, sc.D), np.float32), device)
    sc.cache.write(0, row, row, np.array([0]), stream=stream)
    assert row.calls == [want, want]


def test_cpu_backends_call_dlpack_without_a_stream(be: pa.Backend) -> None:
    sc = Scenario(be, seed=46)
    q = Producer(np.ascontiguousarray(sc.q), (2, 0))  # even one claiming a GPU is not asked
    out = pa.forward(be, sc.batch, sc.cache, 0, q, sc.k, sc.v, out=np.empty_like(sc.q),
                     stream=0x1234)
    assert q.calls == ["not passed"]
    assert rel_err(out, sc.reference()[0]) <= 1e-5


def test_torch_dlpack_signature_takes_the_stream() -> None:
    torch = _torch()
    t = torch.zeros(3)
    assert _tensor.dlpack_stream(t, 0x1234) is None  # a CPU tensor: no stream
    # The keyword the binding passes on GPU backends is torch's own parameter name.
    assert "stream" in inspect.signature(type(t).__dlpack__).parameters


# --- batches ------------------------------------------------------------------------------------

def test_prefill_then_decode_updates_without_hand_set_capacities(be: pa.Backend) -> None:
    rng = np.random.default_rng(47)
    H, Hkv, D, bs = 4, 2, 32, 8
    cache = pa.KVCache(be, num_layers=1, num_blocks=8, block_size=bs, num_kv_heads=Hkv,
                       head_size=D, dtype=pa.Dtype.FLOAT32)
    table = [[5, 2, 7]]  # room for 24 tokens
    total = 20
    keys = rng.uniform(-1, 1, (total, Hkv, D)).astype(np.float32)
    vals = rng.uniform(-1, 1, (total, Hkv, D)).astype(np.float32)
    qs = rng.uniform(-1, 1, (total, H, D)).astype(np.float32)
    prompt = 6
    batch = pa.Batch(be, cache, [prompt], [0], table)  # a prefill step, capacities defaulted
    assert batch.info.max_blocks_per_seq == 3
    assert batch.info.max_seq_len_capacity == 3 * bs
    out = pa.forward(be, batch, cache, 0, qs[:prompt], keys[:prompt], vals[:prompt])
    ref, _ = decoder_attention(qs[:prompt], [keys], [vals], [prompt], [0])
    assert rel_err(out, ref) <= 1e-5
    for pos in range(prompt, total):  # decode steps, crossing two block boundaries
        batch.update([1], [pos], table)
        out = pa.forward(be, batch, cache, 0, qs[pos:pos + 1], keys[pos:pos + 1],
                         vals[pos:pos + 1])
        ref, _ = decoder_attention(qs[pos:pos + 1], [keys], [vals], [1], [pos])
        assert rel_err(out, ref) <= 1e-5, pos
    # Explicit capacities mean what they say.
    tight = pa.Batch(be, cache, [prompt], [0], table, max_blocks_per_seq=1, max_seq_len=prompt)
    with pytest.raises(pa.PagedAttnError) as e:
        tight.update([1], [prompt + 2], table)
    assert e.value.code == pa.Status.CAPACITY


def test_default_max_seq_len_covers_the_tables(be: pa.Backend) -> None:
    cache = pa.KVCache(be, num_layers=1, num_blocks=8, block_size=8, num_kv_heads=2,
                       head_size=32, dtype=pa.Dtype.FLOAT32)
    batch = pa.Batch(be, cache, [1], [0], [[1, 2, 3, 4]], max_blocks_per_seq=4)
    batch.update([1], [31], [[1, 2, 3, 4]])  # 32 tokens: 4 blocks of 8
    with pytest.raises(pa.PagedAttnError) as e:
        batch.update([1], [32], [[1, 2, 3, 4, 5]])
    assert e.value.code == pa.Status.CAPACITY


def _cross_world(be: pa.Backend) -> Any:
    rng = np.random.default_rng(48)
    H, Hkv, D, bs = 4, 2, 32, 8
    cache = pa.KVCache(be, num_layers=1, num_blocks=16, block_size=bs, num_kv_heads=Hkv,
                       head_size=D, dtype=pa.Dtype.FLOAT32)
    enc_lens = [10, 3]
    xt = np.array([[5, 9], [12, 0]], dtype=np.int32)
    enc_k = rng.uniform(-1, 1, (13, Hkv, D)).astype(np.float32)
    enc_v = rng.uniform(-1, 1, (13, Hkv, D)).astype(np.float32)
    q = rng.uniform(-1, 1, (3, H, D)).astype(np.float32)
    return cache, enc_lens, xt, enc_k, enc_v, q


def test_update_keeps_encoder_lens_and_cross_tables(be: pa.Backend) -> None:
    cache, enc_lens, xt, enc_k, enc_v, q = _cross_world(be)
    b = pa.Batch(be, cache, [2, 1], [0, 0], [[1], [2]], cross_cache=cache,
                 encoder_lens=enc_lens, cross_block_tables=xt)
    first = pa.forward(be, b, cache, 0, q, enc_k, enc_v, attention_type=pa.AttentionType.CROSS)
    # The next decode step repeats neither encoder_lens nor cross_block_tables.
    b.update([1, 1], [2, 1], [[1], [2]])
    out = pa.forward(be, b, cache, 0, q[1:], attention_type=pa.AttentionType.CROSS)
    # Cross attention of a row depends only on its query and its sequence's encoder tokens.
    assert np.allclose(out[0], first[1], atol=1e-6) and np.allclose(out[1], first[2], atol=1e-6)
    # Passing them replaces them: sequence 1 now sees 2 encoder tokens.
    b.update([1, 1], [3, 2], [[1], [2]], encoder_lens=[10, 2])
    out2 = pa.forward(be, b, cache, 0, q[1:], attention_type=pa.AttentionType.CROSS)
    assert np.allclose(out2[0], first[1], atol=1e-6) and not np.allclose(out2[1], first[2])
    b.update([1, 1], [4, 3], [[1], [2]])  # and the replacement is kept in turn
    out3 = pa.forward(be, b, cache, 0, q[1:], attention_type=pa.AttentionType.CROSS)
    assert np.array_equal(out3, out2)


def test_kept_encoder_lens_must_match_the_sequences(be: pa.Backend) -> None:
    cache, enc_lens, xt, _, _, _ = _cross_world(be)
    b = pa.Batch(be, cache, [1, 1], [2, 1], [[1], [2]], cross_cache=cache,
                 encoder_lens=enc_lens, cross_block_tables=xt, max_num_seqs=3,
                 max_num_tokens=3, max_num_encoder_tokens=16)
    info = b.info
    with pytest.raises(ValueError, match="encoder_lens: the batch was planned with 2"):
        b.update([1, 1, 1], [2, 1, 0], [[1], [2], [3]])
    with pytest.raises(ValueError, match="cross_block_tables: the batch was planned with 2"):
        b.update([1, 1, 1], [2, 1, 0], [[1], [2], [3]], encoder_lens=[10, 3, 1])
    assert b.info == info  # refused before the library: the batch is unchanged
    b.update([1, 1, 1], [2, 1, 0], [[1], [2], [3]], encoder_lens=[10, 3, 1],
             cross_block_tables=[[5, 9], [12, 0], [13, 0]])
    assert b.info.num_seqs == 3


# --- overhead benchmark -------------------------------------------------------------------------

def test_bench_overhead_runs() -> None:
    """bindings/python/bench_overhead.py, on a few calls: every row is printed."""
    script = os.path.join(os.path.dirname(__file__), "..", "bench_overhead.py")
    r = subprocess.run([sys.executable, script, "--inner", "5", "--repeats", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for row in ("forward", "C call alone", "Batch()", "Batch.update"):
        assert row in r.stdout, r.stdout
