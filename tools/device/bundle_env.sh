# Sourced by the GPU-machine scripts of tools/device (from the repository root): $OUT (results,
# created), $B (the collected build: $BUNDLE, default ./bundle), the library path (the bundle's
# libraries and the machine's cuBLAS), and the daemon binaries the service tests start.
OUT=${OUT:-/tmp/verifyd-gpu-out}
B=${BUNDLE:-bundle}
mkdir -p "$OUT"
cublas_dir=$(bash tools/device/cublas_dir.sh)
export LD_LIBRARY_PATH="$PWD/$B/lib${cublas_dir:+:$cublas_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export VERIFYD_BINARY="$PWD/$B/bin/verifyd"
export VERIFYD_DYING_CLIENT="$PWD/$B/bin/verifyd_dying_client"
