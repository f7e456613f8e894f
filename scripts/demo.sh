#!/usr/bin/env bash
# Quickstart 1: install dependencies, build (release), run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cmake --preset release -DREFIT_BUILD_TESTS=OFF -DREFIT_BUILD_BENCH=OFF >/dev/null
cmake --build build/release -j"$(nproc)" --target refit
exec ./build/release/tools/refit/refit demo "$@"
