// The product's instantiation of the Hopper flash kernel (mla_verify_flash_sm90.cuh states its
// math, tiling, schedule and shared-memory budget) and its launch. Compiled for sm_90a alone.
#include "kernels/mla_verify_flash_sm90.cuh"
#ifndef VERIFYD_V30_PDL
#define VERIFYD_V30_PDL 0
#endif

namespace verifyd {

using flash_sm90::MlaVerifyFlashSm90Kernel;
using flash_sm90::Sm90Probe;

int HopperFlashSmemBytes() { return flash_sm90::kSmemBytes; }

const void* HopperFlashKernelSymbol() {
  return reinterpret_cast<const void*>(&MlaVerifyFlashSm90Kernel<Sm90Probe::kNone>);
}

void LaunchHopperFlashKernel(const MlaVerifyParams& params, cudaStream_t stream) {
#if VERIFYD_V30_PDL
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(params.num_work);
  cfg.blockDim = dim3(kHopperFlashThreads);
  cfg.dynamicSmemBytes = flash_sm90::kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaLaunchKernelEx(&cfg, MlaVerifyFlashSm90Kernel<Sm90Probe::kNone>, params,
                     static_cast<uint64_t*>(nullptr));
#else
  MlaVerifyFlashSm90Kernel<Sm90Probe::kNone>
      <<<params.num_work, kHopperFlashThreads, flash_sm90::kSmemBytes, stream>>>(params, nullptr);
#endif
}

}  // namespace verifyd
