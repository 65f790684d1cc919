#!/usr/bin/env bash
# Copies the non-system shared libraries that FILE... need (ldd: everything but glibc, the C++
# runtime and CUDA's own libraries, which the target machine's image provides) into DEST. Used by
# tools/device/make_bundle.sh (the bundle's lib/ and pylib/) and python/build_wheel.sh (the wheel).
# usage: tools/collect_libs.sh DEST FILE...
set -euo pipefail
dest=$1; shift
mkdir -p "$dest"
system='/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt)\.so'
for file in "$@"; do
  ldd "$file" | awk '/=> \//{print $3}' | { grep -Ev "$system" || true; } | while read -r lib; do
    cp -Ln "$lib" "$dest/" 2>/dev/null || true
  done
done
