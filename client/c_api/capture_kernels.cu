#include "channel/step_area.h"
#include "client/c_api/capture_kernels.h"

namespace verifyd::c_api {
namespace {

constexpr int kThreads = 256;
constexpr uint16_t kBf16Nan = 0x7FC0;
// How many spins of WaitDone between reads of the area's epoch: the area is host memory (each
// read crosses PCIe / C2C), the done word device memory.
constexpr unsigned kEpochEvery = 32;
// WaitDone's longest nap between polls of done: the nap is latency added to every layer of the
// step (a wait that wakes up to 4 us late costs ~2 us a layer on average, 0.1 ms a step), and one
// thread polling a device word every quarter microsecond costs the device nothing measurable.
constexpr unsigned kLongestPauseNs = 256;

__device__ unsigned long long GlobalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ uint64_t AreaEpoch(const uint8_t* area) {
  return reinterpret_cast<const volatile channel::StepAreaHeader*>(area)->epoch;
}

// The whole block NaN-fills the outputs of a layer that will not be served.
__device__ void Poison(const CaptureKernelArgs& a) {
  for (uint64_t k = threadIdx.x; a.out != nullptr && k < a.out_elements; k += blockDim.x) {
    a.out[k] = kBf16Nan;
  }
  for (uint64_t k = threadIdx.x; a.lse != nullptr && k < a.lse_elements; k += blockDim.x) {
    a.lse[k] = __int_as_float(0x7FC00000);
  }
}

__global__ void StepPublishKernel(CaptureKernelArgs a, uint32_t max_batch, uint32_t max_q,
                                  uint64_t entry_bytes, StepTensorPointers t) {
  const int32_t n = *t.num_seqs;
  const uint32_t entries = n < 0 ? 0u : (static_cast<uint32_t>(n) < max_batch ? n : max_batch);
  for (uint32_t b = 0; b < entries; ++b) {
    channel::StepEntry* e = channel::StepEntryAt(a.area, entry_bytes, b);
    if (threadIdx.x == 0) {
      e->sequence_id = static_cast<uint64_t>(t.sequence_ids[b]);
      e->q_len = t.q_lens[b];
      e->commit_len = t.commit_lens[b];
    }
    int32_t* parents = channel::StepParents(e);
    int32_t* path = channel::StepPath(e, max_q);
    for (uint32_t k = threadIdx.x; k < max_q; k += blockDim.x) {
      parents[k] = t.parents[uint64_t{b} * max_q + k];
      path[k] = t.paths[uint64_t{b} * max_q + k];
    }
  }
  // Every thread's record writes reach the host before step_seq says the record is there.
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    auto* h = reinterpret_cast<volatile channel::StepAreaHeader*>(a.area);
    h->num_seqs = static_cast<uint32_t>(n);
    __threadfence_system();
    const unsigned long long step = a.state->step + 1;
    a.state->step = step;
    h->step_seq = step;
    __threadfence_system();
  }
}

__global__ void SignalReadyKernel(CaptureKernelArgs a, uint32_t i) {
  __shared__ unsigned error;
  if (threadIdx.x == 0) {
    volatile CaptureDeviceState* s = a.state;
    unsigned e = s->error;
    if (e == channel::kCaptureOk && AreaEpoch(a.area) != a.epoch) {
      e = channel::kCaptureEpochChanged;  // the capture ended: nobody waits for this flag
      s->error = e;
    }
    if (e == channel::kCaptureOk) {
      // q and tree_kv were written by earlier kernels of this stream: complete before this one.
      *reinterpret_cast<volatile uint32_t*>(a.ready) =
          channel::ReadyValue(s->step, a.num_layers, i);
      __threadfence_system();
    }
    error = e;
  }
  __syncthreads();
  if (error != channel::kCaptureOk) Poison(a);
}

__global__ void WaitDoneKernel(CaptureKernelArgs a, uint32_t i) {
  __shared__ unsigned error;
  if (threadIdx.x == 0) {
    volatile CaptureDeviceState* s = a.state;
    unsigned e = s->error;
    const uint32_t value = channel::ReadyValue(s->step, a.num_layers, i);
    const unsigned long long start = GlobalTimer();
    unsigned pause = 32;
    for (unsigned spin = 0; e == channel::kCaptureOk; ++spin) {
      if (channel::Reached(*reinterpret_cast<const volatile uint32_t*>(a.done), value)) break;
      if (spin % kEpochEvery == 0 && AreaEpoch(a.area) != a.epoch) {
        e = channel::kCaptureEpochChanged;  // the daemon ended the capture: done never comes
      } else if (GlobalTimer() - start > a.done_timeout_ns) {
        e = channel::kCaptureDoneTimeout;  // the daemon died mid-replay
      } else {
        __nanosleep(pause);
        pause = pause < kLongestPauseNs ? pause * 2 : pause;
      }
    }
    if (e != channel::kCaptureOk) s->error = e;
    // The daemon's writes of out (another process, same device) precede its done store.
    __threadfence();
    error = e;
  }
  __syncthreads();
  if (error != channel::kCaptureOk) Poison(a);
}

}  // namespace

cudaError_t LaunchStepPublish(cudaStream_t stream, const CaptureKernelArgs& args,
                              uint32_t max_batch, uint32_t max_q, uint64_t entry_bytes,
                              const StepTensorPointers& tensors) {
  StepPublishKernel<<<1, kThreads, 0, stream>>>(args, max_batch, max_q, entry_bytes, tensors);
  return cudaGetLastError();
}

cudaError_t LaunchSignalReady(cudaStream_t stream, const CaptureKernelArgs& args, uint32_t i) {
  SignalReadyKernel<<<1, kThreads, 0, stream>>>(args, i);
  return cudaGetLastError();
}

cudaError_t LaunchWaitDone(cudaStream_t stream, const CaptureKernelArgs& args, uint32_t i) {
  WaitDoneKernel<<<1, kThreads, 0, stream>>>(args, i);
  return cudaGetLastError();
}

}  // namespace verifyd::c_api
