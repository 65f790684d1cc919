// Programmatic dependent launch (compute capability 9.0 and later) for the verify kernels. Only the
// combine is launched this way: it may then be scheduled while the flash kernel before it is still
// finishing, so its CTAs take each SM as soon as the flash CTA there exits instead of after the
// whole flash grid has drained and the launch has been processed (plans/0004, v30: -1.5 us per
// call at S1 and SH on the H200). The flash kernels are launched as usual: launching them this way
// as well gained nothing measurable.
//
// The contract that keeps it correct: a kernel launched with the attribute calls WaitForPriorGrid()
// before its first read of device memory, which blocks until every earlier kernel in the stream
// has completed and its writes are visible. AllowDependentLaunch() lets such a successor be
// scheduled early (the flash kernels call it first thing; the combine after its wait). A kernel
// launched without the attribute is ordered as usual whatever its predecessor calls, so a
// caller's own kernels are unaffected. Stream capture keeps the dependency as a programmatic graph
// edge. Device code for sm_80 compiles both calls to nothing; LaunchMaybeProgrammatic sets the
// attribute only where the caller says the device has it.
#pragma once

#include <cuda_runtime.h>

namespace verifyd::pdl {

__device__ __forceinline__ void WaitForPriorGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem_bytes, stream>>>(args...), with the programmatic-serialisation
// attribute when `programmatic` (compute capability >= 9: the launcher decides once per device).
template <typename... Params, typename... Args>
cudaError_t LaunchMaybeProgrammatic(void (*kernel)(Params...), dim3 grid, dim3 block,
                                    size_t smem_bytes, cudaStream_t stream, bool programmatic,
                                    Args&&... args) {
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = programmatic ? attribute : nullptr;
  config.numAttrs = programmatic ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Args&&>(args)...);
}

}  // namespace verifyd::pdl
