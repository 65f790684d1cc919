// CudaBackend: Verify on the GPU over a CudaKvStorage pool, on the device's one stream.
//
// ComputeVerify: the problem's host arrays and the split plan are packed into pinned staging, one
// H2D copy, the flash + combine kernels over the layer's rows, one D2H copy of out (+ lse), one
// stream synchronization, and a copy into the caller's output. With graphs on, that sequence is a
// CUDA graph per shape bucket (service/cuda_graph_cache.h). Buffers grow geometrically and are
// reused; nothing is allocated per call once the largest shape has been seen.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/verify_problem.h"
#include "kvstore/cuda_device_memory.h"
#include "kvstore/cuda_kv_storage.h"
#include "service/compute_backend.h"
#include "service/cuda_graph_cache.h"
#include "service/cuda_plan_cache.h"
#include "service/service_options.h"

namespace verifyd {

struct CudaBackendOptions {
  int device = 0;
  bool cuda_graphs = true;
  // Executable graphs kept (buckets × layers).
  int max_graphs = 1024;
  // Batch shapes whose split plan is remembered.
  int plan_cache_entries = 8;
};

class CudaBackend : public ComputeBackend {
 public:
  // Selects the device, creates its stream, reads its SM count. FAILED_PRECONDITION when the device
  // is not visible.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(CudaBackendOptions options);

  // Waits for the stream: a queued copy may still use the buffers freed here.
  ~CudaBackend() override;

  const char* name() const override { return "cuda"; }
  absl::StatusOr<std::unique_ptr<KvStorage>> CreateStorage(int num_layers,
                                                           int64_t capacity_slots) override;
  absl::Status ComputeVerify(int layer, VerifyProblem problem) override;
  // kCapture for every stream capture (a new executable graph or an update of one), kReplay for
  // every graph launch, kFallback for an eager run because the graph path failed. A bucket's
  // first call (an eager warm-up by design) reports nothing.
  void SetGraphObserver(std::function<void(GraphEvent)> observer) override {
    graph_observer_ = std::move(observer);
  }

  const GraphCounters& graph_counters() const { return graphs_.counters(); }
  int64_t eager_runs() const { return eager_runs_; }
  int64_t plans_made() const { return plans_.plans_made(); }
  const CudaStream& stream() const { return *stream_; }

 private:
  CudaBackend(CudaBackendOptions options, std::shared_ptr<CudaStream> stream, int num_sms)
      : options_(std::move(options)),
        stream_(std::move(stream)),
        plans_(num_sms, options_.plan_cache_entries),
        graphs_(options_.max_graphs) {}

  CudaBackendOptions options_;
  std::shared_ptr<CudaStream> stream_;
  // Owned by the KvStore, which outlives the executor's use of this backend.
  CudaKvStorage* storage_ = nullptr;
  SplitPlanCache plans_;
  VerifyGraphCache graphs_;
  PinnedBuffer staging_;        // [inputs | plan]
  DeviceBuffer inputs_;         // [inputs | workspace]
  DeviceBuffer outputs_;        // [out | lse]
  PinnedBuffer host_outputs_;   // [out | lse]
  std::vector<int32_t> q_len_;  // scratch
  int64_t eager_runs_ = 0;
  std::function<void(GraphEvent)> graph_observer_;
};

// The factory's hooks (service/backend_factory.cc, VERIFYD_HAVE_CUDA_BACKEND).
bool CudaBackendAvailable(int device);
absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateCudaBackend(const ServiceOptions& options);

}  // namespace verifyd
