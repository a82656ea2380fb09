#!/bin/sh
# What the bf16 decode could reach on this machine if its memory reads and its arithmetic
# overlapped perfectly, next to what it reaches (docs/perf.md: the read probe and its work units).
# 1. The decode's own compute rate: a one-sequence decode whose cache stays in cache, 1 thread.
# 2. pagedattn-read-patterns with that much independent work per 256 B read (work units chosen
#    so its in-cache rate matches step 1; a unit is ~3 cycles), over a pool 30x the LLC.
# 3. The target decode (b16 x 4096, 32/8 heads x 128, bf16), same threads, same minutes.
# usage: bench/overlap-bound.sh [builddir (build)] [threads ... (1 2)]
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
case $build in /*) ;; *) build=$here/$build ;; esac
[ $# -gt 0 ] && shift
bench=$build/bench/pagedattn-bench
probe=$build/bench/pagedattn-read-patterns
[ -x "$bench" ] && [ -x "$probe" ] || { echo "overlap-bound.sh: build $build first" >&2; exit 1; }
for t in ${*:-1 2}; do
  rate=$("$bench" --batch 1 --context 2048 --layers 1 --threads 1 --no-ceilings \
      --baseline-iters 0 --no-check --iters 1000 2>&1 |
      sed -n 's/.*bytes:.*-> \([0-9.]*\) GB.*/\1/p')
  [ -n "$rate" ] || { echo "overlap-bound.sh: no in-cache decode rate" >&2; exit 1; }
  # Calibration: 14 units per 256 B read run at 22.1 GB/s on a Zen 4 core, and the work's time is
  # linear in the units, so scale from there.
  units=$(awk -v r="$rate" 'BEGIN { u = int(14 * 22.1 / r + 0.5); print (u < 1 ? 1 : u) }')
  echo "== $t thread(s): in-cache decode $rate GB/s per core -> $units work units per 256 B"
  "$bench" --threads "$t" --iters 40 --baseline-iters 0 --no-check 2>&1 |
      grep -E "median|bytes:|plain read of this|read bandwidth .* best"
  "$probe" "$t" 512 3 "$units"
done
