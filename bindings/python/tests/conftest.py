"""Shared fixtures. The library is found through PAGEDATTN_LIBRARY / PAGEDATTN_LIB_DIR
(run_tests.sh sets them to the build tree)."""

import pytest

import pagedattn as pa


@pytest.fixture
def be():
    """A two-thread CPU backend, closed after the test."""
    with pa.Backend("cpu", num_threads=2) as b:
        yield b
