#!/usr/bin/env bash
# Downloads the .deb files bench/gpu/check.sh unpacks (packages.txt) into
# bench/gpu/debs/ (kept out of git). Run it on a Debian 12 machine with the
# archive (this project's development machine), then bring the folder to the
# GPU machine with the checkout. Usage: bash bench/gpu/fetch-debs.sh [DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/debs}"
mkdir -p "$out"
mapfile -t packages < <(grep -v '^\s*\(#\|$\)' "$here/packages.txt")
if ! grep -q 'VERSION_ID="12"' /etc/os-release 2>/dev/null; then
  echo "fetch-debs.sh: this is not Debian 12; the packages must be Debian 12's (bookworm)" >&2
  exit 2
fi
cd "$out"
# apt-get download writes into the current folder; as root it warns that _apt cannot write there.
apt-get download "${packages[@]}" 2>&1 | grep -v "couldn't be accessed by user '_apt'" || true
missing=()
for p in "${packages[@]}"; do
  compgen -G "$out/${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "fetch-debs.sh: not downloaded: ${missing[*]} (run apt-get update first?)" >&2
  exit 1
fi
echo "fetch-debs.sh: ${#packages[@]} packages, $(du -sh "$out" | cut -f1), in $out"
