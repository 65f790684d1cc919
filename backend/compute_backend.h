// ComputeBackend: where Verify's arithmetic runs and where the KV pool lives. The CPU backend
// computes on host memory; the CUDA backend supplies device storage and its kernels.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "backend/external_tensors.h"
#include "kvstore/kv_storage.h"
#include "kvstore/kv_store.h"
#include "verify/verify_problem.h"

namespace verifyd {

// One sequence's slot list for a Verify, as the store holds it: spans into the store (no copy),
// valid for the duration of the ComputeVerify call. A backend that mirrors slot lists on the device
// uploads only what changed since it last saw the same (sequence, generation).
struct VerifySlotList {
  SequenceId sequence = 0;
  // VerifyView::slot_generation. 0 means "not from a store": never remembered, uploaded whole.
  uint64_t generation = 0;
  absl::Span<const int32_t> prefix_slots;  // [prefix_len[b]]
  absl::Span<const int32_t> tree_slots;    // [Q_b]
};

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;
  // "cpu" or "cuda": the backend label of metrics and Stats.
  virtual const char* name() const = 0;
  // The pool the KvStore will own. Called once, before any ComputeVerify.
  virtual absl::StatusOr<std::unique_ptr<KvStorage>> CreateStorage(int num_layers,
                                                                   int64_t capacity_slots) = 0;
  // The same with the rows' dtype (SPEC §1 "KV storage dtype"). The cpu and cuda backends store
  // both; a backend that does not override it stores bf16 only, and fp8 is FAILED_PRECONDITION
  // (the daemon's start fails with this message).
  virtual absl::StatusOr<std::unique_ptr<KvStorage>> CreateStorage(int num_layers,
                                                                   int64_t capacity_slots,
                                                                   KvDtype dtype) {
    if (dtype == KvDtype::kBf16) return CreateStorage(num_layers, capacity_slots);
    return absl::FailedPreconditionError(absl::StrCat("--kv_dtype=", KvDtypeName(dtype), ": the ",
                                                      name(),
                                                      " backend stores bf16 rows only; use "
                                                      "--kv_dtype=bf16"));
  }

  // Whether ComputeVerify needs problem.slot_indptr / problem.slots as concatenated host arrays.
  // A backend that answers false gets them null and reads `slot_lists` instead, so the caller
  // never copies the (long) prefix lists.
  virtual bool needs_host_slot_lists() const { return true; }

  // Computes `problem` over `layer` of the storage: the caller fills everything but kv and
  // num_slots, with host pointers (q, out, lse and the index arrays). `slot_lists` is either empty
  // (problem.slots / slot_indptr hold every list) or one entry per sequence of the batch, in batch
  // order; with needs_host_slot_lists() the caller fills the concatenated arrays as well.
  virtual absl::Status ComputeVerify(int layer, VerifyProblem problem,
                                     absl::Span<const VerifySlotList> slot_lists) = 0;
  // The concatenated form only (tests and tools that build problems without a store).
  absl::Status ComputeVerify(int layer, VerifyProblem problem) {
    return ComputeVerify(layer, problem, {});
  }

  // The sequence was released (or its lease expired): whatever the backend remembers about it
  // (a device mirror of its slot list) can go. A later sequence with the same id has another
  // slot generation, so forgetting is about memory, not correctness.
  virtual void ForgetSequence(SequenceId sequence) { (void)sequence; }

  // What a ComputeVerify did with CUDA graphs, for verifyd_cuda_graph_*_total. A backend without
  // graphs (cpu) never reports.
  enum class GraphEvent { kCapture, kReplay, kFallback };
  // Memory the pool may take, for --kv-memory-fraction: free device memory now (cuda), physical
  // memory (cpu). UNIMPLEMENTED for a backend that cannot tell.
  virtual absl::StatusOr<int64_t> AvailableMemoryBytes() const {
    return absl::UnimplementedError(
        absl::StrCat("the ", name(), " backend cannot size the pool from --kv-memory-fraction"));
  }

  // Called once before any ComputeVerify; the observer runs on the executor thread.
  virtual void SetGraphObserver(std::function<void(GraphEvent)> observer) { (void)observer; }

