#!/usr/bin/env bash
# Draws every picture of plans/figures/ from the committed inputs into OUT_DIR (default:
# plans/figures itself). ctest tools.figures runs it into a scratch folder: the scripts and their
# inputs must keep working. Needs python3 with matplotlib (Debian's python3-matplotlib).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/plans/figures}
py=${PYTHON:-/usr/bin/python3}
mkdir -p "$out"
"$py" "$root/tools/figures/plot_bench.py" decode "$root/plans/figures/decode_step_latest.txt" \
  -o "$out/decode_step.png"
"$py" "$root/tools/figures/plot_bench.py" kernel "$root/plans/figures/kernel_bench_latest.txt" \
  -o "$out/kernel_floor.png"
"$py" "$root/tools/figures/handshake_diagram.py" -o "$out/handshake.png"
"$py" "$root/tools/figures/architecture_diagram.py" -o "$out/architecture.png"
for f in decode_step kernel_floor handshake architecture; do
  [[ -s "$out/$f.png" ]] || { echo "draw_all: $f.png not written" >&2; exit 1; }
done
echo "draw_all: 4 pictures in $out"
