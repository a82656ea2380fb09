"""How the package finds libpagedattn (in fresh interpreters, since loading happens once)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pagedattn as pa

PKG_DIR = str(Path(pa.__file__).resolve().parent.parent)
PROBE = "import pagedattn as pa; print(pa.library_path()); print(pa.version_string())"


def run_probe(env_extra: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PAGEDATTN_LIBRARY", "PAGEDATTN_LIB_DIR", "PKG_CONFIG_PATH")}
    env.update(env_extra)
    env["PYTHONPATH"] = PKG_DIR
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          timeout=60)


def test_lib_dir() -> None:
    lib_dir = os.path.dirname(pa.library_path())
    r = run_probe({"PAGEDATTN_LIB_DIR": lib_dir})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(lib_dir)
    assert r.stdout.splitlines()[1] == pa.version_string()


def test_pkg_config(tmp_path: Path) -> None:
    if not shutil.which("pkg-config"):
        pytest.skip("pkg-config not installed: pkg-config lookup not tested")
    lib_dir = os.path.dirname(os.path.realpath(pa.library_path()))
    (tmp_path / "pagedattn.pc").write_text(textwrap.dedent(f"""\
        libdir={lib_dir}
        includedir=/nonexistent
        Name: pagedattn
        Description: test
        Version: {pa.version_string()}
        Libs: -L${{libdir}} -lpagedattn
        """))
    r = run_probe({"PKG_CONFIG_PATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == os.path.join(lib_dir, "libpagedattn.so")


def test_meson_uninstalled_pkg_config() -> None:
    """The build tree's uninstalled .pc (what the Rust and Go READMEs use) names the install's
    libdir; the loader takes its -L directory first and finds the build's library."""
    build = os.environ.get("PAGEDATTN_BUILD_DIR")
    if not build:
        pytest.skip("PAGEDATTN_BUILD_DIR not set (run_tests.sh sets it): "
                    "uninstalled .pc not tested")
    if not shutil.which("pkg-config"):
        pytest.skip("pkg-config not installed: uninstalled .pc not tested")
    pc_dir = os.path.join(build, "meson-uninstalled")
    assert os.path.isfile(os.path.join(pc_dir, "pagedattn-uninstalled.pc"))
    r = run_probe({"PKG_CONFIG_PATH": pc_dir})
    assert r.returncode == 0, r.stderr
    want = os.path.join(os.path.realpath(build), "lib")
    assert os.path.dirname(os.path.realpath(r.stdout.splitlines()[0])) == want
    assert r.stdout.splitlines()[1] == pa.version_string()


def test_missing_library_is_a_clear_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope" / "libpagedattn.so")
    r = run_probe({"PAGEDATTN_LIBRARY": missing})
    assert r.returncode != 0
    assert "cannot load libpagedattn" in r.stderr and missing in r.stderr


def test_library_major_version_is_checked() -> None:
    from pagedattn import _ffi

    major = pa.version()[0]
    assert _ffi.EXPECTED_MAJOR == major
    _ffi.check_version(_ffi.load(), pa.library_path())  # the library in use passes
    with pytest.raises(OSError, match=rf"is libpagedattn {major}\.\d+\.\d+, but this binding "
                                      rf"needs major version {major + 1}"):
        _ffi.check_version(_ffi.load(), pa.library_path(), expected_major=major + 1)


def test_other_major_version_is_refused_at_load() -> None:
    """A binding expecting another major version refuses the library at its first use (the
    expectation is patched before the library is loaded, in a fresh interpreter)."""
    probe = ("import pagedattn as pa, pagedattn._ffi as f; f.EXPECTED_MAJOR += 1\n"
             "try:\n    pa.version()\nexcept OSError as e:\n    print('refused:', e)\n"
             "else:\n    raise SystemExit('loaded a library of another major version')\n"
             "try:\n    pa.Backend('cpu')\nexcept OSError:\n    print('still refused')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = PKG_DIR
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("refused: pagedattn: ") and "needs major version" in lines[0]
    assert lines[1] == "still refused"
