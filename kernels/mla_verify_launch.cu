#include "kernels/mla_verify_launch.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "kernels/mla_verify_kernels.h"

namespace verifyd {
namespace {

absl::Status CheckProblemShape(const VerifyProblem& p) {
  if ((p.kv == nullptr && p.kv_fp8 == nullptr) || p.q == nullptr || p.out == nullptr ||
      p.qo_indptr == nullptr || p.prefix_len == nullptr || p.slot_indptr == nullptr ||
      p.slots == nullptr || p.mask_indptr == nullptr || p.mask_bits == nullptr) {
    return absl::InvalidArgumentError(
        "problem: kv (or kv_fp8), q, out, qo_indptr, prefix_len, slot_indptr, slots, "
        "mask_indptr and mask_bits must all be set");
  }
  if (p.num_heads < 1)
    return absl::InvalidArgumentError(absl::StrCat("num_heads = ", p.num_heads, " must be >= 1"));
  if (p.batch < 1)
    return absl::InvalidArgumentError(absl::StrCat("batch = ", p.batch, " must be >= 1"));
  if (p.total_q < p.batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("total_q = ", p.total_q, " must be >= batch = ", p.batch));
  }
  if (p.num_slots < 1)
    return absl::InvalidArgumentError(absl::StrCat("num_slots = ", p.num_slots, " must be >= 1"));
  return absl::OkStatus();
}

// The Hopper kernel is used only where it can run: device major 9 and an sm_90a image in this
// library (cudaFuncGetAttributes fails when no image fits the device). Kill switch: if the wgmma
// path ever misbehaves, set this to false and kAuto gives every caller the portable kernel.
constexpr bool kHopperPathEnabled = true;

// A yes/no about the current device, decided once per device (0 unknown, 1 no, 2 yes). The checks
// are not stream operations, so they are legal during graph capture too.
template <typename Decide>
bool OncePerDevice(std::atomic<int8_t> (&known)[64], Decide decide) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return false;
  int8_t answer = known[device].load(std::memory_order_relaxed);
  if (answer == 0) {
    answer = decide(device) ? 2 : 1;
    known[device].store(answer, std::memory_order_relaxed);
  }
  return answer == 2;
}

bool HopperImageRunsHere() {
  static std::atomic<int8_t> known[64] = {};
  return OncePerDevice(known, [](int device) {
    int major = 0;
    cudaFuncAttributes attr;
    const bool hopper =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
        major == 9 && cudaFuncGetAttributes(&attr, HopperFlashKernelSymbol()) == cudaSuccess;
    if (!hopper) cudaGetLastError();  // clear the non-sticky "no kernel image" error
    return hopper;
  });
}

bool UsesHopper(FlashPath path) {
  switch (path) {
    case FlashPath::kPortable:
      return false;
    case FlashPath::kHopper:
      return true;
    case FlashPath::kAuto:
      break;
  }
  return kHopperPathEnabled && HopperImageRunsHere();
}

}  // namespace

// Programmatic dependent launch needs compute capability 9.0 or later (programmatic_launch.cuh).
bool ProgrammaticLaunchRunsHere() {
  static std::atomic<int8_t> known[64] = {};
  return OncePerDevice(known, [](int device) {
    int major = 0;
    return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
               cudaSuccess &&
           major >= 9;
  });
}

bool HopperFlashAvailable() { return HopperImageRunsHere(); }

std::vector<FlashPath> AvailableFlashPaths() {
  if (HopperFlashAvailable()) return {FlashPath::kHopper, FlashPath::kPortable};
  return {FlashPath::kPortable};
}

const char* FlashKernelName(FlashPath path) {
  return UsesHopper(path) ? "sm90a-wgmma" : "portable-mma-sync";
}

