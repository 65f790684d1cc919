// Thread-block-cluster building blocks (sm_90) for the Hopper flash kernel: the CTA's rank in its
// cluster, a peer CTA's address of a shared-memory location, mbarriers (local waits, remote
// arrivals, transaction counts), the bulk copy from this CTA's shared memory into a peer's, and the
// cluster barrier. Include only from files compiled for sm_90a.
#pragma once

#include <cstdint>

namespace verifyd::cluster {

__device__ __forceinline__ uint32_t CtaRank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// The shared::cluster address of `local_addr` (a shared::cta address of this CTA) in CTA `rank`.
__device__ __forceinline__ uint32_t PeerAddress(uint32_t local_addr, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local_addr), "r"(rank));
  return remote;
}

__device__ __forceinline__ void MbarrierInit(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}

// Makes the initialised mbarriers visible to the other CTAs of the cluster (before they arrive).
__device__ __forceinline__ void FenceMbarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` of transactions still to come in this phase.
__device__ __forceinline__ void MbarrierArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// One arrival on an mbarrier of another CTA (`remote_bar` from PeerAddress), releasing this
// thread's prior accesses at cluster scope.
__device__ __forceinline__ void MbarrierArriveRemote(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar)
               : "memory");
}

// Waits until the phase with parity `parity` of a local mbarrier has completed; acquires at
// cluster scope (the arrivals may come from a peer CTA).
__device__ __forceinline__ void MbarrierWait(uint32_t bar, uint32_t parity) {
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

// Copies `bytes` (a multiple of 16) from this CTA's shared memory to a peer's (`remote_dst`), and
// completes that many transaction bytes on the peer's mbarrier `remote_bar` once they have landed.
__device__ __forceinline__ void BulkCopyToPeer(uint32_t remote_dst, uint32_t local_src,
                                               uint32_t bytes, uint32_t remote_bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, "
      "[%3];\n" ::"r"(remote_dst),
      "r"(local_src), "r"(bytes), "r"(remote_bar)
      : "memory");
}

// Every thread of every CTA of the cluster arrives (release) and, at Wait, waits (acquire).
__device__ __forceinline__ void BarrierArrive() {
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
}
__device__ __forceinline__ void BarrierWait() {
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}

}  // namespace verifyd::cluster
