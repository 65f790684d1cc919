// CudaBackend's co-located data plane: opening another process's device memory and Verify on
// tensors that live there (cuda_backend.h's class comment; plans/0018-data-plane-gpu.md).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ipc_region.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/mla_verify_launch.h"
#include "kernels/tree_kv_write.h"
#include "kernels/value_bound_check.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

bool Aligned(const void* pointer, uintptr_t alignment) {
  return reinterpret_cast<uintptr_t>(pointer) % alignment == 0;
}

// What must hold before anything of the call can be signalled: the flags are usable.
absl::Status CheckFlags(const ExternalOrder& order) {
  for (const auto& [flag, name] : {std::pair{&order.ready, "ready"}, {&order.done, "done"}}) {
    if (flag->word != nullptr && !Aligned(flag->word, 4)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " flag must be 4-byte aligned (a uint32 word)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTensors(const ExternalVerify& call) {
  const VerifyProblem& p = call.problem;
  if (p.q == nullptr || call.tree_kv == nullptr || p.out == nullptr) {
    return absl::InvalidArgumentError("q, tree_kv and out must be set");
  }
  for (const auto& [pointer, name] :
       {std::pair<const void*, const char*>{p.q, "q"}, {call.tree_kv, "tree_kv"}, {p.out, "out"}}) {
    if (!Aligned(pointer, 16)) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be 16-byte aligned"));
    }
  }
  if (p.lse != nullptr && !Aligned(p.lse, 4)) {
    return absl::InvalidArgumentError("lse must be 4-byte aligned");
  }
  return absl::OkStatus();
}

// tree_slots must be exactly the lists' tree entries: the device writes the tree KV to the slots
// it reads from the uploaded lists, and the caller's tree_slots are what the store made pending.
absl::Status CheckTreeSlots(absl::Span<const int32_t> tree_slots,
                            absl::Span<const VerifySlotList> lists) {
  size_t total = 0;
  for (const VerifySlotList& list : lists) total += list.tree_slots.size();
  if (tree_slots.size() != total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tree_slots has ", tree_slots.size(), " entries; the batch has ", total, " tree nodes"));
  }
  size_t i = 0;
  for (const VerifySlotList& list : lists) {
    for (const int32_t slot : list.tree_slots) {
      if (tree_slots[i] != slot) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tree_slots[", i, "] = ", tree_slots[i], " must be the slot list's tree entry ", slot));
      }
      ++i;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ExternalRegion>> CudaBackend::OpenExternalRegion(
    const ExternalMemoryHandle& handle) {
  VERIFYD_ASSIGN_OR_RETURN(std::unique_ptr<CudaIpcRegion> region,
                           CudaIpcRegion::Open(handle, stream_));
  return std::unique_ptr<ExternalRegion>(std::move(region));
}

absl::Status CudaBackend::FailVerifyExternal(const ExternalFailure& failure) {
  VERIFYD_RETURN_IF_ERROR(stream_->MakeDeviceCurrent());
  VERIFYD_ASSIGN_OR_RETURN(const CudaDriverApi* driver, GetCudaDriverApi());
  VERIFYD_RETURN_IF_ERROR(CheckFlags(failure.order));
  if (failure.out_elements < 0 || failure.lse_elements < 0) {
    return absl::InvalidArgumentError(absl::StrCat("out_elements = ", failure.out_elements,
                                                   " and lse_elements = ", failure.lse_elements,
                                                   " must be >= 0"));
  }
  ++external_counters_.failures;
  // A closed channel's scheduler is gone: waiting for its ready flag could wedge the stream.
  const bool cancelled = failure.order.cancelled != nullptr && failure.order.cancelled->load();
  return EnqueueFailure(failure, *driver, /*skip_ready_wait=*/cancelled);
}

absl::Status CudaBackend::EnqueueFailure(const ExternalFailure& failure,
                                         const CudaDriverApi& driver, bool skip_ready_wait) {
  cudaStream_t stream = stream_->get();
  const ExternalFlag& ready = failure.order.ready;
  if (!skip_ready_wait && ready.word != nullptr) {
    VERIFYD_CU_CHECK(driver.stream_wait_value32(stream, reinterpret_cast<CUdeviceptr>(ready.word),
                                                ready.value, CU_STREAM_WAIT_VALUE_GEQ));
  }
  // 0xFF bytes: 0xFFFF is a NaN in bf16, 0xFFFFFFFF in fp32.
  if (failure.out != nullptr && failure.out_elements > 0) {
    VERIFYD_CUDA_CHECK(cudaMemsetAsync(
        failure.out, 0xFF, static_cast<size_t>(failure.out_elements) * sizeof(bf16_bits), stream));
  }
  if (failure.lse != nullptr && failure.lse_elements > 0) {
    VERIFYD_CUDA_CHECK(cudaMemsetAsync(
        failure.lse, 0xFF, static_cast<size_t>(failure.lse_elements) * sizeof(float), stream));
  }
  const ExternalFlag& done = failure.order.done;
  if (done.word != nullptr) {
    VERIFYD_CU_CHECK(driver.stream_write_value32(stream, reinterpret_cast<CUdeviceptr>(done.word),
                                                 done.value, CU_STREAM_WRITE_VALUE_DEFAULT));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::ReleaseExternalWait(const ExternalFlag& ready) {
  if (ready.word == nullptr) return absl::OkStatus();
  VERIFYD_RETURN_IF_ERROR(stream_->MakeDeviceCurrent());
  VERIFYD_ASSIGN_OR_RETURN(const CudaDriverApi* driver, GetCudaDriverApi());
  VERIFYD_RETURN_IF_ERROR(CheckFlags(ExternalOrder{ready, {}}));
  std::lock_guard<std::mutex> lock(rescue_mu_);
  // Another stream: the backend's own is the one blocked on this flag.
  VERIFYD_CU_CHECK(driver->stream_write_value32(rescue_stream_,
                                                reinterpret_cast<CUdeviceptr>(ready.word),
                                                ready.value, CU_STREAM_WRITE_VALUE_DEFAULT));
  VERIFYD_CUDA_CHECK(cudaStreamSynchronize(rescue_stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::AwaitRingStaging(RingStaging& ring,
                                           std::chrono::steady_clock::time_point* clock) {
  if (ring.uploaded == nullptr) {
    VERIFYD_CUDA_CHECK(cudaEventCreateWithFlags(&ring.uploaded, cudaEventDisableTiming));
  }
  if (ring.pending) {
    if (cudaEventQuery(ring.uploaded) == cudaErrorNotReady) {
      cudaGetLastError();
      ++external_counters_.staging_waits;
      // Time the GPU is behind, not host work: counted as a wait, not as staging.
      Lap(clock, &phase_times_.stage_ns);
      VERIFYD_CUDA_CHECK(cudaEventSynchronize(ring.uploaded));
      Lap(clock, &phase_times_.wait_ns);
    }
    ring.pending = false;
  }
  // The last call here has run (its event was waited for or found complete above, the only way
  // `pending` clears): its check reads its words now, before this call's copy replaces them.
  if (ring.value_check != nullptr) {
    ring.value_check->Settle();
    ring.value_check.reset();
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::RunPlannedExternal(int layer, const VerifyProblem& problem,
                                             absl::Span<const VerifySlotList> lists,
                                             const CachedPlan& plan, const SlotMirrorPlan& slots,
                                             std::chrono::steady_clock::time_point clock,
                                             ExternalRun& external) {
  VERIFYD_ASSIGN_OR_RETURN(const VerifyStagingLayout layout,
                           LayoutAndGrowArena(problem, plan, slots));
  // The layer's ring buffer is free once its last upload ran.
  const int position = layer % kExternalStagingRing;
  RingStaging& ring = external_staging_[position];
  // q's and tree_kv's first bad word: the host's copy in mapped pinned memory, as the host reads
  // it and as the fill writes it (the device's words are in the upload, below).
  unsigned long long* value_words_host =
      external_value_host_.as<unsigned long long>(position * kValueWordsBytes);
  unsigned long long* value_words_mapped =
      external_value_host_.device_as<unsigned long long>(position * kValueWordsBytes);
  VERIFYD_RETURN_IF_ERROR(AwaitRingStaging(ring, &clock));
  // The last call here is settled (its answer read): this call's fill writes the copy only if a
  // check finds something.
  value_words_host[0] = kNoneOutOfBound;
  value_words_host[1] = kNoneOutOfBound;
  // External tensors are read and written in place: nothing of q, out or lse is staged.
  VERIFYD_ASSIGN_OR_RETURN(StagedCall staged,
                           Stage(layout, problem, lists, plan, slots,
                                 DirectCopies{true, true, problem.lse != nullptr}, &ring.buffer));
  staged.device_problem.q = problem.q;
  staged.device_problem.out = problem.out;
  staged.device_problem.lse = problem.lse;
  // The tree rows' slots, batch order (the lists' tree entries, which CheckTreeSlots matched
  // against the store's), for the tree-KV write that rides in the scatter's launch.
  {
    int32_t* tree_slots = ring.buffer.as<int32_t>(layout.tree_slots);
    for (const VerifySlotList& list : lists) {
      tree_slots = std::copy(list.tree_slots.begin(), list.tree_slots.end(), tree_slots);
    }
  }
  const int32_t* device_tree_slots = inputs_.as<int32_t>(layout.tree_slots);
  // The check's words, armed by the upload: the next call's upload re-arms them, after this call's
  // fill (the last reader) in stream order.
  {
    unsigned long long* armed = ring.buffer.as<unsigned long long>(layout.value_words);
    armed[0] = kNoneOutOfBound;
    armed[1] = kNoneOutOfBound;
  }
  unsigned long long* value_words = inputs_.as<unsigned long long>(layout.value_words);
  Lap(&clock, &phase_times_.stage_ns);

  const VerifyProblem& device_problem = staged.device_problem;
  const bf16_bits* tree_kv = external.call->tree_kv;
  auto enqueue = [&](cudaStream_t stream) -> absl::Status {
    const int64_t rows = int64_t{problem.total_q} * problem.num_heads;
    // SPEC §1 on tensors the host cannot read: the device finds q's and tree_kv's first value
    // beyond 2^16 (or NaN/Inf), in the slot scatter's launch, before anything else reads them
    // (the words were armed by the upload); a refused call's outputs become NaN below and its
    // answer reaches the host through the mapped copy that the fill writes (CudaValueCheck).
    // A bf16 pool's tree KV rides in the same launch (its slots uploaded with the call, so it
    // waits for neither the scatter nor the check: plans/0031, change 4); the attention reads it
    // after that launch (stream order). An fp8 pool quantizes it in a launch of its own, after
    // the check (the quantizer expects values inside the bound).
    TreeRowWriteArgs tree;
    if (problem.kv_fp8 == nullptr) {
      tree = TreeRowWriteArgs{const_cast<bf16_bits*>(problem.kv), problem.num_slots, tree_kv,
                              problem.total_q, device_tree_slots};
    }
    VERIFYD_RETURN_IF_ERROR(
        LaunchScatter(staged, stream,
                      FirstOutOfBoundArgs{problem.q, rows * kKvDim, tree_kv,
                                          int64_t{problem.total_q} * kKvDim, value_words},
                      tree));
    if (problem.kv_fp8 != nullptr) {
      VERIFYD_RETURN_IF_ERROR(LaunchTreeKvWriteFp8(
          const_cast<uint8_t*>(problem.kv_fp8), problem.num_slots, tree_kv, problem.total_q,
          problem.batch, device_problem.qo_indptr, device_problem.prefix_len,
          device_problem.slot_indptr, device_problem.slots, stream));
    }
    VERIFYD_RETURN_IF_ERROR(LaunchMlaVerify(device_problem, plan.plan, plan.layout,
                                            staged.workspace, stream,
                                            VerifyStages::kFlashAndCombine, options_.flash_path));
    // The last reader of the words: it hands them to the host when they found something.
    return LaunchNanIfOutOfBound(value_words, 2, value_words_mapped, problem.out, rows * kVDim,
                                 problem.lse, problem.lse != nullptr ? rows : 0, stream);
  };
  // The flag operations stand outside the graph, where the host call's direct copies stand.
  auto enqueue_all = [&]() -> absl::StatusOr<GraphOutcome> {
    // Before the ready wait: the upload needs nothing of the engine's (plans/0031, change 8).
    VERIFYD_RETURN_IF_ERROR(EnqueueUploadAhead(staged, ring));
    const ExternalFlag& ready = external.call->order.ready;
    if (ready.word != nullptr) {
      VERIFYD_CU_CHECK(external.driver->stream_wait_value32(
          stream_->get(), reinterpret_cast<CUdeviceptr>(ready.word), ready.value,
          CU_STREAM_WAIT_VALUE_GEQ));
    }
    external.ready_enqueued = true;
    VerifyGraphParams params = GraphParams(problem, plan, staged);
    params.external_q = problem.q;
    params.external_tree_kv = tree_kv;
    params.external_out = problem.out;
    params.external_lse = problem.lse;
    VERIFYD_ASSIGN_OR_RETURN(
        const GraphOutcome outcome,
        EnqueueCaptured(GraphBucket(layer, problem, plan, staged, true), params, enqueue));
    VERIFYD_CUDA_CHECK(cudaEventRecord(ring.uploaded, stream_->get()));
    ring.pending = true;
    inputs_released_ = ring.uploaded;
    const int64_t tq = problem.total_q;
    ring.value_check = std::make_shared<CudaValueCheck>(
        options_.device, ring.uploaded, value_words_host,
        std::vector<int64_t>{tq, int64_t{problem.num_heads}, int64_t{kKvDim}},
        std::vector<int64_t>{tq, int64_t{kKvDim}});
    external.value_check = ring.value_check;
    const ExternalFlag& done = external.call->order.done;
    if (done.word != nullptr) {
      VERIFYD_CU_CHECK(external.driver->stream_write_value32(
          stream_->get(), reinterpret_cast<CUdeviceptr>(done.word), done.value,
          CU_STREAM_WRITE_VALUE_DEFAULT));
    }
    return outcome;
  };
  const absl::StatusOr<GraphOutcome> outcome = enqueue_all();
  if (!outcome.ok()) {
    // Part of the sequence may be queued. The caller's failure path signals (the stream may be
    // waiting for the ready flag), and the ring buffer is not reused until this stream position
    // has passed. The next call's upload arms the words whatever ran of this one.
    if (cudaEventRecord(ring.uploaded, stream_->get()) == cudaSuccess) {
      ring.pending = true;
      inputs_released_ = ring.uploaded;
    } else {
      cudaGetLastError();
    }
    return outcome.status();
  }
  CountEager(*outcome);
  Lap(&clock, &phase_times_.enqueue_ns);
  ObserveGraph(*outcome);
  return absl::OkStatus();
}

absl::Status CudaBackend::ComputeVerifyExternal(const ExternalVerify& call,
                                                absl::Span<const VerifySlotList> slot_lists) {
  // Without a device, a driver or usable flags nothing can be signalled: the error alone returns
  // (the service refuses such flags before a call is made).
  VERIFYD_RETURN_IF_ERROR(stream_->MakeDeviceCurrent());
  ExternalRun run;
  run.call = &call;
  VERIFYD_ASSIGN_OR_RETURN(run.driver, GetCudaDriverApi());
  VERIFYD_RETURN_IF_ERROR(CheckFlags(call.order));

  auto clock = std::chrono::steady_clock::now();
  VerifyProblem problem = call.problem;
  bool planned_ok = false;
  absl::Status status = CheckTensors(call);
  if (status.ok() && call.order.cancelled != nullptr && call.order.cancelled->load()) {
    status = absl::AbortedError("the call's channel was closed before it was enqueued");
  }
  if (status.ok()) {
    absl::StatusOr<PlannedCall> planned = PlanCall(
        call.layer, problem, slot_lists,
        [&](absl::Span<const VerifySlotList> lists) {
          return CheckTreeSlots(call.tree_slots, lists);
        },
        &clock, call.reserved_sms);
    if (!planned.ok()) {
      status = planned.status();
    } else {
      planned_ok = true;
      ++phase_times_.calls;
      status = RunPlannedExternal(call.layer, problem, planned->lists, *planned->plan,
                                  *planned->slots, clock, run);
    }
  }
  if (status.ok()) {
    ++external_counters_.calls;
    if (call.value_check != nullptr) *call.value_check = run.value_check;
    return absl::OkStatus();
  }
  // The mirror recorded uploads that may not have been enqueued.
  if (planned_ok) mirror_->Clear();
  ++external_counters_.failures;
  // The extents are the ones the caller checked against the regions (the header's contract).
  const VerifyProblem& p = call.problem;
  const int64_t rows = p.total_q > 0 && p.num_heads > 0 ? int64_t{p.total_q} * p.num_heads : 0;
  const ExternalFailure failure{p.out, rows * kVDim, p.lse, p.lse != nullptr ? rows : 0,
                                call.order};
  // No wait for the ready flag of a closed channel's call (its scheduler is gone).
  const bool cancelled = call.order.cancelled != nullptr && call.order.cancelled->load();
  if (absl::Status signalled =
          EnqueueFailure(failure, *run.driver, run.ready_enqueued || cancelled);
      !signalled.ok()) {
    return absl::InternalError(absl::StrCat(
        status.message(), "; and signalling the failure failed: ", signalled.message()));
  }
  return status;
}

}  // namespace verifyd
