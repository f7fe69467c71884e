#!/usr/bin/env bash
# Installs every Debian 12 package the project needs. Idempotent; works as root or through sudo.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libcaf-dev libssl-dev
  libtorch-dev libgloo-dev
  # Without OpenBLAS, LibTorch falls back to the reference BLAS: ~16x slower (measured).
  libopenblas0-openmp
  libcapnp-dev capnproto
  libtomlplusplus-dev
  doctest-dev
  nlohmann-json3-dev
  libspdlog-dev libfmt-dev
  libxxhash-dev
  libpcre2-dev
  libseccomp-dev
  python3
)

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "setup.sh: run as root or install sudo: apt needs root to install ${packages[*]}" >&2
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup.sh: all ${#packages[@]} packages already installed"
  exit 0
fi

echo "setup.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -q
"${as_root[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
