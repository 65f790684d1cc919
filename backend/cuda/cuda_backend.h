// CudaBackend: Verify on the GPU over a CudaKvStorage pool, on the device's one stream.
//
// ComputeVerify: the problem's host arrays, the slot lists' new entries (the device keeps a mirror
// of every sequence's slot list: backend/cuda/cuda_slot_mirror.h) and the split plan are packed
// into pinned staging; one H2D copy, a small kernel placing the slot entries into the mirror's
// arena, the flash + combine kernels over the layer's rows, one D2H copy of out (+ lse), one stream
// synchronization, and a copy into the caller's output. With graphs on, that sequence is a CUDA
// graph per shape bucket (backend/cuda/cuda_graph_cache.h), replayed as is while only data changes.
// Buffers grow geometrically and are reused; nothing is allocated per call once the largest shape
// has been seen.
//
// Host memory registered through RegisterHostMemory (the daemon's shared-memory regions) is
// page-locked by the driver: a q / out / lse wholly inside one registered range is copied by DMA
// straight from / into it, with no host copy through the staging. Those copies are enqueued
// eagerly around the graph launch (or the eager sequence), never captured: a graph's memcpy nodes
// would bake in the caller's address, which differs per region and offset (a daemon serving
// several clients alternates between them), so nearly every call would re-capture and update the
// graph; eager, the graph depends only on which tensors go directly (part of the bucket), and the
// cost is one cudaMemcpyAsync call per direct tensor. Stream order puts the q copy before the
// graph's kernels and the output copies after them, as the graph's own copies are.
// Unregistration cannot race a copy: ComputeVerify synchronizes its stream before returning (also
// on failure), and a range is unregistered only when its mapping's last holder lets it go, while
// the call that uses it holds a pin on it until after ComputeVerify returned
// (service/verifyd_service.cc: RegionPins live in the task or the waiting handler's frame).
//
// External tensors (the co-located data plane, backend/external_tensors.h; plans/0018): q, tree KV,
// out and lse lie in another process's device memory, opened from a CUDA IPC handle
// (cuda_ipc_region.h). ComputeVerifyExternal enqueues, on the same stream and without waiting for
// it: cuStreamWaitValue32(ready >= value) → the call's one H2D upload of its index arrays → one
// launch of the slot scatter, the value check of q and tree_kv (SPEC §1) and, on a bf16 pool, the
// tree-KV write from the caller's buffer into the pool (an fp8 pool's quantizing write is the next
// launch) → flash + combine reading q and writing out / lse in place
// → the NaN fill, which also hands the check's words to the host through mapped memory and re-arms
// them for the next call → cuStreamWriteValue32(done = value). The middle part is the same graph as
// ComputeVerify's (the bucket says external; the tensors' addresses are graph parameters, stable
// while the scheduler reuses its buffers); the two flag operations stay outside it, like the direct
// copies. The host never synchronizes, so a scheduler can enqueue a whole step ahead: the pinned
// staging of such calls is a ring of kExternalStagingRing buffers chosen by layer (one graph per
// layer, not per ring position), each guarded by an event that the host waits for only when it
// reuses a buffer whose upload has not run yet. A call that fails after its flags are known still
// enqueues the ready wait, fills out and lse with 0xFF bytes (NaN in bf16 and fp32) and writes the
// done flag, so the scheduler's stream never hangs.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/compute_backend.h"
#include "backend/cuda/cuda_device_memory.h"
#include "backend/cuda/cuda_graph_cache.h"
#include "backend/cuda/cuda_kv_storage.h"
#include "backend/cuda/cuda_plan_cache.h"
#include "backend/cuda/cuda_slot_mirror.h"
#include "backend/cuda/cuda_value_check.h"
#include "backend/cuda/cuda_verify_staging.h"
#include "backend/cuda/host_copy_pool.h"
#include "base/cuda_driver.h"
#include "kernels/mla_verify_launch.h"
#include "kernels/value_bound_check.h"
#include "verify/verify_problem.h"

