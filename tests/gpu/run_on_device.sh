#!/bin/bash
# Runs the GPU tests and the benchmark on the device machine from binaries
# carried in .gpudata/ (tests/gpu/README.md). Logs go to $OUT when set.
# Usage: tests/gpu/run_on_device.sh [test|bench|all] [bench args...]
set -o pipefail
what=${1:-all}
shift
out=${OUT:-/tmp}
export LD_LIBRARY_PATH=$PWD/.gpudata/lib:$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
if [[ $what != bench ]]; then
  REFIT_GPU_FIXTURES=.gpudata/fx timeout 240 .gpudata/bin/refit_gpu_test \
    2>&1 | tee $out/test.log | grep -E "^\[  |FAIL|fixture|error" | tail -40
fi
if [[ $what != test ]]; then
  if ! timeout 400 .gpudata/bin/refit_gpu_bench "$@" 2>&1 | tee $out/bench.log; then
    # The receiver failed: still measure the trainer side.
    timeout 200 .gpudata/bin/refit_gpu_bench "$@" --encode-only 1 2>&1 | tee $out/bench_encode.log
  fi
fi
