// The flash MLA tree-verify kernel, portable path (mma.sync; sm_80, sm_90, sm_120 — the product's
// GPU): the product's instantiation of kernels/mla_verify_flash_portable.cuh, whose header states
// the math, tiling, schedule and shared-memory budget. plans/0027 has the measurements that chose
// this variant over the kernel it replaced (plans/0026's shipped one) and over the other variants.
#include "kernels/mla_verify_flash_portable.cuh"

namespace verifyd {
namespace {

template <portable::KvRows kRows>
__global__ void __launch_bounds__(kFlashThreads, 1) MlaVerifyFlashKernel(MlaVerifyParams params) {
  portable::PortableFlash<kRows>(params);
}

}  // namespace

int FlashSmemBytes() { return portable::kSmemBytes; }

const void* FlashKernelSymbol(bool fp8_rows) {
  return fp8_rows ? reinterpret_cast<const void*>(&MlaVerifyFlashKernel<portable::KvRows::kFp8>)
                  : reinterpret_cast<const void*>(&MlaVerifyFlashKernel<portable::KvRows::kBf16>);
}

cudaError_t LaunchFlashKernel(const MlaVerifyParams& params, cudaStream_t stream) {
  if (params.problem.kv_fp8 != nullptr) {
    MlaVerifyFlashKernel<portable::KvRows::kFp8>
        <<<params.num_work, kFlashThreads, portable::kSmemBytes, stream>>>(params);
  } else {
    MlaVerifyFlashKernel<portable::KvRows::kBf16>
        <<<params.num_work, kFlashThreads, portable::kSmemBytes, stream>>>(params);
  }
  return cudaGetLastError();
}

}  // namespace verifyd
