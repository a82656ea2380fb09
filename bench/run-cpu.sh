#!/bin/sh
# Runs the CPU cases of docs/perf.md in one go and keeps every record.
# usage: bench/run-cpu.sh [builddir] [outdir]   (defaults: build, <builddir>/bench-out)
# Needs a build with the bench and (for the onednn rows) the oneDNN plugin.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
out=${2:-}
case $build in /*) ;; *) build=$here/$build ;; esac
[ -n "$out" ] || out=$build/bench-out
bench=$build/bench/pagedattn-bench
[ -x "$bench" ] || { echo "run-cpu.sh: $bench not built" >&2; exit 1; }
export PAGEDATTN_PLUGIN_PATH=$build/kernels/onednn${PAGEDATTN_PLUGIN_PATH:+:$PAGEDATTN_PLUGIN_PATH}
mkdir -p "$out"
: > "$out/records.jsonl"

run() {  # name, then the bench flags; $target (if set) forces the CPU SIMD target
  name=$1
  shift
  echo "== $name: ${target:+PAGEDATTN_CPU_TARGET=$target }pagedattn-bench $*"
  env ${target:+PAGEDATTN_CPU_TARGET=$target} "$bench" --json "$@" 2> "$out/$name.txt" \
      >> "$out/records.jsonl" || {
    cat "$out/$name.txt"; echo "run-cpu.sh: $name failed" >&2; exit 1; }
  cat "$out/$name.txt"
}
target=

common="--heads 32 --kv-heads 8 --head-size 128 --block-size 16"
run decode-bf16      --mode decode --batch 16 --context 4096 $common --dtype bf16 --cache-dtype bf16
run decode-fp8       --mode decode --batch 16 --context 4096 $common --dtype bf16 --cache-dtype fp8_e4m3
run decode-bf16-hnd  --mode decode --batch 16 --context 4096 $common --dtype bf16 --layout hnd
run decode-fp8-hnd   --mode decode --batch 16 --context 4096 $common --dtype bf16 --cache-dtype fp8_e4m3 \
                     --layout hnd
# The same decode without the AVX512_BF16 kernels (where the CPU has them: the before/after).
target=AVX3_DL
run decode-bf16-avx3dl --mode decode --batch 16 --context 4096 $common --dtype bf16 --baseline-iters 0
run decode-fp8-avx3dl  --mode decode --batch 16 --context 4096 $common --dtype bf16 \
                       --cache-dtype fp8_e4m3 --baseline-iters 0
# And on the AVX2 target: what a CPU without AVX-512 runs (its kernels, on this CPU's cores).
target=AVX2
run decode-bf16-avx2 --mode decode --batch 16 --context 4096 $common --dtype bf16 --baseline-iters 0
run decode-fp8-avx2  --mode decode --batch 16 --context 4096 $common --dtype bf16 \
                     --cache-dtype fp8_e4m3 --baseline-iters 0
target=
# GQA groups that are not a multiple of 4 (24/8: Llama 3.2 3B; 40/8: Qwen2.5 14B).
run decode-bf16-24x8 --mode decode --batch 16 --context 4096 --heads 24 --kv-heads 8 --head-size 128 \
                     --block-size 16 --dtype bf16
run decode-bf16-40x8 --mode decode --batch 16 --context 4096 --heads 40 --kv-heads 8 --head-size 128 \
                     --block-size 16 --dtype bf16 --baseline-iters 0
run decode-bf16-t1   --mode decode --batch 16 --context 4096 $common --dtype bf16 --threads 1
run decode-bf16-t2   --mode decode --batch 16 --context 4096 $common --dtype bf16 --threads 2
# The same 1 -> 2 thread step in one process: the call, register-only arithmetic, the streaming
# read and the plain block read in alternating rounds (what the host gives a second thread).
run decode-bf16-scaling --mode decode --batch 16 --context 4096 $common --dtype bf16 --threads 2 \
                        --scaling 7 --no-ceilings --baseline-iters 0 --no-check
run prefill-cpu      --mode prefill --batch 4 --query 2048 $common --dtype bf16 --iters 5 --warmup 1
run prefill-onednn   --mode prefill --batch 4 --query 2048 $common --dtype bf16 --iters 5 --warmup 1 \
                     --backend onednn --baseline-iters 0 --no-check
run decode-onednn    --mode decode --batch 16 --context 4096 $common --dtype bf16 --backend onednn \
                     --baseline-iters 0
run mixed-cpu        --mode mixed --batch 16 --context 4096 --query 512 $common --dtype bf16 --iters 10
run mixed-onednn     --mode mixed --batch 16 --context 4096 --query 512 $common --dtype bf16 --iters 10 \
                     --backend onednn --baseline-iters 0 --no-check
run cache-write      --mode cache-write --batch 16 --query 256 $common --dtype bf16
run cache-write-fp8  --mode cache-write --batch 16 --query 256 $common --dtype bf16 \
                     --cache-dtype fp8_e4m3
run copy-blocks      --mode copy-blocks --batch 16 --context 4096 $common --dtype bf16
# Multi-head latent attention (DeepSeek V3 / Kimi K2 shapes: latent rows of 512 values + 64 rotary,
# blocks of 64; 16 heads = one tensor-parallel rank of 8, 128 = all heads on one device).
mla="--head-size 576 --value-size 512 --block-size 64 --dtype bf16"
run mla-decode-h16-bf16  --mode mla-decode --batch 16 --context 4096 --heads 16 $mla
run mla-decode-h16-fp8   --mode mla-decode --batch 16 --context 4096 --heads 16 $mla --cache-dtype fp8_e4m3
run mla-decode-h128-bf16 --mode mla-decode --batch 16 --context 4096 --heads 128 $mla --iters 10
run mla-decode-h128-fp8  --mode mla-decode --batch 16 --context 4096 --heads 128 $mla --iters 10 \
                         --cache-dtype fp8_e4m3
run mla-prefill-h16      --mode mla-prefill --batch 4 --query 2048 --heads 16 $mla --iters 5 --warmup 1
# Where onednn overtakes cpu (the rule for `auto`): prefill of growing length, both backends.
for q in 8 16 32 64 128 512; do
  for be in cpu onednn; do
    run "crossover-q$q-$be" --mode prefill --batch 4 --query $q $common --dtype bf16 --backend $be \
        --no-ceilings --baseline-iters 0 --no-check --layers 2 --iters 10
  done
done
echo "records: $out/records.jsonl"