namespace verifyd {

struct CudaBackendOptions {
  int device = 0;
  bool cuda_graphs = true;
  // Executable graphs kept (buckets × layers).
  int max_graphs = 1024;
  // Batch shapes whose split plan is remembered.
  int plan_cache_entries = 8;
  // Device slot arena (int32 entries); 0: 2 × the pool's capacity + 64 Ki, which holds every live
  // list with its headroom. Smaller values make the mirror reset (tests of that path).
  int64_t slot_arena_entries = 0;
  // Threads (the executor's included) for the large host copies: q into staging, outputs out.
  int copy_threads = 4;
  // Which flash kernel runs: kAuto (the sm_90a one on Hopper, else the portable one) or
  // kPortable, the kernel sm_80 and sm_120 run, so that a Hopper host reproduces the product GPU's
  // path end to end (the tests, the decode-step bench, the daemon's --flash_kernel).
  FlashPath flash_path = FlashPath::kAuto;
};

// Host time of ComputeVerify by phase, summed over calls (the benchmark's breakdown of the
// overhead around the kernels).
struct CudaBackendPhaseTimes {
  int64_t calls = 0;
  int64_t check_ns = 0;     // validation (tree-only + uploaded slots)
  int64_t plan_ns = 0;      // flush of queued writes, split plan, slot mirror plan
  int64_t stage_ns = 0;     // filling the pinned staging (q, indices, slot upload, plan)
  int64_t enqueue_ns = 0;   // graph launch / update / capture, or the eager launches
  int64_t wait_ns = 0;      // the one stream synchronization (the GPU's time shows here)
  int64_t copy_out_ns = 0;  // pinned outputs into the caller's out / lse
};

// Calls on external tensors (ComputeVerifyExternal).
struct ExternalCallCounters {
  int64_t calls = 0;          // enqueued (successful returns)
  int64_t failures = 0;       // returned an error; outputs NaN-filled and done signalled
  int64_t staging_waits = 0;  // the host waited for a ring buffer's previous upload
};

// Calls whose tensors went straight between registered host memory and the device.
struct DirectCopyCounters {
  int64_t q = 0;
  int64_t out = 0;
  int64_t lse = 0;
};

class CudaBackend : public ComputeBackend {
 public:
  // Selects the device, creates its stream, reads its SM count. FAILED_PRECONDITION when the device
  // is not visible.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(CudaBackendOptions options);

  // Waits for the stream: a queued copy may still use the buffers freed here.
  ~CudaBackend() override;

  // The external calls' staging ring (class comment), by layer: 64 ≥ the layers of the models
  // served (61), so a scheduler enqueueing a whole step ahead never makes the executor wait; it
  // waits only when it runs more than a step ahead of the GPU.
  static constexpr int kExternalStagingRing = 64;

  const char* name() const override { return "cuda"; }
  absl::StatusOr<std::unique_ptr<KvStorage>> CreateStorage(int num_layers,
                                                           int64_t capacity_slots) override;
  // Either dtype: an fp8 pool holds 656-byte rows (cuda_kv_storage.h), and every VerifyProblem
  // this backend builds over it points kv_fp8 at the layer's bytes (kv null), which the attention
  // launch takes to mean fp8 rows.
  absl::StatusOr<std::unique_ptr<KvStorage>> CreateStorage(int num_layers, int64_t capacity_slots,
                                                           KvDtype dtype) override;
  // Reads `slot_lists` (never concatenated on the host); an empty span means the concatenated
  // host arrays in `problem`, uploaded whole every call (tests and tools).
  bool needs_host_slot_lists() const override { return false; }
  using ComputeBackend::ComputeVerify;
  // Free device memory now (cudaMemGetInfo), before the pool is allocated.
  absl::StatusOr<int64_t> AvailableMemoryBytes() const override;
  absl::Status ComputeVerify(int layer, VerifyProblem problem,
                             absl::Span<const VerifySlotList> slot_lists) override;
  void ForgetSequence(SequenceId sequence) override;
  // kCapture for every stream capture (a new executable graph or an update of one), kReplay for
  // every graph launch, kFallback for an eager run because the graph path failed. A bucket's
  // first call (an eager warm-up by design) reports nothing.
  void SetGraphObserver(std::function<void(GraphEvent)> observer) override {
    graph_observer_ = std::move(observer);
  }
  bool can_register_host_memory() const override { return true; }
  // cudaHostRegister (portable: pinned for every context of the process). UNAVAILABLE with the
  // driver's reason when it refuses (then the range is used through the staging).
  absl::Status RegisterHostMemory(void* data, size_t bytes) override;
  // cudaHostUnregister; the range is forgotten first, so no later call copies from it directly.
  void UnregisterHostMemory(void* data) override;

