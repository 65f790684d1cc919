#!/usr/bin/env bash
# Builds the verifyd wheel that installs in an engine's image (SPEC §4): the package with its
# generated gRPC stubs, and libverifyd_dataplane.so beside it in verifyd/ with the non-system
# shared libraries it needs (gRPC, protobuf, abseil, ...; found through its RPATH $ORIGIN, so the
# engine's process keeps its own LD_LIBRARY_PATH). Tagged py3-none-<platform>: the library is a C
# ABI loaded with ctypes, so one wheel serves every CPython 3.9+; nothing is compiled at install:
#   pip install --no-deps verifyd-*.whl
# Builds offline (no build isolation) with the first of $VERIFYD_PYTHON, /usr/bin/python3 and
# python3 that has pip, setuptools and wheel (Debian: python3-pip, python3-setuptools, python3-wheel).
# usage: python/build_wheel.sh [--lib LIBRARY] [--out DIR]
#   --lib  the data-plane library to carry (default: build/client/c_api/libverifyd_dataplane.so;
#          for GPU hosts the CUDA build, as tools/device/make_bundle.sh passes it)
#   --out  where the wheel goes (default: dist/)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
lib="$repo/build/client/c_api/libverifyd_dataplane.so"
out="$repo/dist"
while (($#)); do
  case "$1" in
    --lib) lib=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "build_wheel.sh: unknown argument $1 (usage: --lib LIBRARY --out DIR)" >&2; exit 2 ;;
  esac
done
[[ -f "$lib" ]] || { echo "build_wheel.sh: $lib not found (build the verifyd_dataplane target)" >&2; exit 1; }
readelf -d "$lib" | grep -Eq 'R(UN)?PATH.*\$ORIGIN' ||
  { echo "build_wheel.sh: $lib has no RPATH \$ORIGIN: its libraries would not be found" >&2; exit 1; }
py=""
for candidate in ${VERIFYD_PYTHON:-} /usr/bin/python3 "$(command -v python3 || true)"; do
  [[ -n "$candidate" && -x "$candidate" ]] || continue
  if "$candidate" -c "import setuptools, wheel, pip" 2>/dev/null; then py=$candidate; break; fi
done
[[ -n "$py" ]] || { echo "build_wheel.sh: no python3 with pip, setuptools and wheel (apt-get install python3-pip python3-wheel)" >&2; exit 1; }
mkdir -p "$out"
out="$(cd "$out" && pwd)"
# A copy of the package to build from: the library goes into it, the checkout stays as it is.
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
tar -C "$repo/python" --exclude=__pycache__ --exclude='*.so*' -cf - verifyd pyproject.toml setup.py \
  build_stubs.sh | tar -C "$stage" -xf -
bash "$repo/python/build_stubs.sh" "$stage"
cp -L "$lib" "$stage/verifyd/libverifyd_dataplane.so"
bash "$repo/tools/collect_libs.sh" "$stage/verifyd" "$lib"
"$py" -m pip wheel --quiet --no-build-isolation --no-deps --no-index -w "$out" "$stage"
wheel=$(ls -t "$out"/verifyd-*.whl | head -1)
echo "$wheel ($(du -h "$wheel" | cut -f1); $(ls "$stage/verifyd" | grep -c '\.so') shared libraries)"
