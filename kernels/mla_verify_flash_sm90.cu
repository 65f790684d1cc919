// The product's instantiations of the Hopper flash kernel (mla_verify_flash_sm90.cuh states its
// math, tiling, schedule and shared-memory budget; mla_verify_flash_sm90_fp8_load.cuh the fp8
// pool's load stage) and their launch. Compiled for sm_90a alone.
#include "kernels/kv_tile_map.h"
#include "kernels/mla_verify_flash_sm90.cuh"

namespace verifyd {

using flash_sm90::MlaVerifyFlashSm90Kernel;
using flash_sm90::NoProbe;

int HopperFlashSmemBytes() { return flash_sm90::kSmemBytes; }

const void* HopperFlashKernelSymbol(bool fp8_rows) {
  return fp8_rows ? reinterpret_cast<const void*>(&MlaVerifyFlashSm90Kernel<NoProbe, Fp8KvTileMaps>)
                  : reinterpret_cast<const void*>(&MlaVerifyFlashSm90Kernel<NoProbe, KvTileMap>);
}

cudaError_t LaunchHopperFlashKernel(const MlaVerifyParams& params, cudaStream_t stream) {
  const VerifyProblem& pr = params.problem;
  const KvTileMap q_map = EncodeQTileMap(pr.q, static_cast<int64_t>(pr.total_q) * pr.num_heads);
  if (pr.kv_fp8 != nullptr) {
    const Fp8KvTileMaps kv_maps = EncodeFp8KvTileMaps(pr.kv_fp8, pr.num_slots);
    MlaVerifyFlashSm90Kernel<NoProbe, Fp8KvTileMaps>
        <<<params.num_work, kHopperFlashThreads, flash_sm90::kSmemBytes, stream>>>(params, kv_maps,
                                                                                   q_map, nullptr);
  } else {
    const KvTileMap kv_map = EncodeKvTileMap(pr.kv, pr.num_slots);
    MlaVerifyFlashSm90Kernel<NoProbe, KvTileMap>
        <<<params.num_work, kHopperFlashThreads, flash_sm90::kSmemBytes, stream>>>(params, kv_map,
                                                                                   q_map, nullptr);
  }
  return cudaGetLastError();
}

}  // namespace verifyd
