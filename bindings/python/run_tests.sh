#!/usr/bin/env bash
# Runs the Python binding's tests against a build tree:
#   bindings/python/run_tests.sh <builddir> [pytest args...]
# Runs the C conformance runner into a temporary directory first (the Python suite must match
# its outputs byte for byte), then pytest. Exit status non-zero on any failure, including
# "no tests collected".
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
exit $rc