  // A CUDA IPC memory handle of a device allocation in another process on this device
  // (cuda_ipc_region.h says what is refused).
  absl::StatusOr<std::unique_ptr<ExternalRegion>> OpenExternalRegion(
      const ExternalMemoryHandle& handle) override;
  // Enqueues the call (class comment) and returns without waiting for the stream. The caller has
  // checked that q, tree_kv, out and lse (total_q × num_heads rows, and total_q tree rows) and the
  // flag words lie inside opened regions, and keeps those regions open until the done flag is
  // written. Every device pointer must be 16-byte aligned (flags 4). tree_slots must be the slot
  // lists' tree entries (one per node, batch order). Errors: INVALID_ARGUMENT for the problem as
  // ComputeVerify, and for tree_slots, alignment or a missing tensor; after any error whose flags
  // are usable the ready wait, the NaN fill and the done write are enqueued all the same.
  absl::Status ComputeVerifyExternal(const ExternalVerify& call,
                                     absl::Span<const VerifySlotList> slot_lists) override;
  // ExternalFailure's contract: the ready wait, 0xFF over out and lse, the done write, enqueued
  // on the stream in order with the calls before it; returns without waiting.
  absl::Status FailVerifyExternal(const ExternalFailure& failure) override;
  // Writes `ready.value` to the ready flag from a second stream and waits for that write: a call
  // whose scheduler died before writing its ready flag would otherwise hold this backend's stream
  // (and every later call) forever. The daemon calls it for each enqueued call of a channel it
  // closes (plans/0018); the released calls compute on whatever the buffers hold and write their
  // done flags, which nobody reads any more.
  absl::Status ReleaseExternalWait(const ExternalFlag& ready) override;
  const ExternalCallCounters& external_counters() const { return external_counters_; }
  bool mps_active() const override { return mps_active_; }
  // FlashKernelName of this backend's path: "sm90a-wgmma" or "portable-mma-sync".
  std::string attention_kernel() const override;
  std::string gpu_uuid() const override { return gpu_uuid_; }

  const GraphCounters& graph_counters() const { return graphs_.counters(); }
  int64_t eager_runs() const { return eager_runs_; }
  int64_t plans_made() const { return plans_.plans_made(); }
  // Zero before CreateStorage.
  SlotMirrorCounters slot_mirror_counters() const {
    return mirror_ ? mirror_->counters() : SlotMirrorCounters{};
  }
  size_t mirrored_sequences() const { return mirror_ ? mirror_->mirrored_sequences() : 0; }
  const CudaBackendPhaseTimes& phase_times() const { return phase_times_; }
  const DirectCopyCounters& direct_copies() const { return direct_copies_; }
  size_t registered_host_ranges() const { return host_ranges_.size(); }
  const CudaStream& stream() const { return *stream_; }

 private:
  CudaBackend(CudaBackendOptions options, std::shared_ptr<CudaStream> stream, int num_sms)
      : options_(std::move(options)),
        stream_(std::move(stream)),
        plans_(num_sms, options_.plan_cache_entries),
        graphs_(options_.max_graphs) {}

