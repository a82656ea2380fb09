#!/usr/bin/env bash
# Compares the built library's ABI (functions, their parameter and return types, the layout of
# every struct reachable from them, enum values) with the committed baseline libpagedattn.abi:
#   tests/abi/check_abidiff.sh LIBRARY            check; exit 1 on an incompatible change
#   tests/abi/check_abidiff.sh --update LIBRARY   rewrite the baseline (an intended change)
# Types need DWARF: a build without debug info is compared by symbols only (said so below).
# Exit 77 (meson's SKIP) when libabigail's tools are not installed.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
baseline="$here/libpagedattn.abi"
update=0
if [ "${1:-}" = "--update" ]; then update=1; shift; fi
lib=${1:?usage: $0 [--update] LIBRARY}
# The public headers, so only types they declare count (not internal C++ types).
headers="$here/../../include/pagedattn"

if ! command -v abidiff > /dev/null || ! command -v abidw > /dev/null; then
  echo "abi: skipped: abidiff/abidw not installed (apt-get install abigail-tools)"
  exit 77
fi
if ! readelf -S "$lib" 2> /dev/null | grep -q '\.debug_info'; then
  echo "abi: note: $lib has no debug info: abidiff compares exported symbols only" \
       "(configure with -Ddebug=true for type checks)"
fi
if [ "$update" -eq 1 ]; then
  abidw --no-corpus-path --no-comp-dir-path --no-show-locs --exported-interfaces-only \
    --headers-dir "$headers" --drop-private-types \
    --out-file "$baseline" "$lib" || exit 1
  echo "abi: wrote $baseline"
  exit 0
fi
[ -f "$baseline" ] || { echo "abi: FAIL: no baseline $baseline"; exit 1; }
abidiff --headers-dir2 "$headers" --no-added-syms "$baseline" "$lib"
rc=$?
# abidiff's exit status is a bit field: 4 = ABI change, 8 = incompatible change; 1/2 = errors.
if [ $rc -eq 0 ]; then
  echo "abi: no ABI change against $(basename "$baseline")"
  exit 0
fi
if [ $((rc & 3)) -ne 0 ]; then
  echo "abi: FAIL: abidiff could not compare (status $rc)"
  exit 1
fi
if [ $((rc & 8)) -ne 0 ]; then
  echo "abi: FAIL: incompatible ABI change (status $rc); see above"
  exit 1
fi
echo "abi: FAIL: the ABI changed compatibly (status $rc); if intended (minor release), update" \
     "the baseline: tests/abi/check_abidiff.sh --update LIB"
exit 1
