// CudaBackend's co-located data plane: opening another process's device memory and Verify on
// tensors that live there (cuda_backend.h's class comment; plans/0018-data-plane-gpu.md).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ipc_region.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
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
        &clock);
    if (!planned.ok()) {
      status = planned.status();
    } else {
      planned_ok = true;
      ++phase_times_.calls;
      status = RunPlanned(call.layer, problem, planned->lists, *planned->plan, *planned->slots,
                          clock, &run);
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
