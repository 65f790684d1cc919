#include "tests/kernels/device_problem.h"

#include <utility>

#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/mla_verify_launch.h"
#include "verify/bf16.h"
#include "verify/mla_dims.h"

namespace verifyd::test {
namespace {

template <typename T>
absl::Status UploadVector(DeviceBuffer& buffer, const std::vector<T>& v) {
  // At least one byte, so an empty array still has a valid (never read) device address.
  VERIFYD_RETURN_IF_ERROR(buffer.Allocate(std::max<size_t>(v.size() * sizeof(T), 16)));
  if (!v.empty()) return buffer.Upload(v.data(), v.size() * sizeof(T));
  return absl::OkStatus();
}

}  // namespace

Reference AsReference(const KernelOutput& output) {
  Reference ref;
  ref.out.reserve(output.out.size());
  for (bf16_bits x : output.out) ref.out.push_back(Bf16ToFloat(x));
  ref.lse.assign(output.lse.begin(), output.lse.end());
  return ref;
}

absl::Status DeviceBuffer::Allocate(size_t bytes) {
  cudaFree(ptr_);
  ptr_ = nullptr;
  VERIFYD_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  bytes_ = bytes;
  return absl::OkStatus();
}

absl::Status DeviceBuffer::Upload(const void* src, size_t bytes) {
  VERIFYD_CUDA_CHECK(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

bool HaveCudaDevice() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

absl::StatusOr<DeviceProblem> DeviceProblem::Upload(HostProblem& host,
                                                    const std::vector<uint8_t>* fp8_pool) {
  DeviceProblem d;
  if (fp8_pool != nullptr) {
    VERIFYD_RETURN_IF_ERROR(UploadVector(d.kv_fp8_, *fp8_pool));
  } else {
    VERIFYD_RETURN_IF_ERROR(UploadVector(d.kv_, host.kv));
  }
  VERIFYD_RETURN_IF_ERROR(UploadVector(d.q_, host.q));
  VERIFYD_RETURN_IF_ERROR(UploadVector(d.qo_indptr_, host.qo_indptr));
  VERIFYD_RETURN_IF_ERROR(UploadVector(d.prefix_len_dev_, host.prefix_len));
  VERIFYD_RETURN_IF_ERROR(UploadVector(d.slot_indptr_, host.slot_indptr));
  VERIFYD_RETURN_IF_ERROR(UploadVector(d.slots_, host.slots));
  VERIFYD_RETURN_IF_ERROR(UploadVector(d.mask_indptr_, host.mask_indptr));
  VERIFYD_RETURN_IF_ERROR(UploadVector(d.mask_bits_, host.mask_bits));
  VERIFYD_RETURN_IF_ERROR(d.out_.Allocate(host.out.size() * sizeof(bf16_bits)));
  VERIFYD_RETURN_IF_ERROR(d.lse_.Allocate(host.lse.size() * sizeof(float)));
  d.prefix_len_ = host.prefix_len;
  for (int b = 0; b < host.batch(); ++b)
    d.q_len_.push_back(host.qo_indptr[b + 1] - host.qo_indptr[b]);
  VerifyProblem p = host.problem();
  p.kv = static_cast<const bf16_bits*>(d.kv_.get());
  p.kv_fp8 = static_cast<const uint8_t*>(d.kv_fp8_.get());
  p.q = static_cast<const bf16_bits*>(d.q_.get());
  p.out = static_cast<bf16_bits*>(d.out_.get());
  p.lse = static_cast<float*>(d.lse_.get());
  p.qo_indptr = static_cast<const int32_t*>(d.qo_indptr_.get());
  p.prefix_len = static_cast<const int32_t*>(d.prefix_len_dev_.get());
  p.slot_indptr = static_cast<const int32_t*>(d.slot_indptr_.get());
  p.slots = static_cast<const int32_t*>(d.slots_.get());
  p.mask_indptr = static_cast<const int32_t*>(d.mask_indptr_.get());
  p.mask_bits = static_cast<const uint64_t*>(d.mask_bits_.get());
  d.problem_ = p;
  return d;
}

absl::Status DeviceProblem::PoisonOutputs() {
  VERIFYD_CUDA_CHECK(cudaMemset(out_.get(), 0xFF, out_.bytes()));
  VERIFYD_CUDA_CHECK(cudaMemset(lse_.get(), 0xFF, lse_.bytes()));
  return absl::OkStatus();
}

absl::StatusOr<KernelOutput> DeviceProblem::Download() {
  VERIFYD_CUDA_CHECK(cudaDeviceSynchronize());
  KernelOutput result;
  result.out.resize(out_.bytes() / sizeof(bf16_bits));
  result.lse.resize(lse_.bytes() / sizeof(float));
  VERIFYD_CUDA_CHECK(
      cudaMemcpy(result.out.data(), out_.get(), out_.bytes(), cudaMemcpyDeviceToHost));
  VERIFYD_CUDA_CHECK(
      cudaMemcpy(result.lse.data(), lse_.get(), lse_.bytes(), cudaMemcpyDeviceToHost));
  return result;
}

absl::StatusOr<KernelOutput> DeviceProblem::RunFlash(int num_sms, FlashPath path) {
  VERIFYD_ASSIGN_OR_RETURN(SplitPlan plan,
                           PlanSplits(prefix_len_, q_len_, problem_.num_heads, num_sms));
  const WorkspaceLayout layout = LayoutWorkspace(plan);
  DeviceBuffer workspace;
  VERIFYD_RETURN_IF_ERROR(workspace.Allocate(layout.total_bytes));
  // Poison the partials too: a split that leaves a row unwritten must show up as NaN.
  VERIFYD_CUDA_CHECK(cudaMemset(workspace.get(), 0xFF, layout.total_bytes));
  VERIFYD_RETURN_IF_ERROR(PoisonOutputs());
  VERIFYD_RETURN_IF_ERROR(UploadPlan(plan, layout, workspace.get(), nullptr));
  VERIFYD_RETURN_IF_ERROR(LaunchMlaVerify(problem_, plan, layout, workspace.get(), nullptr,
                                          VerifyStages::kFlashAndCombine, path));
  return Download();
}

absl::StatusOr<KernelOutput> DeviceProblem::RunNaive() {
  VERIFYD_RETURN_IF_ERROR(PoisonOutputs());
  VERIFYD_RETURN_IF_ERROR(LaunchMlaVerifyNaive(problem_, nullptr));
  return Download();
}

}  // namespace verifyd::test
