// The product's instantiation of the portable flash kernel (mla_verify_flash_portable.cuh states
// its math, tiling, schedule and shared-memory budget) and its launch: built for sm_80, sm_90 and
// sm_120. Which schedule ships was decided by the benchmark's variants on the H200
// (plans/0026-portable-kernel.md).
#include "kernels/mla_verify_flash_portable.cuh"

namespace verifyd {
namespace {

using ProductKernel = flash_portable::PortableKernel<32, true>;
constexpr int kProductCols = 32;

}  // namespace

int FlashSmemBytes() { return flash_portable::kSmemBytes<kProductCols>; }

const void* FlashKernelSymbol() { return ProductKernel::Symbol(); }

cudaError_t LaunchFlashKernel(const MlaVerifyParams& params, cudaStream_t stream) {
  return ProductKernel::Launch(params, stream);
}

}  // namespace verifyd
