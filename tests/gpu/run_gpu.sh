#!/bin/bash
# Runs the GPU tests and the benchmark from prebuilt binaries (for a GPU host
# that does not build): REFIT_GPU_BIN holds refit_gpu_test and
# refit_gpu_bench, REFIT_GPU_LIB optional shared libraries, REFIT_GPU_FIXTURES
# the qwen2-tiny steps. Logs go to $REFIT_LOG_DIR (default /tmp).
# Usage: tests/gpu/run_gpu.sh [test|bench|all] [benchmark arguments...]
set -o pipefail
what=${1:-all}
shift
bin=${REFIT_GPU_BIN:?set REFIT_GPU_BIN to the folder with the GPU binaries}
out=${REFIT_LOG_DIR:-/tmp}
if [[ -n ${REFIT_GPU_LIB:-} ]]; then
  export LD_LIBRARY_PATH=$REFIT_GPU_LIB:$LD_LIBRARY_PATH
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
if [[ $what != bench ]]; then
  timeout 240 "$bin/refit_gpu_test" 2>&1 | tee "$out/test.log" |
    grep -E "^\[  |FAIL|fixture|error" | tail -40
fi
if [[ $what != test ]]; then
  if ! timeout 400 "$bin/refit_gpu_bench" "$@" 2>&1 | tee "$out/bench.log"; then
    # The receiver failed: still measure the trainer side.
    timeout 200 "$bin/refit_gpu_bench" "$@" --encode-only 1 2>&1 | tee "$out/bench_encode.log"
  fi
fi
