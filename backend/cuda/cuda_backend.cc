#include "backend/cuda/cuda_backend.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/mla_verify_launch.h"
#include "kernels/tree_kv_write.h"
#include "kernels/value_bound_check.h"
#include "verify/mla_dims.h"
#include "verify/verify_reference.h"

namespace verifyd {
void CudaBackend::Lap(std::chrono::steady_clock::time_point* since, int64_t* total) {
  const auto now = std::chrono::steady_clock::now();
  *total += std::chrono::duration_cast<std::chrono::nanoseconds>(now - *since).count();
  *since = now;
}

bool CudaBackendAvailable(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error of any later call
    return false;
  }
  return device >= 0 && device < count;
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(CudaBackendOptions options) {
  if (!CudaBackendAvailable(options.device)) {
    return absl::FailedPreconditionError(
        absl::StrCat("device = ", options.device, " is not a visible CUDA device"));
  }
  VERIFYD_ASSIGN_OR_RETURN(std::shared_ptr<CudaStream> stream, CudaStream::Create(options.device));
  VERIFYD_ASSIGN_OR_RETURN(int num_sms, CurrentDeviceSmCount());
  // Reporting only (startup line, Stats, gauge): a driver too old to answer means no MPS report,
  // not a backend that cannot verify.
  const bool mps = MpsActive(options.device).value_or(false);
  // Reporting only too (the metrics' join with DCGM): unknown is "", not a failed start.
  std::string uuid = GpuUuid(options.device).value_or("");
  auto backend =
      std::unique_ptr<CudaBackend>(new CudaBackend(std::move(options), std::move(stream), num_sms));
  backend->mps_active_ = mps;
  backend->gpu_uuid_ = std::move(uuid);
  // Made now: creating a stream takes the driver's context lock, which a thread blocked behind a
  // scheduler's device wait may hold when the release is needed (plans/0018).
  VERIFYD_CUDA_CHECK(cudaStreamCreateWithFlags(&backend->rescue_stream_, cudaStreamNonBlocking));
  VERIFYD_CUDA_CHECK(cudaStreamCreateWithFlags(&backend->upload_stream_, cudaStreamNonBlocking));
  // Mapped pinned memory cannot grow later (an external call's ready wait may hold the stream
  // that growing waits for): the value check's host words are sized once, here.
  VERIFYD_RETURN_IF_ERROR(
      backend->external_value_host_.AllocateMapped(kExternalStagingRing * kValueWordsBytes));
  std::memset(backend->external_value_host_.get(), 0xff, kExternalStagingRing * kValueWordsBytes);
  return backend;
}

CudaBackend::~CudaBackend() {
  if (stream_->MakeDeviceCurrent().ok()) stream_->Synchronize().IgnoreError();
  if (rescue_stream_ != nullptr && cudaStreamDestroy(rescue_stream_) != cudaSuccess) {
    cudaGetLastError();
  }
  if (upload_stream_ != nullptr && cudaStreamDestroy(upload_stream_) != cudaSuccess) {
    cudaGetLastError();
  }
  if (inputs_zeroed_ != nullptr && cudaEventDestroy(inputs_zeroed_) != cudaSuccess) {
    cudaGetLastError();
  }
  for (RingStaging& ring : external_staging_) {
    for (cudaEvent_t event : {ring.uploaded, ring.upload_done}) {
      if (event != nullptr && cudaEventDestroy(event) != cudaSuccess) cudaGetLastError();
    }
  }
}

absl::StatusOr<int64_t> CudaBackend::AvailableMemoryBytes() const {
  VERIFYD_RETURN_IF_ERROR(stream_->MakeDeviceCurrent());
  size_t free_bytes = 0, total_bytes = 0;
  VERIFYD_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(free_bytes);
}

absl::StatusOr<std::unique_ptr<KvStorage>> CudaBackend::CreateStorage(int num_layers,
                                                                      int64_t capacity_slots) {
  return CreateStorage(num_layers, capacity_slots, KvDtype::kBf16);
}

absl::StatusOr<std::unique_ptr<KvStorage>> CudaBackend::CreateStorage(int num_layers,
                                                                      int64_t capacity_slots,
                                                                      KvDtype dtype) {
  if (storage_ != nullptr) return absl::FailedPreconditionError("CudaBackend storage exists");
  VERIFYD_ASSIGN_OR_RETURN(std::unique_ptr<CudaKvStorage> storage,
                           CudaKvStorage::Create(num_layers, capacity_slots, stream_, dtype));
  const int64_t arena_entries = options_.slot_arena_entries > 0
                                    ? options_.slot_arena_entries
                                    : 2 * capacity_slots + (int64_t{1} << 16);
  VERIFYD_RETURN_IF_ERROR(
      slot_arena_.Reserve(static_cast<size_t>(arena_entries) * sizeof(int32_t), *stream_).status());
  // Zeroed once: an entry the bookkeeping never wrote still names a valid slot.
  VERIFYD_CUDA_CHECK(cudaMemsetAsync(slot_arena_.get(), 0, slot_arena_.capacity(), stream_->get()));
  mirror_ = std::make_unique<SlotMirror>(arena_entries);
  storage_ = storage.get();
  return std::unique_ptr<KvStorage>(std::move(storage));
}

absl::Status CudaBackend::RegisterHostMemory(void* data, size_t bytes) {
  if (data == nullptr || bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host memory to register (", bytes, " bytes) must be non-null and non-empty"));
  }
  // The calling thread (a gRPC handler) has no current device of its own choosing.
  VERIFYD_RETURN_IF_ERROR(stream_->MakeDeviceCurrent());
  const cudaError_t registered = cudaHostRegister(data, bytes, cudaHostRegisterPortable);
  if (registered != cudaSuccess) {
    cudaGetLastError();  // not sticky; keep this thread's later checks truthful
    return absl::UnavailableError(absl::StrCat("cudaHostRegister of ", bytes,
                                               " bytes failed: ", cudaGetErrorString(registered)));
  }
  if (absl::Status added = host_ranges_.Add(data, bytes); !added.ok()) {
    cudaHostUnregister(data);
    cudaGetLastError();
    return added;
  }
  return absl::OkStatus();
}

void CudaBackend::UnregisterHostMemory(void* data) {
  if (!host_ranges_.Remove(data)) return;
  if (!stream_->MakeDeviceCurrent().ok()) return;
  if (cudaHostUnregister(data) != cudaSuccess) cudaGetLastError();
}

void CudaBackend::ForgetSequence(SequenceId sequence) {
  if (mirror_) mirror_->Forget(sequence);
}

absl::StatusOr<CudaBackend::PlannedCall> CudaBackend::PlanCall(
    int layer, VerifyProblem& problem, absl::Span<const VerifySlotList> slot_lists,
    absl::FunctionRef<absl::Status(absl::Span<const VerifySlotList>)> check_lists,
    std::chrono::steady_clock::time_point* clock, int reserved_sms) {
  if (storage_ == nullptr) return absl::FailedPreconditionError("CudaBackend has no storage");
  if (layer < 0 || layer >= storage_->num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer = ", layer, " must be < ", storage_->num_layers()));
  }
  VERIFYD_RETURN_IF_ERROR(stream_->MakeDeviceCurrent());
  // One of the two, by the pool's dtype (verify_problem.h): the kernels read kv_fp8 when set.
  if (storage_->dtype() == KvDtype::kFp8) {
    problem.kv = nullptr;
    problem.kv_fp8 = storage_->layer_device_bytes(layer);
  } else {
    problem.kv = storage_->layer_device_data(layer);
    problem.kv_fp8 = nullptr;
  }
  problem.num_slots = storage_->capacity_slots();
  if (problem.out == nullptr) return absl::InvalidArgumentError("out must be set");
  // Everything is checked before any of it reaches a kernel: an index out of range there would
  // fault the device and take every sequence down with it. With slot lists, only the entries the
  // mirror uploads are checked (in Plan): the rest is on the device already, checked on its way.
  PlannedCall planned;
  planned.lists = slot_lists;
  if (slot_lists.empty()) {
    VERIFYD_RETURN_IF_ERROR(ValidateVerifyProblem(problem));
    host_lists_.clear();
    for (int b = 0; b < problem.batch; ++b) {
      const int32_t* list = problem.slots + problem.slot_indptr[b];
      const size_t prefix = static_cast<size_t>(problem.prefix_len[b]);
      const size_t nodes = static_cast<size_t>(problem.qo_indptr[b + 1] - problem.qo_indptr[b]);
      host_lists_.push_back(VerifySlotList{0, 0, absl::MakeConstSpan(list, prefix),
                                           absl::MakeConstSpan(list + prefix, nodes)});
    }
    planned.lists = host_lists_;
  } else {
    VERIFYD_RETURN_IF_ERROR(ValidateProblemWithSlotLists(problem, slot_lists));
  }
  VERIFYD_RETURN_IF_ERROR(check_lists(planned.lists));
  Lap(clock, &phase_times_.check_ns);
  // The tree KV of this layer (one WriteRows per sequence) goes down in one copy and one kernel,
  // ahead of the attention in stream order.
  VERIFYD_RETURN_IF_ERROR(storage_->FlushWrites());

  q_len_.resize(problem.batch);
  for (int b = 0; b < problem.batch; ++b) {
    q_len_[b] = problem.qo_indptr[b + 1] - problem.qo_indptr[b];
  }
  VERIFYD_ASSIGN_OR_RETURN(
      planned.plan, plans_.Get(absl::MakeConstSpan(problem.prefix_len, problem.batch), q_len_,
                               problem.num_heads, reserved_sms));
  VERIFYD_ASSIGN_OR_RETURN(planned.slots, mirror_->Plan(planned.lists, storage_->capacity_slots()));
  Lap(clock, &phase_times_.plan_ns);
  return planned;
}

std::string CudaBackend::attention_kernel() const { return FlashKernelName(options_.flash_path); }

absl::Status CudaBackend::ComputeVerify(int layer, VerifyProblem problem,
                                        absl::Span<const VerifySlotList> slot_lists) {
  auto clock = std::chrono::steady_clock::now();
  VERIFYD_ASSIGN_OR_RETURN(
      const PlannedCall planned,
      PlanCall(
          layer, problem, slot_lists,
          [](absl::Span<const VerifySlotList>) { return absl::OkStatus(); }, &clock));
  ++phase_times_.calls;
  const absl::Status ran =
      RunPlannedHost(layer, problem, planned.lists, *planned.plan, *planned.slots, clock);
  // The mirror recorded this call's uploads as done; when they may not have reached the arena,
  // nothing it remembers can be trusted.
  if (!ran.ok()) mirror_->Clear();
  return ran;
}

absl::StatusOr<VerifyStagingLayout> CudaBackend::LayoutAndGrowArena(const VerifyProblem& problem,
                                                                    const CachedPlan& plan,
                                                                    const SlotMirrorPlan& slots) {
  const VerifyStagingLayout layout = LayoutVerifyStaging(
      problem, static_cast<size_t>(slots.num_values), plan.packed.size(), plan.layout.total_bytes);
  const size_t arena_bytes = static_cast<size_t>(mirror_->arena_entries()) * sizeof(int32_t);
  if (arena_bytes > slot_arena_.capacity()) {
    // Only a reset grows the mirror's arena, so no mirrored entry is lost with the old buffer.
    if (!slots.reset) return absl::InternalError("slot arena grew without a mirror reset");
    VERIFYD_RETURN_IF_ERROR(slot_arena_.Reserve(arena_bytes, *stream_).status());
    VERIFYD_CUDA_CHECK(
        cudaMemsetAsync(slot_arena_.get(), 0, slot_arena_.capacity(), stream_->get()));
  }
  return layout;
}

absl::StatusOr<CudaBackend::StagedCall> CudaBackend::Stage(
    const VerifyStagingLayout& layout, const VerifyProblem& problem,
    absl::Span<const VerifySlotList> lists, const CachedPlan& plan, const SlotMirrorPlan& slots,
    DirectCopies direct, PinnedBuffer* staging) {
  VERIFYD_RETURN_IF_ERROR(staging->Reserve(layout.upload_copy_bytes, *stream_).status());
  VERIFYD_ASSIGN_OR_RETURN(const bool inputs_grew, inputs_.Reserve(layout.input_bytes, *stream_));
  // A grown buffer is zeroed on the backend's stream: an upload on another stream must wait for
  // that (EnqueueUploadAhead).
  inputs_zeroing_pending_ |= inputs_grew;
  StagedCall staged;
  staged.layout = layout;
  staged.direct = direct;
  staged.upload = StagedUpload(layout, direct);
  staged.readback = StagedOutputs(layout, direct);
  staged.staging = staging;
  FillVerifyStaging(layout, problem, slots.list_offset, plan.packed, staging->get(), &copier_,
                    /*stage_q=*/!direct.q);
  WriteSlotUploads(lists, slots, staging->as<SlotScatterHeader>(layout.slot_header),
                   staging->as<SlotScatterRun>(layout.slot_runs),
                   staging->as<int32_t>(layout.slot_values));
  staged.arena = slot_arena_.as<int32_t>();
  staged.device_problem =
      PlaceVerifyProblem(layout, problem, inputs_.get(), outputs_.get(), staged.arena);
  staged.workspace = inputs_.as<void>(layout.workspace);
  return staged;
}

absl::Status CudaBackend::EnqueueUpload(const StagedCall& staged, cudaStream_t stream) {
  VERIFYD_CUDA_CHECK(cudaMemcpyAsync(inputs_.as<void>(staged.upload.offset),
                                     staged.staging->as<void>(staged.upload.offset),
                                     staged.upload.bytes, cudaMemcpyHostToDevice, stream));
  return LaunchScatter(staged, stream);
}

absl::Status CudaBackend::LaunchScatter(const StagedCall& staged, cudaStream_t stream,
                                        const FirstOutOfBoundArgs& check,
                                        const TreeRowWriteArgs& tree) {
  const VerifyStagingLayout& layout = staged.layout;
  const SlotScatterArgs scatter{inputs_.as<SlotScatterHeader>(layout.slot_header),
                                inputs_.as<SlotScatterRun>(layout.slot_runs),
                                inputs_.as<int32_t>(layout.slot_values), staged.arena};
  return LaunchSlotScatterAndFirstOutOfBound(scatter, check, stream, tree);
}

absl::Status CudaBackend::EnqueueUploadAhead(const StagedCall& staged, RingStaging& ring) {
  if (ring.upload_done == nullptr) {
    VERIFYD_CUDA_CHECK(cudaEventCreateWithFlags(&ring.upload_done, cudaEventDisableTiming));
  }
  if (inputs_released_ != nullptr) {
    VERIFYD_CUDA_CHECK(cudaStreamWaitEvent(upload_stream_, inputs_released_, 0));
  }
  if (inputs_zeroing_pending_) {
    // The fresh inputs' memset is on the backend's stream (DeviceBuffer::Reserve); the copy must
    // land after it, or the memset may zero the upload (seen on the GPU: a zeroed plan and tree
    // slots, plans/0031, change 8). Once per growth, so the overlap is lost only then.
    if (inputs_zeroed_ == nullptr) {
      VERIFYD_CUDA_CHECK(cudaEventCreateWithFlags(&inputs_zeroed_, cudaEventDisableTiming));
    }
    VERIFYD_CUDA_CHECK(cudaEventRecord(inputs_zeroed_, stream_->get()));
    VERIFYD_CUDA_CHECK(cudaStreamWaitEvent(upload_stream_, inputs_zeroed_, 0));
    inputs_zeroing_pending_ = false;
  }
  VERIFYD_CUDA_CHECK(cudaMemcpyAsync(inputs_.as<void>(staged.upload.offset),
                                     staged.staging->as<void>(staged.upload.offset),
                                     staged.upload.bytes, cudaMemcpyHostToDevice, upload_stream_));
  VERIFYD_CUDA_CHECK(cudaEventRecord(ring.upload_done, upload_stream_));
  VERIFYD_CUDA_CHECK(cudaStreamWaitEvent(stream_->get(), ring.upload_done, 0));
  return absl::OkStatus();
}

VerifyGraphBucket CudaBackend::GraphBucket(int layer, const VerifyProblem& problem,
                                           const CachedPlan& plan, const StagedCall& staged,
                                           bool external) const {
  VerifyGraphBucket bucket;
  bucket.layer = layer;
  bucket.batch = problem.batch;
  bucket.total_q_bucket = TotalQBucket(problem.total_q);
  bucket.num_heads = problem.num_heads;
  bucket.lse = problem.lse != nullptr;
  bucket.combine = !plan.plan.combine.empty();
  bucket.direct = staged.direct;
  bucket.external = external;
  return bucket;
}

VerifyGraphParams CudaBackend::GraphParams(const VerifyProblem& problem, const CachedPlan& plan,
                                           const StagedCall& staged) const {
  VerifyGraphParams params;
  params.staging = staged.staging->get();
  params.device_inputs = inputs_.get();
  params.device_outputs = outputs_.get();
  params.host_outputs = host_outputs_.get();
  params.slot_arena = staged.arena;
  // The layer's rows whichever the dtype (a backend's pool has one): the kernels' KV address.
  params.kv = problem.kv_fp8 != nullptr ? static_cast<const void*>(problem.kv_fp8) : problem.kv;
  params.num_slots = problem.num_slots;
  params.num_work = static_cast<int>(plan.plan.work.size());
  params.num_combine = static_cast<int>(plan.plan.combine.size());
  params.num_partials = plan.plan.num_partials;
  params.scale = problem.scale;
  params.total_q = problem.total_q;
  params.layout = staged.layout;
  return params;
}

absl::StatusOr<GraphOutcome> CudaBackend::EnqueueCaptured(
    const VerifyGraphBucket& bucket, const VerifyGraphParams& params,
    absl::FunctionRef<absl::Status(cudaStream_t)> enqueue) {
  if (options_.cuda_graphs) return graphs_.Run(bucket, params, enqueue, stream_->get());
  VERIFYD_RETURN_IF_ERROR(enqueue(stream_->get()));
  return GraphOutcome::kEager;
}

void CudaBackend::CountEager(GraphOutcome outcome) {
  if (outcome == GraphOutcome::kEager || outcome == GraphOutcome::kWarmup) ++eager_runs_;
}

void CudaBackend::ObserveGraph(GraphOutcome outcome) {
  if (!graph_observer_ || !options_.cuda_graphs) return;
  switch (outcome) {
    case GraphOutcome::kInstantiated:
    case GraphOutcome::kUpdated:
      graph_observer_(GraphEvent::kCapture);
      graph_observer_(GraphEvent::kReplay);
      break;
    case GraphOutcome::kReplayed:
      graph_observer_(GraphEvent::kReplay);
      break;
    case GraphOutcome::kEager:
      graph_observer_(GraphEvent::kFallback);
      break;
    case GraphOutcome::kWarmup:  // eager by design, not a failure of the graph path
      break;
  }
}

absl::Status CudaBackend::RunPlannedHost(int layer, const VerifyProblem& problem,
                                         absl::Span<const VerifySlotList> lists,
                                         const CachedPlan& plan, const SlotMirrorPlan& slots,
                                         std::chrono::steady_clock::time_point clock) {
  VERIFYD_ASSIGN_OR_RETURN(const VerifyStagingLayout layout,
                           LayoutAndGrowArena(problem, plan, slots));
  VERIFYD_RETURN_IF_ERROR(outputs_.Reserve(layout.output_copy_bytes, *stream_).status());
  VERIFYD_RETURN_IF_ERROR(host_outputs_.Reserve(layout.output_copy_bytes, *stream_).status());
  // The staging is free: the previous host call synchronized before returning.
  VERIFYD_ASSIGN_OR_RETURN(const StagedCall staged,
                           Stage(layout, problem, lists, plan, slots,
                                 ChooseDirectCopies(layout, problem, host_ranges_), &staging_));
  const DirectCopies& direct = staged.direct;
  Lap(&clock, &phase_times_.stage_ns);

  auto enqueue = [&](cudaStream_t stream) -> absl::Status {
    VERIFYD_RETURN_IF_ERROR(EnqueueUpload(staged, stream));
    VERIFYD_RETURN_IF_ERROR(LaunchMlaVerify(staged.device_problem, plan.plan, plan.layout,
                                            staged.workspace, stream,
                                            VerifyStages::kFlashAndCombine, options_.flash_path));
    if (staged.readback.bytes > 0) {
      VERIFYD_CUDA_CHECK(cudaMemcpyAsync(host_outputs_.as<void>(staged.readback.offset),
                                         outputs_.as<void>(staged.readback.offset),
                                         staged.readback.bytes, cudaMemcpyDeviceToHost, stream));
    }
    return absl::OkStatus();
  };
  // The direct copies stand outside any graph (the header says why), in stream order around it;
  // exact sizes, so nothing of the caller's memory beyond its tensors is written.
  auto enqueue_all = [&]() -> absl::StatusOr<GraphOutcome> {
    if (direct.q) {
      VERIFYD_CUDA_CHECK(cudaMemcpyAsync(inputs_.as<void>(layout.q), problem.q, layout.q_bytes,
                                         cudaMemcpyHostToDevice, stream_->get()));
    }
    VERIFYD_ASSIGN_OR_RETURN(const GraphOutcome outcome,
                             EnqueueCaptured(GraphBucket(layer, problem, plan, staged, false),
                                             GraphParams(problem, plan, staged), enqueue));
    if (direct.out) {
      VERIFYD_CUDA_CHECK(cudaMemcpyAsync(problem.out, outputs_.as<void>(layout.out),
                                         layout.out_bytes, cudaMemcpyDeviceToHost, stream_->get()));
    }
    if (direct.lse) {
      VERIFYD_CUDA_CHECK(cudaMemcpyAsync(problem.lse, outputs_.as<void>(layout.lse),
                                         layout.lse_bytes, cudaMemcpyDeviceToHost, stream_->get()));
    }
    return outcome;
  };
  const absl::StatusOr<GraphOutcome> outcome = enqueue_all();
  if (!outcome.ok()) {
    // Part of the sequence may be queued: it finishes before the next call refills the staging.
    stream_->Synchronize().IgnoreError();
    return outcome.status();
  }
  CountEager(*outcome);
  Lap(&clock, &phase_times_.enqueue_ns);
  // The one wait of a Verify: the host needs the outputs.
  VERIFYD_RETURN_IF_ERROR(stream_->Synchronize());
  Lap(&clock, &phase_times_.wait_ns);
  if (!direct.out) copier_.Copy(problem.out, host_outputs_.as<void>(layout.out), layout.out_bytes);
  if (problem.lse != nullptr && !direct.lse) {
    std::memcpy(problem.lse, host_outputs_.as<void>(layout.lse), layout.lse_bytes);
  }
  direct_copies_.q += direct.q;
  direct_copies_.out += direct.out;
  direct_copies_.lse += direct.lse;
  Lap(&clock, &phase_times_.copy_out_ns);
  ObserveGraph(*outcome);
  return absl::OkStatus();
}

}  // namespace verifyd
