#include "service/cuda_backend.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_check.h"
#include "kernels/mla_verify_launch.h"
#include "kernels/status_macros.h"
#include "kernels/verify_reference.h"

namespace verifyd {

bool CudaBackendAvailable(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error of any later call
    return false;
  }
  return device >= 0 && device < count;
}

absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateCudaBackend(const ServiceOptions& options) {
  CudaBackendOptions cuda;
  cuda.device = options.device;
  cuda.cuda_graphs = options.cuda_graphs;
  VERIFYD_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::Create(cuda));
  return std::unique_ptr<ComputeBackend>(std::move(backend));
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(CudaBackendOptions options) {
  if (!CudaBackendAvailable(options.device)) {
    return absl::FailedPreconditionError(
        absl::StrCat("device = ", options.device, " is not a visible CUDA device"));
  }
  VERIFYD_ASSIGN_OR_RETURN(std::shared_ptr<CudaStream> stream, CudaStream::Create(options.device));
  VERIFYD_ASSIGN_OR_RETURN(int num_sms, CurrentDeviceSmCount());
  return std::unique_ptr<CudaBackend>(
      new CudaBackend(std::move(options), std::move(stream), num_sms));
}

CudaBackend::~CudaBackend() {
  if (stream_->MakeDeviceCurrent().ok()) stream_->Synchronize().IgnoreError();
}

absl::StatusOr<std::unique_ptr<KvStorage>> CudaBackend::CreateStorage(int num_layers,
                                                                      int64_t capacity_slots) {
  if (storage_ != nullptr) return absl::FailedPreconditionError("CudaBackend storage exists");
  VERIFYD_ASSIGN_OR_RETURN(std::unique_ptr<CudaKvStorage> storage,
                           CudaKvStorage::Create(num_layers, capacity_slots, stream_));
  storage_ = storage.get();
  return std::unique_ptr<KvStorage>(std::move(storage));
}

absl::Status CudaBackend::ComputeVerify(int layer, VerifyProblem problem) {
  if (storage_ == nullptr) return absl::FailedPreconditionError("CudaBackend has no storage");
  if (layer < 0 || layer >= storage_->num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer = ", layer, " must be < ", storage_->num_layers()));
  }
  VERIFYD_RETURN_IF_ERROR(stream_->MakeDeviceCurrent());
  problem.kv = storage_->layer_device_data(layer);
  problem.num_slots = storage_->capacity_slots();
  // The host arrays are checked before any of them reaches a kernel: an index out of range there
  // would fault the device and take every sequence down with it.
  VERIFYD_RETURN_IF_ERROR(ValidateVerifyProblem(problem));
  if (problem.out == nullptr) return absl::InvalidArgumentError("out must be set");
  // The tree KV of this layer (one WriteRows per sequence) goes down in one copy and one kernel,
  // ahead of the attention in stream order.
  VERIFYD_RETURN_IF_ERROR(storage_->FlushWrites());

  q_len_.resize(problem.batch);
  for (int b = 0; b < problem.batch; ++b) {
    q_len_[b] = problem.qo_indptr[b + 1] - problem.qo_indptr[b];
  }
  VERIFYD_ASSIGN_OR_RETURN(const CachedPlan* plan,
                           plans_.Get(absl::MakeConstSpan(problem.prefix_len, problem.batch),
                                      q_len_, problem.num_heads));
  const VerifyStagingLayout layout =
      LayoutVerifyStaging(problem, plan->packed.size(), plan->layout.total_bytes);

  // Grown before anything is enqueued or captured: growth waits for the stream and frees memory.
  VERIFYD_RETURN_IF_ERROR(staging_.Reserve(layout.upload_copy_bytes, *stream_).status());
  VERIFYD_RETURN_IF_ERROR(inputs_.Reserve(layout.input_bytes, *stream_).status());
  VERIFYD_RETURN_IF_ERROR(outputs_.Reserve(layout.output_copy_bytes, *stream_).status());
  VERIFYD_RETURN_IF_ERROR(host_outputs_.Reserve(layout.output_copy_bytes, *stream_).status());
  // The previous call synchronized the stream before returning, so the staging buffer is free.
  FillVerifyStaging(layout, problem, plan->packed, staging_.get());
  const VerifyProblem device_problem =
      PlaceVerifyProblem(layout, problem, inputs_.get(), outputs_.get());
  void* workspace = inputs_.as<void>(layout.workspace);

  auto enqueue = [&](cudaStream_t stream) -> absl::Status {
    VERIFYD_CUDA_CHECK(cudaMemcpyAsync(inputs_.get(), staging_.get(), layout.upload_copy_bytes,
                                       cudaMemcpyHostToDevice, stream));
    VERIFYD_RETURN_IF_ERROR(
        LaunchMlaVerify(device_problem, plan->plan, plan->layout, workspace, stream));
    VERIFYD_CUDA_CHECK(cudaMemcpyAsync(host_outputs_.get(), outputs_.get(),
                                       layout.output_copy_bytes, cudaMemcpyDeviceToHost, stream));
    return absl::OkStatus();
  };

  absl::StatusOr<GraphOutcome> outcome = GraphOutcome::kEager;
  if (options_.cuda_graphs) {
    VerifyGraphBucket bucket;
    bucket.layer = layer;
    bucket.batch = problem.batch;
    bucket.total_q_bucket = TotalQBucket(problem.total_q);
    bucket.num_heads = problem.num_heads;
    bucket.lse = problem.lse != nullptr;
    bucket.combine = !plan->plan.combine.empty();
    VerifyGraphParams params;
    params.staging = staging_.get();
    params.device_inputs = inputs_.get();
    params.device_outputs = outputs_.get();
    params.host_outputs = host_outputs_.get();
    params.kv = problem.kv;
    params.num_slots = problem.num_slots;
    params.plan_id = plan->id;
    params.scale = problem.scale;
    params.total_q = problem.total_q;
    params.layout = layout;
    outcome = graphs_.Run(bucket, params, enqueue, stream_->get());
  } else if (absl::Status enqueued = enqueue(stream_->get()); !enqueued.ok()) {
    outcome = enqueued;
  }
  if (!outcome.ok()) {
    // Part of the sequence may be queued: let it finish before the next call refills the staging.
    stream_->Synchronize().IgnoreError();
    return outcome.status();
  }
  if (*outcome == GraphOutcome::kEager || *outcome == GraphOutcome::kWarmup) ++eager_runs_;
  // The one wait of a Verify: the host needs the outputs.
  VERIFYD_RETURN_IF_ERROR(stream_->Synchronize());
  std::memcpy(problem.out, host_outputs_.as<void>(layout.out), layout.out_bytes);
  if (problem.lse != nullptr) {
    std::memcpy(problem.lse, host_outputs_.as<void>(layout.lse), layout.lse_bytes);
  }
  if (graph_observer_ && options_.cuda_graphs) {
    switch (*outcome) {
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
  return absl::OkStatus();
}

}  // namespace verifyd
