#!/usr/bin/env bash
# The portable flash kernel's sm_120 build (the product's GPU, RTX PRO 6000 Blackwell: 101,376 bytes
# of shared memory per block, 255 registers a thread), checked at every CUDA build without a GPU:
# ptxas's resource report for an sm_120 cubin of kernels/mla_verify_flash.cu compiled with the
# product's flags must show, for both instances (bf16 rows, fp8 rows), no spill and no stack frame, and static + dynamic shared memory must fit
# (the dynamic bytes are held under 101,376 by the kernel's own static_assert).
# Where cuobjdump is on the PATH (the GPU machine's image), the sm_120 SASS must also hold HMMA and
# none of the Hopper-only instructions (HGMMA, WARPGROUP). Usage: sm120_resources_test.sh NVCC SRC
set -euo pipefail
nvcc=$1
src=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$nvcc" -O3 -DNDEBUG -std=c++17 --expt-relaxed-constexpr -I"$src" -cubin -arch=sm_120 \
  -Xptxas -v "$src/kernels/mla_verify_flash.cu" -o "$out/flash.cubin" 2>"$out/ptxas.txt"
# One report per instance of the kernel (the bf16 pool's and the fp8 pool's): each must pass.
fail=0
kernels=0
regs_all=""
while IFS= read -r name; do
  report=$(grep -A3 "Compiling entry function '$name'" "$out/ptxas.txt" | tr '\n' ' ')
  echo "ptxas sm_120 $name: $report"
  spill=$(grep -oE "[0-9]+ bytes spill stores, [0-9]+ bytes spill loads" <<<"$report" | head -1)
  frame=$(grep -oE "[0-9]+ bytes stack frame" <<<"$report" | head -1 | grep -oE "^[0-9]+")
  regs=$(grep -oE "Used [0-9]+ registers" <<<"$report" | grep -oE "[0-9]+")
  static_smem=$(grep -oE "[0-9]+ bytes smem" <<<"$report" | grep -oE "^[0-9]+" || echo 0)
  [ "$spill" = "0 bytes spill stores, 0 bytes spill loads" ] || { echo "FAIL: spills ($spill)"; fail=1; }
  [ "${frame:-1}" = 0 ] || { echo "FAIL: stack frame of $frame bytes"; fail=1; }
  [ "${regs:-999}" -le 255 ] || { echo "FAIL: $regs registers"; fail=1; }
  [ $((static_smem)) -eq 0 ] || { echo "FAIL: $static_smem bytes of static shared memory beside the dynamic budget"; fail=1; }
  kernels=$((kernels + 1))
  regs_all="$regs_all ${regs}"
done < <(grep -oE "Compiling entry function '[^']*MlaVerifyFlashKernel[^']*'" "$out/ptxas.txt" |
  sed -E "s/^Compiling entry function '(.*)'$/\1/")
[ "$kernels" -eq 2 ] || { echo "FAIL: $kernels flash kernel instances in the report (bf16 and fp8 expected)"; fail=1; }
regs=${regs_all# }
if command -v cuobjdump >/dev/null; then
  cuobjdump -sass "$out/flash.cubin" >"$out/flash.sass"
  hmma=$(grep -c HMMA "$out/flash.sass" || true)
  hopper=$(grep -cE "HGMMA|WARPGROUP" "$out/flash.sass" || true)
  echo "sm_120 SASS: HMMA=$hmma Hopper-only=$hopper"
  [ "$hmma" -gt 0 ] && [ "$hopper" -eq 0 ] || { echo "FAIL: sm_120 SASS"; fail=1; }
else
  echo "cuobjdump not on the PATH: the SASS check runs on the GPU machine"
fi
((fail == 0)) && echo "PASS: sm_120 cubins (bf16, fp8) ${regs} registers, no spill, no static shared memory"
exit $fail
