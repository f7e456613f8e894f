#!/usr/bin/env bash
# Installs everything refit needs to build and test, from Debian's archive.
# Idempotent: when every package is present it changes nothing. Runs as root
# (or through sudo when available) on Debian bookworm.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libxxhash-dev        # XXH3-128 range hashes
  libzstd-dev          # zstd planes in dense chunks, baselines
  liblz4-dev           # the LZ4 baseline of `refit bench peers`
  nlohmann-json3-dev   # safetensors headers, --json output
  libcli11-dev         # command line parsing
  libfmt-dev           # formatting
  libssl-dev           # SHA-256, HMAC, Ed25519 signatures, TLS on relay links
  libcurl4-openssl-dev # S3-compatible object stores
  libasio-dev          # relay tree over TCP (standalone, header-only)
  libgtest-dev libgmock-dev  # unit tests
  libbenchmark-dev     # micro-benchmarks
  python3              # test helpers
  python3-dev pybind11-dev       # the Python package (bindings)
  python3-numpy python3-pytest   # Python tests
  python3-torch        # PyTorch tensors and torch.distributed (gloo) in the Python tests
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