  // What RunPlanned needs for an external call, and what it did with its ready flag.
  struct ExternalRun {
    const ExternalVerify* call = nullptr;
    const CudaDriverApi* driver = nullptr;
    bool ready_enqueued = false;                  // the ready wait is on the stream
    std::shared_ptr<CudaValueCheck> value_check;  // set once the whole call is enqueued
  };
  // A call validated and planned: its lists (the caller's or the concatenated arrays as lists),
  // its split plan and what the mirror uploads.
  struct PlannedCall {
    absl::Span<const VerifySlotList> lists;
    const CachedPlan* plan = nullptr;
    const SlotMirrorPlan* slots = nullptr;
  };
  // Shared by ComputeVerify and ComputeVerifyExternal: sets kv / num_slots, validates, runs
  // `check_lists` on the validated lists (before the mirror records anything), flushes queued
  // writes, plans. A failure changes nothing.
  absl::StatusOr<PlannedCall> PlanCall(
      int layer, VerifyProblem& problem, absl::Span<const VerifySlotList> slot_lists,
      absl::FunctionRef<absl::Status(absl::Span<const VerifySlotList>)> check_lists,
      std::chrono::steady_clock::time_point* clock, int reserved_sms = 0);
  // Everything after the mirror planned the call, in two paths over the shared steps below; a
  // failure here leaves the arena unknown. The host path synchronizes and copies out; the
  // external path (cuda_backend_external.cc) waits for nothing and signals through the flags.
  absl::Status RunPlannedHost(int layer, const VerifyProblem& problem,
                              absl::Span<const VerifySlotList> lists, const CachedPlan& plan,
                              const SlotMirrorPlan& slots,
                              std::chrono::steady_clock::time_point clock);
  absl::Status RunPlannedExternal(int layer, const VerifyProblem& problem,
                                  absl::Span<const VerifySlotList> lists, const CachedPlan& plan,
                                  const SlotMirrorPlan& slots,
                                  std::chrono::steady_clock::time_point clock,
                                  ExternalRun& external);

  // The shared steps, in call order.
  // Adds the time since `*since` to `*total` (a phase of CudaBackendPhaseTimes) and restarts it.
  static void Lap(std::chrono::steady_clock::time_point* since, int64_t* total);
  // The call's staging layout, after growing the slot arena: growth waits for the stream and
  // frees memory, so it comes before anything is enqueued or captured.
  absl::StatusOr<VerifyStagingLayout> LayoutAndGrowArena(const VerifyProblem& problem,
                                                         const CachedPlan& plan,
                                                         const SlotMirrorPlan& slots);
  // What Stage filled and placed: the rest of the call reads only this.
  struct StagedCall {
    VerifyStagingLayout layout;
    DirectCopies direct;
    StagedCopy upload;
    StagedCopy readback;
    PinnedBuffer* staging = nullptr;
    int32_t* arena = nullptr;
    VerifyProblem device_problem;
    void* workspace = nullptr;
  };
  // Reserves `staging` and the device inputs, fills the staging (q only where it is not copied
  // directly) and the slot uploads, and places the problem on the device.
  absl::StatusOr<StagedCall> Stage(const VerifyStagingLayout& layout, const VerifyProblem& problem,
                                   absl::Span<const VerifySlotList> lists, const CachedPlan& plan,
                                   const SlotMirrorPlan& slots, DirectCopies direct,
                                   PinnedBuffer* staging);
  // The first of a host call's captured sequence: the one H2D upload, then LaunchScatter.
  absl::Status EnqueueUpload(const StagedCall& staged, cudaStream_t stream);
  // The one launch that reads the upload: the slot scatter into the arena, with the value check
  // of `check` and the tree write of `tree` (external calls) riding in it
  // (kernels/value_bound_check.h).
  absl::Status LaunchScatter(const StagedCall& staged, cudaStream_t stream,
                             const FirstOutOfBoundArgs& check = {},
                             const TreeRowWriteArgs& tree = {});
  // The graph's bucket and parameters of the call (an external call adds its tensors to both).
  VerifyGraphBucket GraphBucket(int layer, const VerifyProblem& problem, const CachedPlan& plan,
                                const StagedCall& staged, bool external) const;
  VerifyGraphParams GraphParams(const VerifyProblem& problem, const CachedPlan& plan,
                                const StagedCall& staged) const;
  // `enqueue` replayed through the graph cache, or run eagerly with graphs off.
  absl::StatusOr<GraphOutcome> EnqueueCaptured(
      const VerifyGraphBucket& bucket, const VerifyGraphParams& params,
      absl::FunctionRef<absl::Status(cudaStream_t)> enqueue);
  // A call enqueued whole counts an eager run (graphs off, or a bucket's warm-up); one that
  // completed reports its outcome to the graph observer.
  void CountEager(GraphOutcome outcome);
  void ObserveGraph(GraphOutcome outcome);

  // The failure half of the external contract: the ready wait (unless enqueued already, or its
  // channel closed: `skip_ready_wait`), 0xFF over out and lse, the done write.
  absl::Status EnqueueFailure(const ExternalFailure& failure, const CudaDriverApi& driver,
                              bool skip_ready_wait);

