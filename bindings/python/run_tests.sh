#!/usr/bin/env bash
# Runs the Python binding's tests against a build tree:
#   bindings/python/run_tests.sh <builddir> [pytest args...]
# Runs the C conformance runner into a temporary directory first (the Python suite must match
# its outputs byte for byte), then pytest, then the decode, porting and MLA examples. Exit status
# non-zero on any failure, including "no tests collected".
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
if [ $# -lt 1 ]; then
  echo "usage: $0 <builddir> [pytest args...]" >&2
  exit 2
fi
build=$(cd "$1" && pwd) || exit 2
shift
python=${PYTHON:-/usr/bin/python3}

export PAGEDATTN_LIBRARY="$build/lib/libpagedattn.so"
# For the test that finds the library through the build's uninstalled pkg-config file.
export PAGEDATTN_BUILD_DIR="$build"
export PAGEDATTN_PLUGIN_PATH="$build/kernels/onednn:$build/kernels/gpu${PAGEDATTN_PLUGIN_PATH:+:$PAGEDATTN_PLUGIN_PATH}"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
if [ ! -f "$PAGEDATTN_LIBRARY" ]; then
  echo "python: $PAGEDATTN_LIBRARY not found (build first)" >&2
  exit 1
fi
runner="$build/tests/conformance/pagedattn-conformance"
if [ ! -x "$runner" ]; then
  echo "python: $runner not found (build with tests enabled)" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "python: running the C conformance runner into $tmp"
if ! "$runner" "$root/tests/conformance/cases.txt" "$tmp/conformance" > "$tmp/runner.log" 2>&1; then
  cat "$tmp/runner.log"
  echo "python: the C conformance runner failed" >&2
  exit 1
fi
tail -n 1 "$tmp/runner.log"
export PAGEDATTN_CONFORMANCE_DIR="$tmp/conformance"

cd "$here" || exit 1
"$python" -m pytest -q -rs -p no:cacheprovider tests "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "python: pytest collected no tests" >&2
  exit 1
fi
[ $rc -eq 0 ] || exit $rc

# The example, run as the README says (here through PAGEDATTN_LIBRARY).
echo "python: examples/python/decode.py"
"$python" "$root/examples/python/decode.py" > "$tmp/example.log" 2>&1 || {
  cat "$tmp/example.log"; echo "python: the example failed" >&2; exit 1; }
tail -n 1 "$tmp/example.log"
echo "python: examples/python/porting.py"
"$python" "$root/examples/python/porting.py" > "$tmp/porting.log" 2>&1 || {
  cat "$tmp/porting.log"; echo "python: the example failed" >&2; exit 1; }
tail -n 1 "$tmp/porting.log"
echo "python: examples/python/mla.py"
"$python" "$root/examples/python/mla.py" > "$tmp/mla.log" 2>&1 || {
  cat "$tmp/mla.log"; echo "python: the example failed" >&2; exit 1; }
tail -n 2 "$tmp/mla.log" | head -n 1

# pip install (offline, from a copy so the checkout stays clean), then import from there.
if "$python" -c "import setuptools" 2> /dev/null && "$python" -m pip --version > /dev/null 2>&1; then
  mkdir -p "$tmp/src" && cp -r "$here/pagedattn" "$here/pyproject.toml" "$here/README.md" "$tmp/src/"
  if ! "$python" -m pip install -q --no-build-isolation --no-deps --no-index \
        --target "$tmp/site" "$tmp/src" > "$tmp/pip.log" 2>&1; then
    cat "$tmp/pip.log"; echo "python: pip install failed" >&2; exit 1
  fi
  (cd "$tmp" && PYTHONPATH="$tmp/site" "$python" -c \
    "import pagedattn as pa, sys; assert pa.__file__.startswith('$tmp/site'); print('python: pip-installed package loads', pa.version_string())") || exit 1
else
  echo "python: skipped: pip/setuptools not available, pip install not checked"
fi
exit 0
