#!/usr/bin/env bash
# Builds the fuzz targets with clang (libFuzzer + ASan + UBSan, the library instrumented for
# coverage; its CPU kernels for the one SIMD target this CPU runs) and runs each one time-boxed
# on its seed corpus.
#   tests/fuzz/run.sh [SECONDS] [TARGET...]    (targets: batch cache forward mla; default all)
# SECONDS (default 120) is the whole run's fuzzing time, split by what each target still finds:
# forward, whose coverage still grows after minutes, gets two fifths; batch, cache and mla a fifth
# each (batch's and cache's coverage levels off within a minute: tests/README.md, fuzz
# campaign). Targets named alone share SECONDS in the same proportions.
# Environment: FUZZ_BUILDDIR (default build-fuzz), FUZZ_JOBS (libFuzzer -jobs, default 1),
# FUZZ_NO_REBUILD=1 (fuzz the library already built there), NINJAFLAGS. New inputs go to $FUZZ_BUILDDIR/corpus/<target>, crashes to
# $FUZZ_BUILDDIR/artifacts/. Prints one "fuzz <target>: ..." line per target with executions,
# coverage and crashes; exits non-zero if any target found something, and 77 ("fuzz: SKIP", which
# scripts/test reports as SKIP, never PASS) when clang or libFuzzer is missing (scripts/setup
# installs clang and libclang-rt-dev).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root" || exit 1

