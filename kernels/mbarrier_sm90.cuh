// mbarriers and register reallocation (sm_90) for the Hopper flash kernel's producer and consumer
// warpgroups: initialise, arrive (plainly, or once this thread's cp.async copies have landed),
// wait for a phase, and setmaxnreg. Include only from files compiled for sm_90a.
#pragma once

#include <cstdint>

namespace verifyd::mbarrier {

// `arrivals` arrivals complete each phase. Visible to the CTA after a barrier.
__device__ __forceinline__ void Init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}

__device__ __forceinline__ void Arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// One of the phase's arrivals, made when every cp.async this thread issued before it has landed
// (.noinc: Init counted it).
__device__ __forceinline__ void ArriveOnCpAsyncDone(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Waits until the phase with parity `parity` has completed.
__device__ __forceinline__ void Wait(uint32_t bar, uint32_t parity) {
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

// This warpgroup's registers per thread from here on (every thread of the warpgroup executes it).
template <int kRegisters, bool kIncrease>
__device__ __forceinline__ void SetMaxRegisters() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg range");
  if constexpr (kIncrease) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
  }
}

}  // namespace verifyd::mbarrier
