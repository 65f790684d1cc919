// Host API of the CUDA verify kernels: validate what the host can see, then launch. The launch path
// allocates nothing and never synchronises with the host, so it can be captured in a CUDA graph.
//
// Typical use (eager):
//   auto plan = PlanSplits(prefix_len, q_len, heads, sm_count);      // host shapes
//   WorkspaceLayout layout = LayoutWorkspace(*plan);                  // caller allocates
//   total_bytes UploadPlan(*plan, layout, workspace, stream);                     // once per plan
//   / shape bucket LaunchMlaVerify(device_problem, *plan, layout, workspace, stream); // flash (+
//   combine)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/split_planner.h"
#include "verify/bf16.h"
#include "verify/verify_problem.h"

namespace verifyd {

// Multiprocessors of the current device: the planner's num_sms.
absl::StatusOr<int> CurrentDeviceSmCount();

// Copies PackPlan()'s bytes to the start of `workspace` (device memory of layout.total_bytes) on
// `stream`. Uses a pageable source, so it returns once the bytes are staged; not for graph capture
// (a captured replay would re-read freed host memory): capture code copies from its own pinned
// buffer.
absl::Status UploadPlan(const SplitPlan& plan, const WorkspaceLayout& layout, void* workspace,
                        cudaStream_t stream);

// problem: every pointer device memory, laid out as verify_problem.h says; total_q, batch and
// num_heads are host values and must match the plan. The plan must already be in the workspace.
// Which kernels LaunchMlaVerify enqueues: both (what every caller wants), or one of them for the
// benchmark's time breakdown (kCombineOnly needs a flash run of the same plan before it).
enum class VerifyStages { kFlashAndCombine, kFlashOnly, kCombineOnly };
// Which flash kernel runs. kAuto (the product's): the sm_90a wgmma kernel on a compute-capability-9
// device when this library holds its image, else the portable mma.sync kernel; both read a bf16
// pool (problem.kv) and an fp8 one (problem.kv_fp8). kPortable and kHopper force one, for the tests
// and the benchmark, which check and time both on one device; kHopper where it cannot run (no
// image) is an error (FailedPrecondition), never a silent fallback.
enum class FlashPath { kAuto, kPortable, kHopper };
absl::Status LaunchMlaVerify(const VerifyProblem& problem, const SplitPlan& plan,
                             const WorkspaceLayout& layout, void* workspace, cudaStream_t stream,
                             VerifyStages stages = VerifyStages::kFlashAndCombine,
                             FlashPath path = FlashPath::kAuto);
// The kernels' parameters for a planned launch (LaunchMlaVerify builds the same).
MlaVerifyParams MakeMlaVerifyParams(const VerifyProblem& problem, const SplitPlan& plan,
                                    const WorkspaceLayout& layout, void* workspace);

// Whether the current device can run the Hopper kernel (compute capability 9 and an sm_90a image in
// this library).
bool HopperFlashAvailable();
// The flash paths the current device can run: {kHopper, kPortable} where the Hopper kernel can
// run, else {kPortable}. Tests and the benchmark loop over these.
std::vector<FlashPath> AvailableFlashPaths();
// The kernel `path` runs on the current device: "sm90a-wgmma" or "portable-mma-sync" (kAuto
// resolved; kHopper where it cannot run still says "sm90a-wgmma").
const char* FlashKernelName(FlashPath path = FlashPath::kAuto);

// Whether the current device runs programmatic dependent launch (compute capability 9.0 or later;
// kernels/programmatic_launch.cuh): the verify kernels' launchers ask, once per device.
bool ProgrammaticLaunchRunsHere();

// The naive on-GPU oracle (same problem layout; no plan, no workspace).
absl::Status LaunchMlaVerifyNaive(const VerifyProblem& problem, cudaStream_t stream);

// Writes rows[i] (576 bf16) into kv[slots[i]] for i < num_rows; kv is one layer: [num_slots][576].
absl::Status LaunchKvSlotWrite(bf16_bits* kv, int64_t num_slots, const bf16_bits* rows,
                               const int32_t* slots, int num_rows, cudaStream_t stream);

}  // namespace verifyd
