#include "backend/cuda/cuda_value_check.h"

#include <utility>

#include "kernels/value_bound_check.h"
#include "verify/value_bound.h"

namespace verifyd {

CudaValueCheck::CudaValueCheck(int device, cudaEvent_t event, const unsigned long long* words,
                               std::vector<int64_t> q_shape, std::vector<int64_t> tree_kv_shape)
    : device_(device),
      event_(event),
      words_(words),
      q_shape_(std::move(q_shape)),
      tree_kv_shape_(std::move(tree_kv_shape)) {}

std::optional<absl::Status> CudaValueCheck::Poll() {
  std::lock_guard<std::mutex> lock(mu_);
  if (answer_) return answer_;
  if (cudaSetDevice(device_) != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  const cudaError_t state = cudaEventQuery(event_);
  if (state == cudaErrorNotReady) {
    cudaGetLastError();
    return std::nullopt;
  }
  if (state != cudaSuccess) {
    cudaGetLastError();
    answer_ = absl::InternalError(
        absl::StrCat("the device's value check could not be read: ", cudaGetErrorString(state)));
    return answer_;
  }
  answer_ = ReadLocked();
  return answer_;
}

absl::Status CudaValueCheck::Wait() {
  std::lock_guard<std::mutex> lock(mu_);
  if (answer_) return *answer_;
  cudaError_t state = cudaSetDevice(device_);
  if (state == cudaSuccess) state = cudaEventSynchronize(event_);
  if (state != cudaSuccess) {
    cudaGetLastError();
    answer_ = absl::InternalError(
        absl::StrCat("the device's value check could not be read: ", cudaGetErrorString(state)));
    return *answer_;
  }
  answer_ = ReadLocked();
  return *answer_;
}

void CudaValueCheck::Settle() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!answer_) answer_ = ReadLocked();
}

absl::Status CudaValueCheck::ReadLocked() {
  // q is checked first, as on the gRPC path (value_bound.h): its error names q when both are bad.
  if (words_[0] != kNoneOutOfBound) {
    return OutOfBoundError(q_shape_, OutOfBoundIndex(words_[0]), OutOfBoundBits(words_[0]), "q");
  }
  if (words_[1] != kNoneOutOfBound) {
    return OutOfBoundError(tree_kv_shape_, OutOfBoundIndex(words_[1]), OutOfBoundBits(words_[1]),
                           "tree_kv");
  }
  return absl::OkStatus();
}

}  // namespace verifyd
