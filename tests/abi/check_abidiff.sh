#!/usr/bin/env bash
# Compares the built library's ABI (functions, their parameter and return types, the layout of
# every struct reachable from them, enum values) with the committed baseline libpagedattn.abi:
#   tests/abi/check_abidiff.sh LIBRARY            check; exit 1 on an incompatible change
#   tests/abi/check_abidiff.sh --update LIBRARY   rewrite the baseline (an intended change)
# Types need DWARF: a library without debug info is refused (tests/abi/meson.build hands over a
# copy built with -g in release builds). Exit 77 (meson's SKIP) when libabigail's tools are not
# installed. Update the baseline from a build without sanitizers (they add libasan/libubsan to
# its elf-needed list), e.g. the release build's tests/abi/libpagedattn.so.
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
  echo "abi: FAIL: $lib has no debug info: abidiff could compare exported symbols only, not" \
       "types and layouts (build it with -g)"
  exit 1
fi
# The library's ABI as XML: exported interfaces and the types the public headers declare (a
# handle's internal struct stays an opaque declaration), no source locations.
dump() {
  abidw --no-corpus-path --no-comp-dir-path --no-show-locs --exported-interfaces-only \
    --headers-dir "$headers" --drop-private-types --out-file "$2" "$1"
}
if [ "$update" -eq 1 ]; then
  if readelf -d "$lib" | grep -q 'NEEDED.*lib\(a\|ub\|t\)san'; then
    echo "abi: FAIL: $lib is a sanitizer build; write the baseline from a plain build"
    exit 1
  fi
  dump "$lib" "$baseline" || exit 1
  echo "abi: wrote $baseline"
  exit 0
fi
[ -f "$baseline" ] || { echo "abi: FAIL: no baseline $baseline"; exit 1; }
# Compared as two dumps made the same way. (abidiff BASELINE LIBRARY --headers-dir2 would filter
# out every change: the baseline has no source locations, so no type in it counts as public.)
current=$(mktemp --suffix=.abi) || exit 1
trap 'rm -f "$current"' EXIT
dump "$lib" "$current" || { echo "abi: FAIL: abidw could not read $lib"; exit 1; }
abidiff --no-added-syms "$baseline" "$current"
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
echo "abi: FAIL: the ABI changed (status $rc: a type, layout or signature; see above). Only what" \
     "the README's ABI policy allows may change in a minor release, with the baseline updated" \
     "in the same commit: tests/abi/check_abidiff.sh --update LIB"
exit 1
