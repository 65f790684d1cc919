// The three kernels a captured decode step runs (plans/0033; the protocol: channel/step_area.h),
// launched on the capturing stream so that a CUDA graph records them: their values (the step
// counter, each layer's ready / done value) live in device memory and move with every replay,
// where a captured stream memory operation would freeze the value it was recorded with.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace verifyd::c_api {

// The engine's side of one capture in device memory: the step counter StepPublish advances and
// the fault word (channel::CaptureError) SignalReady / WaitDone set.
struct CaptureDeviceState {
  unsigned long long step;
  unsigned int error;
  unsigned int reserved;
};

// Device pointers to the engine's tensors (vd_step_tensors).
struct StepTensorPointers {
  const int32_t* num_seqs;
  const int64_t* sequence_ids;
  const int32_t* q_lens;
  const int32_t* parents;      // [max_batch][max_q]
  const int32_t* commit_lens;  // -1: nothing rides
  const int32_t* paths;        // [max_batch][max_q]
};

// What the kernels of one capture need (fixed at capture time).
struct CaptureKernelArgs {
  uint8_t* area = nullptr;  // the step area's device address (cudaHostGetDevicePointer)
  CaptureDeviceState* state = nullptr;
  uint64_t epoch = 0;  // the epoch PrepareCapture gave: the area's must still hold it
  uint32_t num_layers = 0;
  uint32_t* ready = nullptr;
  const uint32_t* done = nullptr;
  uint16_t* out = nullptr;  // NaN-filled on a fault
  uint64_t out_elements = 0;
  float* lse = nullptr;
  uint64_t lse_elements = 0;
  uint64_t done_timeout_ns = 0;
};

// One block each. StepPublish copies the record (at most max_batch entries of max_q nodes),
// then stores num_seqs, fences (system scope) and stores the new step_seq last.
cudaError_t LaunchStepPublish(cudaStream_t stream, const CaptureKernelArgs& args,
                              uint32_t max_batch, uint32_t max_q, uint64_t entry_bytes,
                              const StepTensorPointers& tensors);
cudaError_t LaunchSignalReady(cudaStream_t stream, const CaptureKernelArgs& args, uint32_t i);
cudaError_t LaunchWaitDone(cudaStream_t stream, const CaptureKernelArgs& args, uint32_t i);

}  // namespace verifyd::c_api