  // Host memory the daemon maps for clients' tensors (shared-memory regions). A backend that
  // answers true registers [data, data + bytes) with its device once, and from then on copies a
  // q / out / lse lying wholly inside one registered range straight from / into it (DMA) instead
  // of through its host staging. Both calls run on gRPC threads while ComputeVerify may run on the
  // executor. The caller unregisters a range before unmapping it and never while a ComputeVerify
  // uses it (a call pins the regions it names until it has finished).
  virtual bool can_register_host_memory() const { return false; }
  // An error leaves the range unregistered: calls using it take the staging path.
  virtual absl::Status RegisterHostMemory(void* data, size_t bytes) {
    (void)data;
    (void)bytes;
    return absl::UnimplementedError(
        absl::StrCat("the ", name(), " backend does not register host memory"));
  }
  // `data` as given to a successful RegisterHostMemory; anything else is ignored.
  virtual void UnregisterHostMemory(void* data) { (void)data; }

  // The co-located data plane (external_tensors.h). A backend that cannot open external memory
  // answers UNIMPLEMENTED, and the service refuses registrations on it. OpenExternalRegion runs
  // on a gRPC handler thread (it may take milliseconds) while ComputeVerify runs on the executor;
  // the region's destructor runs on whichever thread drops the last holder, never while a call
  // uses it.
  virtual absl::StatusOr<std::unique_ptr<ExternalRegion>> OpenExternalRegion(
      const ExternalMemoryHandle& handle) {
    (void)handle;
    return absl::UnimplementedError(
        absl::StrCat("the ", name(), " backend does not open external memory"));
  }
  // Writes the tree KV and computes attention for `call`, ordered by call.order. `slot_lists` as
  // for ComputeVerify. On any error after the ready wait the outputs are NaN and the done flag
  // is still written; the returned Status says why.
  virtual absl::Status ComputeVerifyExternal(const ExternalVerify& call,
                                             absl::Span<const VerifySlotList> slot_lists) {
    (void)call;
    (void)slot_lists;
    return absl::UnimplementedError(
        absl::StrCat("the ", name(), " backend does not compute on external tensors"));
  }
  // NaN-fills the outputs of a call that will not be computed and writes its done flag, ordered
  // like ComputeVerifyExternal (external_tensors.h, ExternalFailure). An error means the flag
  // could not be written either.
  virtual absl::Status FailVerifyExternal(const ExternalFailure& failure) {
    (void)failure;
    return absl::UnimplementedError(
        absl::StrCat("the ", name(), " backend does not compute on external tensors"));
  }
  // Releases a device-side wait for `ready` that will never be satisfied (the scheduler that
  // should write it is gone): a backend whose ready wait sits on a device stream (cuda) writes
  // the flag itself from elsewhere, so the stream and every later call go on. A backend that
  // waits on a host thread (cpu) uses ExternalOrder::cancelled instead and has nothing to do.
  virtual absl::Status ReleaseExternalWait(const ExternalFlag& ready) {
    (void)ready;
    return absl::OkStatus();
  }
  // Whether the ready flag of an external call can be waited for on any host thread (cpu: flags
  // are host memory and the backend's own wait blocks its caller). Then the daemon waits on the
  // channel's thread (WaitReadyOnHost) before it hands the call over, so that a flag that never
  // comes holds that channel only, not the executor every client's calls go through.
  virtual bool waits_for_ready_on_host() const { return false; }
  // Thread-safe. OK once *ready.word >= ready.value; DEADLINE_EXCEEDED after the backend's bound,
  // ABORTED once *cancelled; the messages ComputeVerifyExternal's own wait gives.
  virtual absl::Status WaitReadyOnHost(const ExternalFlag& ready,
                                       const std::atomic<bool>* cancelled) const {
    (void)ready;
    (void)cancelled;
    return absl::UnimplementedError(
        absl::StrCat("the ", name(), " backend waits for ready flags in its own order"));
  }
  // Whether an opened region's data() is host memory the daemon may read (cpu: a mapped file) or
  // a device pointer (cuda): Append from a device region is checked and written by the storage on
  // the device (KvStorage::WriteDeviceRows), from a host one by the service and the host path.
  virtual bool external_memory_is_host() const { return false; }
  // Whether this process's work on the device shares it through MPS (cuda: the device's
  // CU_DEVICE_ATTRIBUTE_MPS_ENABLED, read at creation); false for a backend without a device.
  virtual bool mps_active() const { return false; }
  // The attention kernel this backend runs (the startup line names it), e.g. the cuda backend's
  // "sm90a-wgmma" or "portable-mma-sync"; both of its kernels read both pool dtypes.
  virtual std::string attention_kernel() const { return name(); }
  // The device's UUID as nvidia-smi and DCGM print it ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
  // base/gpu_uuid.h), for the metrics' join with DCGM; "" for a backend without a GPU (an empty
  // label is no label to Prometheus: a join finds nothing, which is the truth).
  virtual std::string gpu_uuid() const { return ""; }
};

}  // namespace verifyd