total=${1:-120}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(batch cache forward mla)
# weight TARGET: its share of the fuzzing time.
weight() { case "$1" in forward) echo 2 ;; *) echo 1 ;; esac; }
weights=0
for t in "${targets[@]}"; do weights=$((weights + $(weight "$t"))); done
build=${FUZZ_BUILDDIR:-build-fuzz}
# Absolute from here on: it goes into the fuzzers' run path, and they run from inside it.
[[ $build == /* ]] || build=$root/$build
CC=${FUZZ_CC:-clang}
CXX=${FUZZ_CXX:-clang++}

if ! command -v "$CXX" > /dev/null; then
  echo "fuzz: SKIP: $CXX not found (scripts/setup installs clang)"
  exit 77
fi
# libFuzzer's runtime (libclang_rt.fuzzer) is in libclang-rt-14-dev on Debian bookworm, which
# clang only recommends; libclang-rt-dev (scripts/setup) pulls in the default clang's.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' \
  > "$probe/p.cpp"
if ! "$CXX" -fsanitize=fuzzer "$probe/p.cpp" -o "$probe/p" 2> "$probe/err"; then
  cat "$probe/err"
  echo "fuzz: SKIP: $CXX cannot link -fsanitize=fuzzer (scripts/setup installs libclang-rt-dev)"
  exit 77
fi

san=(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
lib_args="-fsanitize=fuzzer-no-link -fno-sanitize-recover=all"
# The attention kernels get ASan without UBSan (-Dcpu_kernels_ubsan=false): with it, clang
# compiles them for about 8 minutes instead of 2; scripts/sanitize runs them under both, and
# replays these corpora there. Everything else here has both.
opts=(-Dbuildtype=debugoptimized -Db_ndebug=false -Db_lundef=false -Db_sanitize=address,undefined
      -Dcpu_kernels_ubsan=false -Dtests=false -Dexamples=false -Dbench=false
      -Donednn=disabled -Dcuda=disabled -Dhip=disabled -Dsimd_targets=native
      "-Dc_args=$lib_args" "-Dcpp_args=$lib_args")
setup_log="$probe/setup.log"
if [ "${FUZZ_NO_REBUILD:-0}" = 1 ] && [ -f "$build/lib/libpagedattn.so" ]; then
  echo "fuzz: using the library already in $build (FUZZ_NO_REBUILD=1)"
elif [ -f "$build/meson-private/coredata.dat" ]; then
  CC=$CC CXX=$CXX meson setup --reconfigure "$build" "${opts[@]}" > "$setup_log" 2>&1 ||
    CC=$CC CXX=$CXX meson setup --wipe "$build" "${opts[@]}" > "$setup_log" 2>&1
else
  CC=$CC CXX=$CXX meson setup "$build" "${opts[@]}" > "$setup_log" 2>&1
fi || { cat "$setup_log"; echo "fuzz: FAIL: meson setup"; exit 1; }
if [ "${FUZZ_NO_REBUILD:-0}" != 1 ]; then
  # The core library only (the fuzz targets are built below), named by the project's version.
  version=$(sed -n "s/^  version: '\(.*\)',$/\1/p" "$root/meson.build" | head -n 1)
  # shellcheck disable=SC2086
  ninja -C "$build" ${NINJAFLAGS:-} "lib/libpagedattn.so.$version" ||
    { echo "fuzz: FAIL: build"; exit 1; }
fi

mkdir -p "$build/fuzz" "$build/artifacts"
status=0
for t in "${targets[@]}"; do
  src="$here/fuzz_$t.cpp"
  [ -f "$src" ] || { echo "fuzz: unknown target $t"; status=1; continue; }
  exe="$build/fuzz/fuzz_$t"
  if [ ! -x "$exe" ] || [ "$src" -nt "$exe" ] || [ "$here/fuzz_common.h" -nt "$exe" ] ||
     [ "$build/lib/libpagedattn.so" -nt "$exe" ]; then
    "$CXX" -std=c++17 -O1 -g -Wall -Wextra "${san[@]}" -fsanitize=fuzzer \
      -I "$root/include" -I "$build/include" "$src" -o "$exe" \
      -L "$build/lib" -lpagedattn -Wl,-rpath,"$build/lib" ||
      { echo "fuzz: FAIL: compiling $t"; status=1; continue; }
  fi
  secs=$(( (total * $(weight "$t") + weights - 1) / weights ))
  corpus="$build/corpus/$t"
  mkdir -p "$corpus"
  log="$build/fuzz/$t.log"
  # Huge requested allocations must come back as OUT_OF_MEMORY, not kill the run.
  # intercept_tls_get_addr=0: see scripts/sanitize (a leak check's tracer crash, not a leak).
  # Run from $build/fuzz: with -jobs, libFuzzer writes its fuzz-<n>.log files to the working
  # directory, which would otherwise be the checkout's root.
  (cd "$build/fuzz" &&
    ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1:halt_on_error=1:intercept_tls_get_addr=0 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    exec "$exe" -max_total_time="$secs" -timeout=20 -rss_limit_mb=3072 \
      -max_len=4096 -print_final_stats=1 -jobs="${FUZZ_JOBS:-1}" -workers="${FUZZ_JOBS:-1}" \
      -artifact_prefix="$build/artifacts/$t-" "$corpus" "$here/corpus/$t") \
    > "$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | awk '{s+=$2} END {print s+0}')
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | awk '{print $2}')
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -n 1 | awk '{print $2}')
  crashes=$(find "$build/artifacts" -name "$t-*" -newer "$exe" 2> /dev/null | wc -l)
  echo "fuzz $t: ${secs}s, $execs executions, cov: ${cov:-?}, ft: ${ft:-?}, corpus $(ls "$corpus" | wc -l) files, crashes/artifacts: $crashes, exit $rc"
  if [ $rc -ne 0 ] || [ "$crashes" -ne 0 ]; then
    grep -E 'ERROR|FUZZ CHECK|SUMMARY|runtime error|==ERROR' "$log" | head -n 20
    # The inputs themselves, so a failure seen only in a CI log can be replayed anywhere:
    #   base64 -d > input <<< '...'; $build/fuzz/fuzz_<target> input
    find "$build/artifacts" -name "$t-*" -newer "$exe" 2> /dev/null | head -n 3 | while read -r a; do
      echo "fuzz $t: input $(basename "$a") ($(stat -c %s "$a") bytes, base64): $(base64 -w 0 "$a")"
    done
    echo "fuzz $t: FAIL (log: $log)"
    status=1
  fi
done
exit $status
