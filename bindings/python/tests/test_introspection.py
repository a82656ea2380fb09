"""What a backend tells about itself (target, settings, memory, batch sizes) and the log sink."""
import logging
import threading
from typing import List, Tuple

import numpy as np
import pytest

import pagedattn as pa


def _cache(be: pa.Backend, blocks: int = 8) -> pa.KVCache:
    return pa.KVCache(be, num_layers=1, num_blocks=blocks, block_size=16, num_kv_heads=2,
                      head_size=32, dtype=pa.Dtype.FLOAT32)


def test_capabilities_name_the_target_and_settings(be: pa.Backend) -> None:
    caps = be.capabilities
    assert caps.target
    assert caps.settings
    if caps.device_type == 1:  # CPU
        assert f"target {caps.target}" in caps.settings
        assert "PAGEDATTN_CPU_SPIN_US" in caps.settings


def test_memory_usage_counts_caches_and_batches(be: pa.Backend) -> None:
    assert be.memory_usage() == pa.MemoryUsage(0, 0, 0, 0)
    cache = _cache(be)
    cache_bytes = 8 * 2 * 16 * 2 * 32 * 4  # blocks, K+V, tokens, heads, head size, float32
    assert be.memory_usage() == pa.MemoryUsage(cache_bytes, 0, 1, 0)
    batch = pa.Batch(be, cache, [3, 1], [0, 20], [[4, 0], [5, 6]])
    info = batch.info
    assert info.host_bytes > 0 and info.workspace_bytes > 0
    assert be.memory_usage() == pa.MemoryUsage(
        cache_bytes + info.host_bytes + info.workspace_bytes, 0, 1, 1)
    batch.close()
    cache.close()
    assert be.memory_usage() == pa.MemoryUsage(0, 0, 0, 0)


def test_memory_usage_reports_the_limit() -> None:
    with pa.Backend("cpu", memory_limit=1 << 30) as be:
        assert be.memory_usage().memory_limit == 1 << 30


def test_log_callback_levels_and_removal(be: pa.Backend) -> None:
    got: List[Tuple[pa.LogLevel, str]] = []
    pa.set_log_callback(lambda lv, msg: got.append((lv, msg)))
    try:
        with pytest.raises(pa.PagedAttnError) as e:
            _cache(be, 0)
        assert got == [(pa.LogLevel.ERROR, f"PAGEDATTN_ERROR_{e.value.code.name}: "
                        f"{e.value.message}")]
        del got[:]
        # Another thread's failure reaches it too.
        t = threading.Thread(target=lambda: pytest.raises(pa.PagedAttnError, _cache, be, 0))
        t.start()
        t.join()
        assert len(got) == 1 and "num_blocks" in got[0][1]
        del got[:]
        pa.set_log_callback(lambda lv, msg: got.append((lv, msg)), pa.LogLevel.DEBUG)
        with pa.Backend(be.name) as other:
            settings = other.capabilities.settings
            _cache(other).close()
        levels = [lv for lv, _ in got]
        assert levels == [pa.LogLevel.INFO, pa.LogLevel.DEBUG, pa.LogLevel.DEBUG], got
        assert settings in got[0][1]
    finally:
        pa.set_log_callback(None)
    del got[:]
    with pytest.raises(pa.PagedAttnError):
        _cache(be, 0)
    assert got == []


def test_log_to_logging(be: pa.Backend, caplog: pytest.LogCaptureFixture) -> None:
    pa.log_to_logging(pa.LogLevel.ERROR)
    try:
        with caplog.at_level(logging.ERROR, logger="pagedattn"):
            with pytest.raises(pa.PagedAttnError):
                _cache(be, 0)
    finally:
        pa.set_log_callback(None)
    records = [r for r in caplog.records if r.name == "pagedattn"]
    assert len(records) == 1 and records[0].levelno == logging.ERROR
    assert "num_blocks" in records[0].getMessage()


def test_log_level_must_be_a_log_level() -> None:
    with pytest.raises(ValueError):
        pa.set_log_callback(print, 7)  # type: ignore[arg-type]


def test_set_from_inside_the_callback_is_refused(be: pa.Backend) -> None:
    seen: List[str] = []

    def replace_from_inside(level: pa.LogLevel, message: str) -> None:
        try:
            pa.set_log_callback(None)
        except pa.PagedAttnError as e:
            seen.append(e.code.name)

    pa.set_log_callback(replace_from_inside)
    try:
        with pytest.raises(pa.PagedAttnError):
            _cache(be, 0)
        assert seen == ["INVALID_ARGUMENT"]
        with pytest.raises(pa.PagedAttnError):  # still installed
            _cache(be, 0)
        assert seen == ["INVALID_ARGUMENT"] * 2
    finally:
        pa.set_log_callback(None)
