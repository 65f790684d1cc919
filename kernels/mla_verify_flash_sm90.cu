// The product's instantiation of the Hopper flash kernel (mla_verify_flash_sm90.cuh states its
// math, tiling, schedule and shared-memory budget) and its launch. Compiled for sm_90a alone.
#include "kernels/kv_tile_map.h"
#include "kernels/mla_verify_flash_sm90.cuh"

namespace verifyd {

using flash_sm90::MlaVerifyFlashSm90Kernel;
using flash_sm90::NoProbe;

int HopperFlashSmemBytes() { return flash_sm90::kSmemBytes; }

const void* HopperFlashKernelSymbol() {
  return reinterpret_cast<const void*>(&MlaVerifyFlashSm90Kernel<NoProbe>);
}

cudaError_t LaunchHopperFlashKernel(const MlaVerifyParams& params, cudaStream_t stream) {
  const KvTileMap kv_map = EncodeKvTileMap(params.problem.kv, params.problem.num_slots);
  const KvTileMap q_map = EncodeQTileMap(
      params.problem.q, static_cast<int64_t>(params.problem.total_q) * params.problem.num_heads);
  MlaVerifyFlashSm90Kernel<NoProbe>
      <<<params.num_work, kHopperFlashThreads, flash_sm90::kSmemBytes, stream>>>(params, kv_map,
                                                                                 q_map, nullptr);
  return cudaGetLastError();
}

}  // namespace verifyd
