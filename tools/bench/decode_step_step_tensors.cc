#include "tools/bench/decode_step_step_tensors.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/align.h"
#include "base/cuda_check.h"

namespace verifyd::decode_step {
namespace {

// A slot's layout for a bucket of one sequence (vd_step_tensors' six tensors):
// num_seqs int32 | sequence_ids int64 [1] | q_lens int32 [1] | commit_lens int32 [1] |
// parents int32 [max_q] | paths int32 [max_q].
constexpr size_t kNumSeqs = 0, kSequenceIds = 8, kQLens = 16, kCommitLens = 20, kParents = 32;
size_t PathsAt(int max_q) { return kParents + 4 * static_cast<size_t>(max_q); }

template <typename T>
void Put(uint8_t* slot, size_t at, T value) {
  std::memcpy(slot + at, &value, sizeof(value));
}

}  // namespace

StepTensors::~StepTensors() {
  cudaFreeHost(host_);
  cudaFree(device_);
}

absl::Status StepTensors::Init(int max_q, int slots) {
  if (max_q < 1 || slots < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("StepTensors: max_q ", max_q, ", slots ", slots));
  }
  max_q_ = max_q;
  slots_ = slots;
  stride_ = AlignTo256(PathsAt(max_q) + 4 * static_cast<size_t>(max_q));
  VERIFYD_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_), stride_ * slots));
  std::memset(host_, 0, stride_ * slots);
  VERIFYD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_), stride_));
  VERIFYD_CUDA_CHECK(cudaMemset(device_, 0, stride_));
  return absl::OkStatus();
}

absl::Status StepTensors::Fill(int slot, uint64_t sequence, const std::vector<int32_t>& parents,
                               const std::optional<std::vector<int32_t>>& commit) {
  if (slot < 0 || slot >= slots_ || parents.empty() || static_cast<int>(parents.size()) > max_q_ ||
      (commit.has_value() && static_cast<int>(commit->size()) > max_q_)) {
    return absl::InvalidArgumentError(absl::StrCat("StepTensors::Fill: slot ", slot, " of ", slots_,
                                                   ", ", parents.size(), " nodes, a path of ",
                                                   commit.has_value() ? commit->size() : 0,
                                                   " (bucket: ", max_q_, " nodes)"));
  }
  uint8_t* s = host_ + stride_ * slot;
  std::memset(s, 0, stride_);
  Put<int32_t>(s, kNumSeqs, 1);
  Put<int64_t>(s, kSequenceIds, static_cast<int64_t>(sequence));
  Put<int32_t>(s, kQLens, static_cast<int32_t>(parents.size()));
  // -1: nothing rides (vd_step_tensors: commit_lens).
  Put<int32_t>(s, kCommitLens, commit.has_value() ? static_cast<int32_t>(commit->size()) : -1);
  std::memcpy(s + kParents, parents.data(), parents.size() * 4);
  if (commit.has_value() && !commit->empty()) {
    std::memcpy(s + PathsAt(max_q_), commit->data(), commit->size() * 4);
  }
  return absl::OkStatus();
}

absl::Status StepTensors::Upload(int slot, cudaStream_t stream) const {
  if (slot < 0 || slot >= slots_) {
    return absl::OutOfRangeError(absl::StrCat("StepTensors::Upload: slot ", slot, " of ", slots_));
  }
  VERIFYD_CUDA_CHECK(
      cudaMemcpyAsync(device_, host_ + stride_ * slot, stride_, cudaMemcpyHostToDevice, stream));
  return absl::OkStatus();
}

vd_step_tensors StepTensors::pointers() const {
  const auto at = [&](size_t offset) { return reinterpret_cast<uint64_t>(device_ + offset); };
  return vd_step_tensors{at(kNumSeqs), at(kSequenceIds), at(kQLens),
                         at(kParents), at(kCommitLens),  at(PathsAt(max_q_))};
}

}  // namespace verifyd::decode_step
