#!/usr/bin/env bash
# The main job: install what is missing, build, and run the all-reduce benchmark on 4 local ranks.
# Extra arguments go to comm-bench (e.g. ./scripts/bench.sh -d half -o max).
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install_missing "${BENCH_PACKAGES[@]}"
build_in "$BUILD_DIR"

# --quiet-prefix: rank 0's table stays exactly nccl-tests' format; other ranks' lines get "[rank] ".
cmd=("$BUILD_DIR/tools/comm-run/comm-run" -n 4 --quiet-prefix --
     "$BUILD_DIR/bench/comm-bench" -b 8 -e 64M -f 4 -n 20 -w 5 -c 1 "$@")
step "running: ${cmd[*]}"
exec "${cmd[@]}"
