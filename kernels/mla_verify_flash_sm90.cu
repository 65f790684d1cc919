// The product's instantiation of the Hopper flash kernel (mla_verify_flash_sm90.cuh states its
// math, tiling, schedule and shared-memory budget) and its launch. Compiled for sm_90a alone.
#include <cuda_runtime.h>

#include "kernels/mla_verify_flash_sm90.cuh"

namespace verifyd {

using flash_sm90::MlaVerifyFlashSm90Kernel;
using flash_sm90::Sm90Probe;

int HopperFlashSmemBytes() { return flash_sm90::kSmemBytes; }

const void* HopperFlashKernelSymbol() {
  return reinterpret_cast<const void*>(&MlaVerifyFlashSm90Kernel<Sm90Probe::kNone>);
}

cudaError_t LaunchHopperFlashKernel(const MlaVerifyParams& params, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(params.num_work);
  config.blockDim = dim3(kHopperFlashThreads);
  config.dynamicSmemBytes = flash_sm90::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute cooperative = {};
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = params.fused_combine;
  config.attrs = &cooperative;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, &MlaVerifyFlashSm90Kernel<Sm90Probe::kNone>, params,
                            static_cast<uint64_t*>(nullptr));
}

}  // namespace verifyd
