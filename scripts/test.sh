#!/usr/bin/env bash
# Quickstart 2: install dependencies, build (dev preset, warnings are
# errors), run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cmake --preset dev >/dev/null
cmake --build build/dev -j"$(nproc)"
ctest --preset dev
