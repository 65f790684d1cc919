// Benchmark of the CUDA backend (not a test; run by hand on a GPU):
//  - ComputeVerify wall time (staging + H2D + kernels + D2H + sync + copy out) at SPEC §5's shapes,
//    graphs off (eager) and on (a repeated call: pure replay), and the ratio;
//  - compaction: CudaKvStorage::CopySlots bytes/s in 4 MB chunks ÷ cudaMemcpy device-to-device
//    bytes/s measured in the same run (SPEC §5: must >= 0.5, goal >= 0.7).
// Usage: cuda_backend_bench [iterations=50]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/mla_dims.h"
#include "kvstore/cuda_kv_kernels.h"
#include "tests/cuda_backend/cuda_test_util.h"
#include "tests/kernels/testing/problem_builder.h"

namespace verifyd {
namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  int batch, heads, nodes, prefix;
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// Median and p99 of ComputeVerify in microseconds.
std::pair<double, double> TimeVerify(CudaBackend& backend, test::HostProblem& host, int iters) {
  std::vector<double> us;
  for (int i = 0; i < iters + 3; ++i) {
    const auto start = Clock::now();
    const absl::Status s = backend.ComputeVerify(0, host.problem());
    const auto stop = Clock::now();
    if (!s.ok()) {
      std::fprintf(stderr, "ComputeVerify failed: %s\n", s.ToString().c_str());
      std::exit(1);
    }
    if (i >= 3) us.push_back(std::chrono::duration<double, std::micro>(stop - start).count());
  }
  return {Percentile(us, 0.5), Percentile(us, 0.99)};
}

int Run(int iters) {
  if (!test::HaveCudaDevice()) {
    std::printf("no CUDA device\n");
    return 0;
  }
  const Shape shapes[] = {{"S1", 1, 8, 16, 65536},  {"S2", 1, 64, 9, 16384},
                          {"S3", 1, 64, 33, 65536}, {"S4", 8, 16, 16, 8192},
                          {"S5", 32, 8, 8, 4096},   {"S6", 1, 128, 64, 131072},
                          {"S7", 1, 8, 16, 262144}};
  std::printf("ComputeVerify wall time, us (median / p99), %d iterations\n", iters);
  std::printf("%-4s %22s %22s %12s %s\n", "shape", "eager", "graph replay", "graph/eager",
              "graph counters (captures/updates/replays/fallbacks)");
  for (const Shape& s : shapes) {
    std::vector<test::SequenceSpec> specs(
        s.batch, test::SequenceSpec{s.prefix, s.nodes, test::TreeShape::kRandom});
    test::HostProblem host = test::MakeRandomProblem(specs, s.heads, 1234, /*scattered=*/false);
    auto eager = test::MakeBackend(false, 1, host.num_slots);
    auto graph = test::MakeBackend(true, 1, host.num_slots);
    if (!eager.ok() || !graph.ok()) {
      std::fprintf(stderr, "backend: %s %s\n", eager.status().ToString().c_str(),
                   graph.status().ToString().c_str());
      return 1;
    }
    const std::vector<int32_t> all = test::Iota(host.num_slots);
    if (!eager->storage->WriteRows(0, all, host.kv.data()).ok() ||
        !graph->storage->WriteRows(0, all, host.kv.data()).ok()) {
      return 1;
    }
    const auto e = TimeVerify(*eager->backend, host, iters);
    const auto g = TimeVerify(*graph->backend, host, iters);
    const GraphCounters& c = graph->backend->graph_counters();
    std::printf("%-4s %10.1f / %9.1f %10.1f / %9.1f %12.3f %lld/%lld/%lld/%lld\n", s.name, e.first,
                e.second, g.first, g.second, g.first / e.first, static_cast<long long>(c.captures),
                static_cast<long long>(c.updates), static_cast<long long>(c.replays),
                static_cast<long long>(c.fallbacks));
  }

  // Compaction: 8 layers, random disjoint slots, chunks of 4 MB (the daemon's default) to 64 MB.
  const int layers = 8;
  const int64_t capacity = 1 << 18;
  auto made = test::MakeBackend(true, layers, capacity);
  if (!made.ok()) return 1;
  CudaKvStorage& storage = made->cuda_storage();
  std::mt19937_64 rng(7);
  std::vector<int32_t> order = test::Iota(capacity);
  struct ChunkResult {
    double mb, median_us, bytes_per_s;
  };
  std::vector<ChunkResult> results;
  for (int64_t chunk_mb : {4, 16, 64}) {
    const int moves = static_cast<int>((chunk_mb << 20) / (int64_t{layers} * kKvRowBytes));
    const int chunks = 50;
    std::vector<double> seconds;
    for (int chunk = 0; chunk < chunks + 3; ++chunk) {
      std::shuffle(order.begin(), order.end(), rng);
      const std::vector<int32_t> src(order.begin(), order.begin() + moves);
      const std::vector<int32_t> dst(order.begin() + moves, order.begin() + 2 * moves);
      const auto start = Clock::now();
      if (!storage.CopySlots(src, dst).ok()) return 1;
      const auto stop = Clock::now();
      if (chunk >= 3) seconds.push_back(std::chrono::duration<double>(stop - start).count());
    }
    double total = 0;
    for (double t : seconds) total += t;
    const double chunk_bytes = static_cast<double>(moves) * layers * kKvRowBytes;
    results.push_back(
        {chunk_bytes / 1e6, Percentile(seconds, 0.5) * 1e6, chunk_bytes * chunks / total});
  }

  // Device-to-device copy bandwidth (bytes copied per second) on 256 MB, same convention.
  const size_t bytes = size_t{256} << 20;
  void* a = nullptr;
  void* b = nullptr;
  cudaEvent_t e0, e1;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess ||
      cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
    return 1;
  }
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e0);
  for (int i = 0; i < 10; ++i) cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  const double d2d_bps = 10.0 * bytes / (ms * 1e-3);
  std::printf("\ncudaMemcpy D2D %.1f GB/s (bytes copied per second)\n", d2d_bps / 1e9);
  for (const ChunkResult& r : results) {
    std::printf(
        "compaction chunk %6.2f MB: median %8.1f us, %7.1f GB/s, ratio to D2D %.3f "
        "(must >= 0.5, goal >= 0.7)\n",
        r.mb, r.median_us, r.bytes_per_s / 1e9, r.bytes_per_s / d2d_bps);
  }
  // The copy kernel alone (device-side indices, CUDA events): splits CopySlots' time into the GPU's
  // share and the host's (checks, staging, launch, wait).
  {
    const int moves = static_cast<int>((int64_t{64} << 20) / (int64_t{layers} * kKvRowBytes));
    std::shuffle(order.begin(), order.end(), rng);
    int32_t* idx = nullptr;
    if (cudaMalloc(reinterpret_cast<void**>(&idx), 2 * sizeof(int32_t) * moves) != cudaSuccess ||
        cudaMemcpy(idx, order.data(), 2 * sizeof(int32_t) * moves, cudaMemcpyHostToDevice) !=
            cudaSuccess) {
      return 1;
    }
    bf16_bits* pool = const_cast<bf16_bits*>(storage.layer_device_data(0));
    cudaStream_t stream = storage.stream().get();
    cudaEventRecord(e0, stream);
    for (int i = 0; i < 20; ++i) {
      if (!LaunchCopySlotsAllLayers(pool, layers, capacity, idx, idx + moves, moves, stream).ok()) {
        return 1;
      }
    }
    cudaEventRecord(e1, stream);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
    const double kernel_bps = 20.0 * moves * layers * kKvRowBytes / (ms * 1e-3);
    std::printf("copy kernel alone, 64 MB chunks: %7.1f GB/s, ratio to D2D %.3f\n",
                kernel_bps / 1e9, kernel_bps / d2d_bps);
    cudaFree(idx);
  }
  cudaFree(a);
  cudaFree(b);
  return 0;
}

}  // namespace
}  // namespace verifyd

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::max(1, std::atoi(argv[1])) : 50;
  return verifyd::Run(iters);
}
