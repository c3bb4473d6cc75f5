#!/usr/bin/env bash
# The fuzz targets (fuzz/) under libFuzzer with AddressSanitizer and UBSan, each for a while.
# A script, not a CI step (CI runs `meson test fuzz-smoke`: the same targets, the project's
# compiler, the checked-in corpus and 3 s of mutations each).
#   ./scripts/fuzz.sh                 # build-fuzz/ with clang 14, every target 60 s
#   FUZZ_SECONDS=300 ./scripts/fuzz.sh store-wire topo-xml   # some targets, longer
# Each target starts from a copy of fuzz/corpus/<target>/ in build-fuzz/corpus-<target>/ (what
# libFuzzer adds stays there). A crash leaves its input as build-fuzz/crash-<target>-*; once
# fixed, add that input to fuzz/corpus/<target>/ so fuzz-smoke replays it from then on.
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install_missing clang-14 libclang-rt-14-dev
dir=${FUZZ_BUILD_DIR:-build-fuzz}
seconds=${FUZZ_SECONDS:-60}
targets=("$@")
((${#targets[@]} > 0)) || targets=(store-wire store-server socket-wire tuning-profile topo-xml tls-records tls-handshake-messages)
corpus_of() { echo "${1//-/_}"; }

if [[ ! -f "$dir/meson-private/coredata.dat" ]]; then
  step "configuring $dir with clang 14, libFuzzer, ASan and UBSan"
  CC=clang-14 CXX=clang++-14 meson setup "$dir" -Dfuzzing=true -Db_sanitize=address,undefined -Db_lundef=false \
    -Dbuildtype=debugoptimized -Dwerror=false -Dcpp_args=-fsanitize=fuzzer-no-link -Dc_args=-fsanitize=fuzzer-no-link
fi
step "building the fuzz targets: ${targets[*]}"
ninja -C "$dir" ${NINJA_JOBS:+-j "$NINJA_JOBS"} "${targets[@]/#/fuzz/fuzz-}"

export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
status=0
for t in "${targets[@]}"; do
  work="$dir/corpus-$t"
  mkdir -p "$work"
  cp -n "fuzz/corpus/$(corpus_of "$t")"/* "$work"/
  step "fuzzing $t for $seconds s (corpus $work)"
  if ! "$dir/fuzz/fuzz-$t" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$dir/crash-$t-" \
      "$work" 2>&1 | tee "$dir/fuzz-$t.log" | grep -E "^(#[0-9]+[[:space:]]+DONE|==[0-9]+==ERROR|SUMMARY|stat::number_of_executed_units|artifact_prefix|Test unit written)"; then
    :
  fi
  if grep -qE "ERROR: (libFuzzer|AddressSanitizer|UndefinedBehaviorSanitizer)|fuzz check failed|runtime error" "$dir/fuzz-$t.log"; then
    echo "$t: FOUND A CRASH (log: $dir/fuzz-$t.log)"
    status=1
  else
    echo "$t: no crash in $seconds s ($(grep -m1 -o 'stat::number_of_executed_units: [0-9]*' "$dir/fuzz-$t.log" || echo '?'))"
  fi
done
exit $status
