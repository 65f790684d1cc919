// Bulk tensor copies (TMA, sm_90) and the mbarriers they complete on, for the Hopper flash
// kernel's KV tiles that are one run of consecutive slots. Include only from files compiled for
// sm_90a. The tensor map itself is encoded on the host (kv_tile_map.h).
#pragma once

#include <cstdint>

namespace verifyd::tma {

__device__ __forceinline__ void MbarrierInit(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}

// Makes initialised mbarriers visible to the async proxy (the copies that complete on them).
__device__ __forceinline__ void FenceMbarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` of transactions still to come in this phase.
__device__ __forceinline__ void MbarrierArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Waits until the phase with parity `parity` of `bar` has completed; the copies that completed it
// are then visible to this thread.
__device__ __forceinline__ void MbarrierWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// Fetches the tensor map into the cache ahead of its first use.
__device__ __forceinline__ void PrefetchTensorMap(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// One box of a 2-D tensor map (a __grid_constant__ kernel parameter) at element coordinates
// (x inner, y outer) into shared memory at `dst`; completes its bytes on `bar`.
__device__ __forceinline__ void TensorCopy2d(uint32_t dst, const void* map, int x, int y,
                                             uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// A 2-D box multicast to the CTAs of this cluster in `cta_mask`: lands at the same shared-memory
// offset `dst` in each and completes its bytes on the mbarrier at the same offset `bar` in each.
__device__ __forceinline__ void TensorCopy2dMulticast(uint32_t dst, const void* map, int x, int y,
                                                      uint32_t bar, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar), "h"(cta_mask)
      : "memory");
}

// This CTA's rank in its cluster, and the cluster's size (1 when launched without clusters).
__device__ __forceinline__ uint32_t ClusterCtaRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t ClusterSize() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}

// One arrival, with release at cluster scope, on the mbarrier at offset `bar` of CTA `rank` of
// this cluster.
__device__ __forceinline__ void MbarrierArriveRemote(uint32_t bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(rank));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote)
               : "memory");
}

// MbarrierWait with acquire at cluster scope: what the arrivals of other CTAs ordered before them
// is ordered before what follows here.
__device__ __forceinline__ void MbarrierWaitCluster(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// Every thread of the cluster's CTAs: arrive (releasing what this thread wrote), then wait for all.
__device__ __forceinline__ void ClusterBarrierArrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void ClusterBarrierWait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

}  // namespace verifyd::tma
