// The decode-step bench's model process (tools/bench/decode_step_bench.cc): its dimensions, the
// layout of its tensors in one device region, its own GPU work per layer (a GEMM), and the clock
// that times each layer on its stream. Shared by the ways that drive verifyd's backend directly
// and the ways that go through a daemon (decode_step_daemon.h).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/align.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "tools/bench/decode_step_fill.h"
#include "verify/mla_dims.h"

namespace verifyd::decode_step {

#define BENCH_CHECK(expr)                                                        \
  do {                                                                           \
    const absl::Status bench_status_ = (expr);                                   \
    if (!bench_status_.ok()) {                                                   \
      std::fprintf(stderr, "%s: %s\n", #expr, bench_status_.ToString().c_str()); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

inline absl::Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, " failed: cublasStatus ", static_cast<int>(s)));
}

struct Dims {
  int layers, prefix, nodes, heads, accept, steps, warmup;
  int total_steps() const { return steps + warmup; }
  int64_t capacity() const { return prefix + int64_t{total_steps() + 1} * nodes + 64; }
};

// The model's tensors of one layer in its region, and the two flag words after them.
struct Region {
  std::vector<size_t> q, kv, out, lse;
  size_t ready = 0, done = 0, bytes = 0;
};
inline Region LayOut(const Dims& d) {
  Region r;
  size_t at = 0;
  const size_t rows = static_cast<size_t>(d.nodes) * d.heads;
  for (int l = 0; l < d.layers; ++l) {
    r.q.push_back(at);
    r.kv.push_back(at = AlignTo256(at + rows * kKvDim * 2));
    r.out.push_back(at = AlignTo256(at + size_t(d.nodes) * kKvDim * 2));
    r.lse.push_back(at = AlignTo256(at + rows * kVDim * 2));
    at = AlignTo256(at + rows * 4);
  }
  r.ready = at;
  r.done = at + 256;
  r.bytes = at + 512;
  return r;
}

// The model's own GPU work per layer.
class Gemm {
 public:
  absl::Status Init(int n, cudaStream_t stream) {
    n_ = n;
    VERIFYD_RETURN_IF_ERROR(CublasStatus(cublasCreate(&handle_), "cublasCreate"));
    VERIFYD_CUDA_CHECK(cudaMalloc(&a_, size_t{4096} * 4096 * 2));
    VERIFYD_CUDA_CHECK(cudaMalloc(&b_, size_t{4096} * n * 2));
    VERIFYD_CUDA_CHECK(cudaMalloc(&c_, size_t{4096} * n * 2));
    VERIFYD_RETURN_IF_ERROR(FillRandom(a_, int64_t{4096} * 4096, 1, 1.f, stream));
    VERIFYD_RETURN_IF_ERROR(FillRandom(b_, int64_t{4096} * n, 2, 1.f, stream));
    return absl::OkStatus();
  }
  // A workspace of its own (the captured way's): a GEMM captured into a CUDA graph then
  // allocates nothing inside the capture, and every replay uses the same memory.
  absl::Status UseWorkspace(size_t bytes) {
    VERIFYD_CUDA_CHECK(cudaMalloc(&workspace_, bytes));
    workspace_bytes_ = bytes;
    return absl::OkStatus();
  }
  absl::Status Run(cudaStream_t stream) {
    const float one = 1.f, zero = 0.f;
    VERIFYD_RETURN_IF_ERROR(CublasStatus(cublasSetStream(handle_, stream), "cublasSetStream"));
    if (workspace_ != nullptr) {  // after cublasSetStream, which resets it to cuBLAS's own
      VERIFYD_RETURN_IF_ERROR(CublasStatus(
          cublasSetWorkspace(handle_, workspace_, workspace_bytes_), "cublasSetWorkspace"));
    }
    return CublasStatus(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 4096, n_, 4096, &one, a_,
                                     CUDA_R_16BF, 4096, b_, CUDA_R_16BF, 4096, &zero, c_,
                                     CUDA_R_16BF, 4096, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                        "cublasGemmEx");
  }
  ~Gemm() {
    if (handle_ != nullptr) cublasDestroy(handle_);
    cudaFree(a_), cudaFree(b_), cudaFree(c_), cudaFree(workspace_);
  }

 private:
  int n_ = 0;
  cublasHandle_t handle_ = nullptr;
  void *a_ = nullptr, *b_ = nullptr, *c_ = nullptr, *workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

// Per-layer and per-step times from events recorded on the model's stream after every layer.
struct Timing {
  double ms_per_step = 0, p50_us = 0, p99_us = 0;
};
class LayerClock {
 public:
  absl::Status Init(const Dims& d) {
    events_.resize(static_cast<size_t>(d.steps) * d.layers + 1);
    for (cudaEvent_t& e : events_) VERIFYD_CUDA_CHECK(cudaEventCreate(&e));
    return absl::OkStatus();
  }
  ~LayerClock() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  // Event n of the timed part (0: before the first timed layer).
  absl::Status Mark(size_t n, cudaStream_t stream) {
    VERIFYD_CUDA_CHECK(cudaEventRecord(events_[n], stream));
    return absl::OkStatus();
  }
  // Event n itself, for a way that records it from inside a CUDA graph (decode_step_step_graph.h).
  cudaEvent_t event(size_t n) const { return events_[n]; }
  absl::StatusOr<Timing> Read(const Dims& d) {
    VERIFYD_CUDA_CHECK(cudaEventSynchronize(events_.back()));
    std::vector<double> layer_us;
    for (size_t i = 1; i < events_.size(); ++i) {
      float ms = 0;
      VERIFYD_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]));
      layer_us.push_back(ms * 1e3);
    }
    float total = 0;
    VERIFYD_CUDA_CHECK(cudaEventElapsedTime(&total, events_.front(), events_.back()));
    std::sort(layer_us.begin(), layer_us.end());
    Timing t;
    t.ms_per_step = total / d.steps;
    t.p50_us = layer_us[layer_us.size() / 2];
    t.p99_us = layer_us[std::min(layer_us.size() - 1, layer_us.size() * 99 / 100)];
    return t;
  }

 private:
  std::vector<cudaEvent_t> events_;
};

// The model's buffers: q and tree KV random (as the model's projections would leave them).
inline absl::StatusOr<uint8_t*> MakeModelRegion(const Dims& d, const Region& r,
                                                cudaStream_t stream) {
  void* base = nullptr;
  VERIFYD_CUDA_CHECK(cudaMalloc(&base, r.bytes));
  VERIFYD_CUDA_CHECK(cudaMemsetAsync(base, 0, r.bytes, stream));
  auto* b = static_cast<uint8_t*>(base);
  for (int l = 0; l < d.layers; ++l) {
    VERIFYD_RETURN_IF_ERROR(
        FillRandom(b + r.q[l], int64_t{d.nodes} * d.heads * kKvDim, 100 + l, 0.25f, stream));
    VERIFYD_RETURN_IF_ERROR(
        FillRandom(b + r.kv[l], int64_t{d.nodes} * kKvDim, 200 + l, 1.f, stream));
  }
  VERIFYD_CUDA_CHECK(cudaStreamSynchronize(stream));
  return b;
}

}  // namespace verifyd::decode_step
