#!/usr/bin/env bash
# Install what is missing, build, run every test, then the unit tests under ASan+UBSan.
#   COMM_ASAN_TESTS   Catch2 test spec for the sanitizer tier (default: "~[slow]", every unit
#                     test not tagged [slow]); e.g. COMM_ASAN_TESTS='[reduce]' ./scripts/test.sh
#   SKIP_ASAN=1       skip the sanitizer tier
#   NINJA_JOBS=N      build with N jobs
#   BUILD_DIR, ASAN_BUILD_DIR   build directories (default build, build-asan)
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install_missing "${TEST_PACKAGES[@]}"
build_in "$BUILD_DIR"

failed=()
failed_dirs=()

# The deadline and process-death tests are marked is_parallel: false; meson runs them one at a time.
step "running every test: meson test -C $BUILD_DIR --print-errorlogs"
meson test -C "$BUILD_DIR" --print-errorlogs || { failed+=("tests in $BUILD_DIR/"); failed_dirs+=("$BUILD_DIR"); }

if [[ "${SKIP_ASAN:-0}" != 1 ]]; then
  # ASan makes every large buffer a fresh first touch: this tier runs the unit tests only.
  # werror=false here only: GCC 12 with -fsanitize reports false -Wmaybe-uninitialized in
  # libstdc++ (<regex>, via catch.hpp); the main build above keeps warnings as errors.
  build_in "$ASAN_BUILD_DIR" -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized \
    -Dwerror=false
  spec=${COMM_ASAN_TESTS-"~[slow]"}
  step "sanitizer tier: meson test -C $ASAN_BUILD_DIR unit (Catch2 spec: '${spec}')"
  args=(-C "$ASAN_BUILD_DIR" --print-errorlogs --timeout-multiplier 3)
  [[ -n "$spec" ]] && args+=(--test-args "$spec")
  ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:abort_on_error=1:detect_leaks=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
  UCX_MEM_EVENTS=no \
    meson test "${args[@]}" unit || { failed+=("unit tests under ASan+UBSan ($ASAN_BUILD_DIR/)"); failed_dirs+=("$ASAN_BUILD_DIR"); }
fi

if ((${#failed[@]} > 0)); then
  # Last, so that a log read from its tail names the failed tests and shows their ends.
  for dir in "${failed_dirs[@]}"; do
    python3 scripts/failed_tests.py "$dir" 25
  done
  step "FAILED: ${failed[*]}"
  exit 1
fi
step "all tests passed"