absl::StatusOr<int> CurrentDeviceSmCount() {
  int device = 0;
  VERIFYD_CUDA_CHECK(cudaGetDevice(&device));
  int sms = 0;
  VERIFYD_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

absl::Status UploadPlan(const SplitPlan& plan, const WorkspaceLayout& layout, void* workspace,
                        cudaStream_t stream) {
  const std::vector<uint8_t> bytes = PackPlan(plan, layout);
  if (bytes.empty()) return absl::OkStatus();
  VERIFYD_CUDA_CHECK(
      cudaMemcpyAsync(workspace, bytes.data(), bytes.size(), cudaMemcpyHostToDevice, stream));
  return absl::OkStatus();
}

MlaVerifyParams MakeMlaVerifyParams(const VerifyProblem& problem, const SplitPlan& plan,
                                    const WorkspaceLayout& layout, void* workspace) {
  auto* base = static_cast<uint8_t*>(workspace);
  MlaVerifyParams params;
  params.problem = problem;
  params.work = reinterpret_cast<const FlashWorkItem*>(base + layout.work_offset);
  params.num_work = static_cast<int>(plan.work.size());
  params.combine = reinterpret_cast<const CombineItem*>(base + layout.combine_offset);
  params.num_combine = static_cast<int>(plan.combine.size());
  params.partial_o = reinterpret_cast<bf16_bits*>(base + layout.partial_o_offset);
  params.partial_lse = reinterpret_cast<float*>(base + layout.partial_lse_offset);
  params.num_partials = plan.num_partials;
  for (const CombineItem& c : plan.combine) {
    params.max_splits = std::max(params.max_splits, static_cast<int>(c.num_splits));
  }
  return params;
}

absl::Status LaunchMlaVerify(const VerifyProblem& problem, const SplitPlan& plan,
                             const WorkspaceLayout& layout, void* workspace, cudaStream_t stream,
                             VerifyStages stages, FlashPath path) {
  if (absl::Status s = CheckProblemShape(problem); !s.ok()) return s;
  if (plan.work.empty())
    return absl::InvalidArgumentError("plan.work is empty: plan the batch first");
  if (workspace == nullptr) return absl::InvalidArgumentError("workspace must be set");
  if (path == FlashPath::kHopper && !HopperFlashAvailable()) {
    return absl::FailedPreconditionError(
        "FlashPath::kHopper: this device or library has no sm_90a image of the Hopper kernel");
  }
  const bool fp8_rows = problem.kv_fp8 != nullptr;
  const bool hopper = UsesHopper(path);
  // Setting the attribute is not a stream operation, so it is legal while a stream is capturing.
  VERIFYD_CUDA_CHECK(
      cudaFuncSetAttribute(hopper ? HopperFlashKernelSymbol(fp8_rows) : FlashKernelSymbol(fp8_rows),
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           hopper ? HopperFlashSmemBytes() : FlashSmemBytes()));
  const MlaVerifyParams params = MakeMlaVerifyParams(problem, plan, layout, workspace);
  if (stages != VerifyStages::kCombineOnly) {
    VERIFYD_CUDA_CHECK(hopper ? LaunchHopperFlashKernel(params, stream)
                              : LaunchFlashKernel(params, stream));
  }
  if (stages != VerifyStages::kFlashOnly) {
    VERIFYD_CUDA_CHECK(LaunchCombineKernel(params, ProgrammaticLaunchRunsHere(), stream));
  }
  return absl::OkStatus();
}

absl::Status LaunchMlaVerifyNaive(const VerifyProblem& problem, cudaStream_t stream) {
  if (absl::Status s = CheckProblemShape(problem); !s.ok()) return s;
  LaunchNaiveKernel(problem, stream);
  VERIFYD_CUDA_CHECK(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status LaunchKvSlotWrite(bf16_bits* kv, int64_t num_slots, const bf16_bits* rows,
                               const int32_t* slots, int num_rows, cudaStream_t stream) {
  if (num_rows < 0)
    return absl::InvalidArgumentError(absl::StrCat("num_rows = ", num_rows, " must be >= 0"));
  if (num_rows > 0 && (kv == nullptr || rows == nullptr || slots == nullptr)) {
    return absl::InvalidArgumentError("kv, rows and slots must be set when num_rows > 0");
  }
  LaunchKvSlotWriteKernel(kv, num_slots, rows, slots, num_rows, stream);
  VERIFYD_CUDA_CHECK(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace verifyd
