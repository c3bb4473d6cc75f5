#!/bin/bash
# The build used the CUDA/NCCL headers when they are there, libcomm.so links no CUDA library,
# and real processes asking for NCCL here fail with COMM_ERR_UNAVAILABLE saying why.
# usage: test_device_build.sh BUILD_ROOT CUDA_INCLUDE_DIR HEADERS_FOUND(true|false: what meson decided)
set -u
build=$1 cuda_include=$2 found=$3
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAILED: $1"; fail=1; fi; }

json=$("$build/tools/comm-topo/comm-topo" --json)
built=$(printf '%s' "$json" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["device"]["built_with_headers"])')
if [ "$found" = true ]; then
  check "headers in $cuda_include: built with them (comm-topo --json device.built_with_headers)" \
    '[ "$built" = True ] && [ -f "$cuda_include/cuda_runtime_api.h" ] && [ -f "$cuda_include/nccl.h" ]'
else
  check "built without the headers (-Dcuda=disabled, or none in $cuda_include): comm-topo says so" '[ "$built" = False ]'
fi
needed=$(readelf -d "$build/libcomm.so" | grep NEEDED)
check "libcomm.so links no CUDA or NCCL library (dlopen only): $(echo $needed | tr -s ' ')" \
  '! printf "%s" "$needed" | grep -Eqi "cuda|nccl|nvidia"'

run=$build/tools/comm-run/comm-run bench=$build/bench/comm-bench
if [ -e /dev/nvidiactl ]; then
  echo "skip: this machine has an NVIDIA device (tools/gpu-check covers it)"
else
  # Ten times: every rank that reports must say why. Rank 0 serves the store, and once exited
  # before rank 1 had read the verdict (rank 1 then failed with a store error instead). comm-run
  # stops the other ranks once one fails, so one report may be all there is.
  reason="COMM_ERR_UNAVAILABLE.*(no CUDA device|driver too old|library not found|built without the CUDA/NCCL headers)"
  every_report_says_why() {
    local reports why
    reports=$(printf '%s\n' "$out" | grep -c "comm_init failed")
    why=$(printf '%s\n' "$out" | grep -Ec "comm_init failed: $reason")
    [ "$reports" -ge 1 ] && [ "$why" = "$reports" ]
  }
  for attempt in 1 2 3 4 5 6 7 8 9 10; do
    out=$(COMM_TIMEOUT_MS=20000 COMM_TRANSPORT=nccl timeout 60 "$run" -n 2 --bind none -- "$bench" -b 8 -e 8 -n 1 -w 0 2>&1)
    every_report_says_why || break
  done
  check "COMM_TRANSPORT=nccl, no GPU: comm_init fails with COMM_ERR_UNAVAILABLE and why on each rank that reports ($attempt runs)" \
    every_report_says_why
  every_report_says_why || printf '%s\n' "$out"
  out=$(COMM_TIMEOUT_MS=20000 COMM_NCCL_LIBRARY=/nonexistent/libnccl.so.2 timeout 60 "$run" -n 2 --bind none -- "$bench" --transport nccl -b 8 -e 8 -n 1 -w 0 2>&1)
  check "--transport nccl without libnccl: COMM_ERR_UNAVAILABLE, NCCL library not found" \
    'printf "%s" "$out" | grep -q "COMM_ERR_UNAVAILABLE" && printf "%s" "$out" | grep -Eq "NCCL library not found|built without the CUDA/NCCL headers"'
  out=$(COMM_TIMEOUT_MS=20000 timeout 60 "$run" -n 2 --bind none -- "$bench" -b 8 -e 8 -n 1 -w 0 -c 1 2>&1)
  check "auto falls back to the host transports (comm-bench runs and checks)" \
    'printf "%s" "$out" | grep -Eq "^\[0\] +8 +2 +float"'
fi
fake=$build/tests/device/libfake_cudart.so
if [ -f "$fake" ]; then
  # comm-bench --device 1 over a CUDA runtime without a GPU: the staged path, checked rows (#wrong 0).
  out=$(COMM_TIMEOUT_MS=20000 COMM_CUDA_LIBRARY=$fake timeout 60 "$run" -n 2 --bind none -- "$bench" --device 1 -b 8 -e 1M -f 32 -n 2 -w 1 -c 1 2>&1)
  rows=$(printf '%s\n' "$out" | grep -Ec '^\[0\] +[0-9]+ +[0-9]+ +float +sum +-1 .* 0$')
  check "comm-bench --device 1 (fake CUDA runtime): staged, 4 rows checked with #wrong 0 ($rows)" \
    '[ "$rows" = 4 ] && printf "%s" "$out" | grep -q "staged through pinned host memory"'
fi
out=$(COMM_CUDA_LIBRARY=/nonexistent/libcudart.so.13 timeout 60 "$run" -n 1 --bind none -- "$bench" --device 1 -b 8 -e 8 2>&1)
check "comm-bench --device 1 without CUDA says why" 'printf "%s" "$out" | grep -q "CUDA runtime library not found\|without the CUDA"' 
exit $fail
