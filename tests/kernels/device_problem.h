// Test helper: a HostProblem copied to the GPU, and the calls that run the flash or naive kernel on
// it and bring the outputs back. Output buffers are poisoned (0xFF bytes: bf16 and fp32 NaN) before
// every run, so an element a kernel forgets to write fails the error check.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/mla_verify_launch.h"
#include "kernels/split_planner.h"
#include "tests/testing/problem_builder.h"
#include "verify/verify_problem.h"

namespace verifyd::test {

// A cudaMalloc'ed buffer freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  ~DeviceBuffer() { cudaFree(ptr_); }
  absl::Status Allocate(size_t bytes);
  absl::Status Upload(const void* src, size_t bytes);
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

struct KernelOutput {
  std::vector<bf16_bits> out;
  std::vector<float> lse;
};

// A kernel's output as a reference for another's (the naive kernel's, where float64 is too slow).
struct Reference {
  std::vector<double> out, lse;
};
Reference AsReference(const KernelOutput& output);

class DeviceProblem {
 public:
  // fp8_pool: when set, the pool is these rows in the fp8 layout ([num_slots][656],
  // verify/kv_fp8_layout.h) instead of host.kv, and the device problem reads kv_fp8.
  static absl::StatusOr<DeviceProblem> Upload(HostProblem& host,
                                              const std::vector<uint8_t>* fp8_pool = nullptr);
  // The device-pointer view (kv, q, indices on the GPU; out and lse point at device buffers).
  const VerifyProblem& problem() const { return problem_; }
  // num_sms shapes the split plan; tests pass odd values to force many or no splits.
  // The flash kernel of `path` (kAuto: the launcher's choice) under the plan made for num_sms.
  absl::StatusOr<KernelOutput> RunFlash(int num_sms, FlashPath path = FlashPath::kAuto);
  absl::StatusOr<KernelOutput> RunNaive();

 private:
  absl::StatusOr<KernelOutput> Download();
  absl::Status PoisonOutputs();

  std::vector<int32_t> prefix_len_, q_len_;
  DeviceBuffer kv_, kv_fp8_, q_, out_, lse_, qo_indptr_, prefix_len_dev_, slot_indptr_, slots_,
      mask_indptr_, mask_bits_;
  VerifyProblem problem_;
};

// True when a CUDA device is visible; GPU tests GTEST_SKIP() otherwise.
bool HaveCudaDevice();

}  // namespace verifyd::test