  // Pinned staging of external calls (class comment): buffer `layer % size`, reusable once
  // `uploaded` (recorded after the call's launch) has completed.
  struct RingStaging {
    PinnedBuffer buffer;
    cudaEvent_t uploaded = nullptr;
    // The call's upload done (recorded on upload_stream_; the backend's stream waits for it).
    cudaEvent_t upload_done = nullptr;
    bool pending = false;
    // The value check of the call that last used this position: settled before `uploaded` is
    // recorded again (cuda_value_check.h).
    std::shared_ptr<CudaValueCheck> value_check;
  };
  // Waits (counted in staging_waits) until the ring buffer's last upload ran, and settles the
  // value check of the call that last used it.
  absl::Status AwaitRingStaging(RingStaging& ring, std::chrono::steady_clock::time_point* clock);
  // An external call's upload, outside its graph and ahead of its ready wait: on upload_stream_,
  // once the last external call's kernels are done with the inputs; the backend's stream waits
  // for it (ring.upload_done) before the graph. So the copy overlaps the engine's work before the
  // layer (its GEMM) instead of standing first on the layer's path (plans/0031, change 8).
  absl::Status EnqueueUploadAhead(const StagedCall& staged, RingStaging& ring);

  CudaBackendOptions options_;
  std::shared_ptr<CudaStream> stream_;
  HostCopyPool copier_{options_.copy_threads};
  // Owned by the KvStore, which outlives the executor's use of this backend.
  CudaKvStorage* storage_ = nullptr;
  // The mirror's bookkeeping and its device arena (int32 entries), created with the storage.
  std::unique_ptr<SlotMirror> mirror_;
  DeviceBuffer slot_arena_;
  SplitPlanCache plans_;
  VerifyGraphCache graphs_;
  PinnedBuffer staging_;                    // [inputs | plan]
  DeviceBuffer inputs_;                     // [inputs | workspace]
  DeviceBuffer outputs_;                    // [out | lse]
  PinnedBuffer host_outputs_;               // [out | lse]
  std::vector<int32_t> q_len_;              // scratch
  std::vector<VerifySlotList> host_lists_;  // scratch: the concatenated form as lists
  // Registered on gRPC threads, read by ComputeVerify on the executor (the set locks).
  RegisteredHostRanges host_ranges_;
  int64_t eager_runs_ = 0;
  CudaBackendPhaseTimes phase_times_;
  DirectCopyCounters direct_copies_;
  RingStaging external_staging_[kExternalStagingRing];
  // SPEC §1 on external calls: per ring position, the host's copy of the two packed first-bad
  // words (q, tree_kv) in mapped pinned memory, armed to kNoneOutOfBound before each call and
  // written by the NaN fill only when a check found something (kernels/value_bound_check.h). The
  // device's words ride in the call's upload (VerifyStagingLayout::value_words).
  static constexpr size_t kValueWordsBytes = 2 * sizeof(unsigned long long);
  PinnedBuffer external_value_host_;
  ExternalCallCounters external_counters_;
  bool mps_active_ = false;
  std::string gpu_uuid_;  // "GPU-...", read at creation
  // ReleaseExternalWait's stream, made by Create; it runs on the daemon's channel threads.
  std::mutex rescue_mu_;
  cudaStream_t rescue_stream_ = nullptr;
  // External calls' uploads (EnqueueUploadAhead), and the event after the last external call's
  // kernels (its ring position's `uploaded`), which the next upload waits for: the device inputs
  // are one buffer.
  cudaStream_t upload_stream_ = nullptr;
  cudaEvent_t inputs_released_ = nullptr;
  // The inputs grew (Stage) and their zeroing memset on the backend's stream is not yet behind an
  // event the upload stream waits for; inputs_zeroed_ is that event.
  bool inputs_zeroing_pending_ = false;
  cudaEvent_t inputs_zeroed_ = nullptr;
  std::function<void(GraphEvent)> graph_observer_;
};

// Whether `device` is a visible CUDA device (false without a driver); the service's backend
// factory asks before it creates a CudaBackend.
bool CudaBackendAvailable(int device);

}  // namespace verifyd
