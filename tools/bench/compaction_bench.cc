// Compaction throughput the way the daemon runs it (SPEC §5: compaction bytes/s ÷ device-to-device
// copy bandwidth measured in the same run; must >= 0.5, goal >= 0.7). Not a test: run on a GPU by
// tools/device/compaction_bench.sh; figures go to plans/0011-run-compaction.md.
//
// Per layer count: a KvStore over a CudaKvStorage is fragmented (sequences appended in interleaved
// chunks, every other one released), then CompactionManager operations ("until converged", the
// daemon's chunking, auto chunk size unless --chunk_bytes) run until no fragmentation is left.
// Timed end to end: planning, host bookkeeping, uploads, copies and the final wait, each
// operation's wall time split by the manager's own accounting (plan / execute / final wait /
// stats / other; see HostSplit) so the host share can be attributed. Afterwards
// every surviving sequence must read back exactly the KV it was given, on every layer.
// Also: cudaMemcpy D2D (median of repeats), the run-copy kernel alone (CUDA events), and
// CopyRuns back to back (host check + upload + launch, no bookkeeping).
//
// --storage=host runs the same flow on HostKvStorage (small sizes; no GPU needed), which is how
// the flow itself is checked on a machine without a device.
//
// Flags (--name=value): layers=61,2 capacity=262144 chunk_tokens=32 rounds=8 fill=0.75
// chunk_bytes=0 (auto) verify_every=1 storage=cuda|host
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "backend/cuda/cuda_device_memory.h"
#include "backend/cuda/cuda_kv_storage.h"
#include "executor/compaction_manager.h"
#include "executor/executor_metrics.h"
#include "kernels/kv_copy_kernels.h"
#include "kvstore/kv_storage.h"
#include "kvstore/kv_store.h"
#include "verify/bf16.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Options {
  std::vector<int> layers = {61, 2};
  int64_t capacity = 262144;
  int chunk_tokens = 32;
  int rounds = 8;
  double fill = 0.75;
  int64_t chunk_bytes = 0;
  int verify_every = 1;
  bool host = false;
};

bool ParseOptions(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::fprintf(stderr, "bad argument %s (want --name=value)\n", arg.c_str());
      return false;
    }
    const std::string name = arg.substr(2, eq - 2);
    const std::string value = arg.substr(eq + 1);
    bool ok = true;
    if (name == "layers") {
      o.layers.clear();
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        int l = 0;
        ok = ok && absl::SimpleAtoi(part, &l) && l >= 1;
        o.layers.push_back(l);
      }
    } else if (name == "capacity") {
      ok = absl::SimpleAtoi(value, &o.capacity) && o.capacity >= 16;
    } else if (name == "chunk_tokens") {
      ok = absl::SimpleAtoi(value, &o.chunk_tokens) && o.chunk_tokens >= 1;
    } else if (name == "rounds") {
      ok = absl::SimpleAtoi(value, &o.rounds) && o.rounds >= 2;
    } else if (name == "fill") {
      ok = absl::SimpleAtod(value, &o.fill) && o.fill > 0 && o.fill < 1;
    } else if (name == "chunk_bytes") {
      ok = absl::SimpleAtoi(value, &o.chunk_bytes) && o.chunk_bytes >= 0;
    } else if (name == "verify_every") {
      ok = absl::SimpleAtoi(value, &o.verify_every) && o.verify_every >= 1;
    } else if (name == "storage") {
      ok = value == "cuda" || value == "host";
      o.host = value == "host";
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "bad value for --%s: %s\n", name.c_str(), value.c_str());
      return false;
    }
  }
  return true;
}

// The KV every row is given: a row of a random block (cheap to produce at 18 GB) with its first
// four values replaced by a hash of (sequence, layer, position), so every row is unique and a row
// read from the wrong slot, layer or sequence is caught.
class KvPattern {
 public:
  KvPattern() : block_(static_cast<size_t>(kBlockRows) * kKvDim) {
    std::mt19937_64 rng(20261129);
    for (bf16_bits& x : block_) x = static_cast<bf16_bits>(rng() | 0x4000u);
  }

  void Row(uint64_t seq, int layer, int64_t position, bf16_bits* out) const {
    const uint64_t h = Hash(seq, layer, position);
    std::memcpy(out, block_.data() + (h % kBlockRows) * kKvDim, kKvRowBytes);
    for (int k = 0; k < 4; ++k) out[k] = static_cast<bf16_bits>((h >> (16 * k)) | 0x4000u);
  }

 private:
  static constexpr int64_t kBlockRows = 4096;
  static uint64_t Hash(uint64_t seq, int layer, int64_t position) {
    uint64_t x = seq * 0x9e3779b97f4a7c15ull ^ (uint64_t(layer) << 40) ^ uint64_t(position);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
  std::vector<bf16_bits> block_;
};

absl::StatusOr<std::unique_ptr<KvStorage>> MakeStorage(const Options& o, int layers) {
  if (o.host) return std::unique_ptr<KvStorage>(new HostKvStorage(layers, o.capacity));
  auto stream = CudaStream::Create(0);
  if (!stream.ok()) return stream.status();
  auto storage = CudaKvStorage::Create(layers, o.capacity, *std::move(stream));
  if (!storage.ok()) return storage.status();
  return std::unique_ptr<KvStorage>(std::move(*storage));
}

// Sequences 1..S appended round-robin in chunks of chunk_tokens (every layer per call), then the
// even ones released: each survivor holds `rounds` runs separated by holes.
int Fragment(const Options& o, int layers, const KvPattern& pattern, KvStore& store,
             std::vector<uint64_t>& survivors) {
  const int64_t per_sequence = int64_t{o.rounds} * o.chunk_tokens;
  const auto sequences = static_cast<uint64_t>(o.fill * o.capacity / per_sequence);
  std::vector<bf16_bits> kv(static_cast<size_t>(layers) * o.chunk_tokens * kKvDim);
  for (int round = 0; round < o.rounds; ++round) {
    for (uint64_t seq = 1; seq <= sequences; ++seq) {
      for (int l = 0; l < layers; ++l) {
        for (int t = 0; t < o.chunk_tokens; ++t) {
          pattern.Row(seq, l, int64_t{round} * o.chunk_tokens + t,
                      kv.data() + (static_cast<size_t>(l) * o.chunk_tokens + t) * kKvDim);
        }
      }
      const absl::Status s = store.Append(seq, 0, layers, o.chunk_tokens, kv.data());
      if (!s.ok()) {
        std::fprintf(stderr, "append: %s\n", s.ToString().c_str());
        return 1;
      }
    }
  }
  for (uint64_t seq = 2; seq <= sequences; seq += 2) {
    if (!store.Release(seq).ok()) return 1;
  }
  for (uint64_t seq = 1; seq <= sequences; seq += 2) survivors.push_back(seq);
  return 0;
}

// Every verify_every-th survivor, every layer, every position.
int64_t CountMismatches(const Options& o, int layers, const KvPattern& pattern,
                        const KvStore& store, const std::vector<uint64_t>& survivors) {
  int64_t mismatches = 0;
  std::vector<bf16_bits> got, want(kKvDim);
  for (size_t i = 0; i < survivors.size(); i += o.verify_every) {
    const uint64_t seq = survivors[i];
    const int64_t n = *store.CommittedLength(seq);
    got.resize(static_cast<size_t>(n) * kKvDim);
    for (int l = 0; l < layers; ++l) {
      if (!store.ReadCommitted(seq, l, got.data()).ok()) return -1;
      for (int64_t p = 0; p < n; ++p) {
        pattern.Row(seq, l, p, want.data());
        mismatches += std::memcmp(want.data(), got.data() + p * kKvDim, kKvRowBytes) != 0;
      }
    }
  }
  return mismatches;
}

// cudaMemcpy device to device, bytes copied per second: median of 10 event-timed copies.
double MeasureD2D() {
  const size_t bytes = size_t{256} << 20;
  void *a = nullptr, *b = nullptr;
  cudaEvent_t e0, e1;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess ||
      cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
    return 0;
  }
  cudaMemset(a, 1, bytes);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  std::vector<double> rates;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(e0);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    rates.push_back(bytes / (ms * 1e-3));
  }
  cudaFree(a);
  cudaFree(b);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return Median(rates);
}

// Runs of run_slots slots, about chunk_bytes in all: sources from the bottom half of the pool,
// destinations from the top half, both shuffled (so runs land anywhere).
std::vector<SlotRunCopy> SyntheticRuns(int64_t capacity, int layers, int64_t chunk_bytes,
                                       int run_slots, std::mt19937_64& rng) {
  const int64_t half_pieces = capacity / 2 / run_slots;
  const int64_t want =
      std::max<int64_t>(1, chunk_bytes / (int64_t{layers} * kKvRowBytes) / run_slots);
  const int64_t count = std::min(want, half_pieces);
  std::vector<int32_t> src(half_pieces), dst(half_pieces);
  for (int64_t i = 0; i < half_pieces; ++i) {
    src[i] = static_cast<int32_t>(i * run_slots);
    dst[i] = static_cast<int32_t>(capacity / 2 + i * run_slots);
  }
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<SlotRunCopy> runs(count);
  for (int64_t i = 0; i < count; ++i) runs[i] = {src[i], dst[i], run_slots};
  return runs;
}

// The run kernel alone: table already on the device, 20 launches between two events.
double MeasureKernel(CudaKvStorage& storage, const std::vector<SlotRunCopy>& runs) {
  std::vector<int32_t> table(4 * runs.size());
  const int64_t segments = PackCopyRunTable(runs, storage.row_bytes(), table.data());
  int32_t* device_table = nullptr;
  cudaEvent_t e0, e1;
  if (cudaMalloc(reinterpret_cast<void**>(&device_table), table.size() * 4) != cudaSuccess ||
      cudaMemcpy(device_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice) !=
          cudaSuccess ||
      cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
    return 0;
  }
  cudaStream_t stream = storage.stream().get();
  auto* pool = const_cast<uint8_t*>(storage.layer_device_bytes(0));
  int64_t slots = 0;
  for (const SlotRunCopy& r : runs) slots += r.length;
  const int iters = 20;
  bool ok = true;
  ok = ok && LaunchCopyRunsAllLayers(pool, storage.row_bytes(), storage.num_layers(),
                                     storage.capacity_slots(), device_table,
                                     static_cast<int>(runs.size()), segments, stream)
                 .ok();
  cudaEventRecord(e0, stream);
  for (int i = 0; i < iters && ok; ++i) {
    ok = LaunchCopyRunsAllLayers(pool, storage.row_bytes(), storage.num_layers(),
                                 storage.capacity_slots(), device_table,
                                 static_cast<int>(runs.size()), segments, stream)
             .ok();
  }
  cudaEventRecord(e1, stream);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaFree(device_table);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ok ? static_cast<double>(iters) * slots * storage.num_layers() * kKvRowBytes / (ms * 1e-3)
            : 0;
}

// CopyRuns back to back (contract check, staging, upload, launch; two copies queued at most),
// then the final wait: the storage's share of a compaction without the store's bookkeeping.
double MeasureCopyRuns(KvStorage& storage, const std::vector<SlotRunCopy>& runs) {
  int64_t slots = 0;
  for (const SlotRunCopy& r : runs) slots += r.length;
  if (!storage.CopyRuns(runs).ok() || !storage.WaitForCopies().ok()) return 0;
  const int iters = 20;
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) {
    if (!storage.CopyRuns(runs).ok()) return 0;
  }
  if (!storage.WaitForCopies().ok()) return 0;
  return static_cast<double>(iters) * slots * storage.num_layers() * kKvRowBytes /
         SecondsSince(start);
}

// Where an operation's wall time went, by the manager's own accounting: planning, ExecuteCompaction
// (host bookkeeping and the copy enqueue, which waits for the copy two chunks back, so on a GPU
// this is mostly copy time), the final wait for the device, Stats(); "other" is the rest (chunk
// slicing, the Step loop). Plan and stats time run while the device has at most two chunks queued
// (re-plans) or nothing (the first plan, stats): that is the host share no copy overlaps.
struct HostSplit {
  double wall = 0, plan = 0, execute = 0, final_wait = 0, stats = 0;
  int64_t plans = 0, chunks = 0, bytes = 0;

  static HostSplit Of(const CompactionOperation& op, double wall_seconds) {
    HostSplit s;
    s.wall = wall_seconds;
    s.plan = absl::ToDoubleSeconds(op.plan_time);
    s.final_wait = absl::ToDoubleSeconds(op.final_wait_time);
    s.execute = absl::ToDoubleSeconds(op.copy_time) - s.final_wait;
    s.stats = absl::ToDoubleSeconds(op.stats_time);
    s.plans = op.plans;
    s.chunks = op.chunks;
    s.bytes = op.bytes_moved;
    return s;
  }
  void Add(const HostSplit& o) {
    wall += o.wall;
    plan += o.plan;
    execute += o.execute;
    final_wait += o.final_wait;
    stats += o.stats;
    plans += o.plans;
    chunks += o.chunks;
    bytes += o.bytes;
  }
  void Print(const char* label) const {
    std::printf(
        "%s: %.3f ms wall = plan %.3f (%lld plans) + execute %.3f (%lld chunks) + final wait "
        "%.3f + stats %.3f + other %.3f ms; %.1f MB\n",
        label, wall * 1e3, plan * 1e3, static_cast<long long>(plans), execute * 1e3,
        static_cast<long long>(chunks), final_wait * 1e3, stats * 1e3,
        (wall - plan - execute - final_wait - stats) * 1e3, bytes / 1e6);
  }
};

int RunLayers(const Options& o, int layers, double d2d) {
  const KvPattern pattern;
  auto storage = MakeStorage(o, layers);
  if (!storage.ok()) {
    std::fprintf(stderr, "storage: %s\n", storage.status().ToString().c_str());
    return 1;
  }
  KvStorage* raw_storage = storage->get();
  KvStoreOptions store_options;
  store_options.num_layers = layers;
  KvStore store(store_options, *std::move(storage));
  std::vector<uint64_t> survivors;
  auto start = Clock::now();
  if (Fragment(o, layers, pattern, store, survivors) != 0) return 1;
  const StoreStats before = store.Stats();
  std::printf(
      "\n== layers %d, capacity %lld slots (%.2f GB pool): %zu sequences of %d runs x %d "
      "tokens after releasing every other one; fragmentation: %lld runs, %.3f of tokens "
      "outside their first run (filled in %.1f s)\n",
      layers, static_cast<long long>(o.capacity), 1e-9 * o.capacity * layers * kKvRowBytes,
      survivors.size(), o.rounds, o.chunk_tokens, static_cast<long long>(before.fragmentation.runs),
      before.fragmentation.fragmented_ratio(), SecondsSince(start));

  const int64_t chunk_bytes =
      o.chunk_bytes > 0 ? o.chunk_bytes : CompactionManager::ChunkBytesFor(o.host ? "cpu" : "cuda");
  NoExecutorMetrics metrics;
  CompactionManager manager(16, chunk_bytes, &metrics);
  int64_t bytes = 0, slots = 0, steps = 0, operations = 0;
  double copy_seconds = 0;
  {
    // One full plan, timed alone and discarded: the part of the host work that no copy overlaps.
    const auto plan_start = Clock::now();
    const CompactionPlan plan = store.PlanCompaction(int64_t{1} << 60);
    const double plan_ms = SecondsSince(plan_start) * 1e3;
    const auto stats_start = Clock::now();
    const StoreStats stats = store.Stats();
    std::printf(
        "host work no copy overlaps: one full plan %.3f ms (%zu runs, %lld slots); one "
        "Stats() %.3f ms (%lld tokens)\n",
        plan_ms, plan.runs.size(), static_cast<long long>(plan.slots()),
        SecondsSince(stats_start) * 1e3, static_cast<long long>(stats.fragmentation.tokens));
  }
  if (!raw_storage->WaitForCopies().ok()) return 1;
  start = Clock::now();
  // The operations' own before/after statistics decide when to stop (no extra store walks).
  int64_t outside_first_run = before.fragmentation.tokens_outside_first_run;
  HostSplit total;
  while (outside_first_run > 0 && operations < 100) {
    const auto op_start = Clock::now();
    const std::string id = manager.Create(0);
    while (manager.Step(store)) ++steps;
    const double op_seconds = SecondsSince(op_start);
    ++steps;
    ++operations;
    const CompactionOperation op = *manager.Get(id);
    if (op.state != CompactionOperation::State::kDone) {
      std::fprintf(stderr, "compaction failed: %s\n", op.error.c_str());
      return 1;
    }
    const HostSplit split = HostSplit::Of(op, op_seconds);
    total.Add(split);
    if (operations <= 8) split.Print(absl::StrCat("  operation ", operations).c_str());
    outside_first_run = op.after.tokens_outside_first_run;
    bytes += op.bytes_moved;
    slots += op.tokens_moved;
    copy_seconds += absl::ToDoubleSeconds(op.copy_time);
    if (op.bytes_moved == 0) break;
  }
  const double seconds = SecondsSince(start);
  total.Print(absl::StrCat("  all ", operations, " operations").c_str());
  const StoreStats after = store.Stats();
  std::printf(
      "compaction (CompactionManager, chunk %.1f MiB): %lld bytes (%lld slots) in %lld "
      "operations / %lld steps, %.4f s end to end -> %.1f GB/s",
      chunk_bytes / 1048576.0, static_cast<long long>(bytes), static_cast<long long>(slots),
      static_cast<long long>(operations), static_cast<long long>(steps), seconds,
      bytes / seconds / 1e9);
  if (d2d > 0) {
    std::printf(", ratio to D2D %.3f (must >= 0.5, goal >= 0.7)", bytes / seconds / d2d);
  }
  std::printf(
      "\n  operations' own figure (bytes / copy_time): %.1f GB/s; left: %lld runs, %.3f "
      "outside first runs\n",
      copy_seconds > 0 ? bytes / copy_seconds / 1e9 : 0.0,
      static_cast<long long>(after.fragmentation.runs), after.fragmentation.fragmented_ratio());
  start = Clock::now();
  const int64_t mismatches = CountMismatches(o, layers, pattern, store, survivors);
  std::printf(
      "  read back every %d-th of %zu sequences on all %d layers: %lld mismatched rows "
      "(%.1f s)\n",
      o.verify_every, survivors.size(), layers, static_cast<long long>(mismatches),
      SecondsSince(start));
  if (mismatches != 0) return 1;

  if (!o.host) {
    auto& cuda = static_cast<CudaKvStorage&>(store.storage());
    std::mt19937_64 rng(layers);
    for (int run_slots : {o.chunk_tokens, 1}) {
      const std::vector<SlotRunCopy> runs =
          SyntheticRuns(o.capacity, layers, chunk_bytes, run_slots, rng);
      const double kernel = MeasureKernel(cuda, runs);
      const double copy_runs = MeasureCopyRuns(cuda, runs);
      std::printf(
          "  runs of %3d slots, %zu runs (%.1f MiB): kernel alone %.1f GB/s (ratio %.3f); "
          "CopyRuns back to back %.1f GB/s (ratio %.3f)\n",
          run_slots, runs.size(), runs.size() * run_slots * layers * kKvRowBytes / 1048576.0,
          kernel / 1e9, kernel / d2d, copy_runs / 1e9, copy_runs / d2d);
    }
  }
  return 0;
}

int Run(int argc, char** argv) {
  Options o;
  if (!ParseOptions(argc, argv, o)) return 2;
  double d2d = 0;
  if (!o.host) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      std::printf("no CUDA device (--storage=host runs the flow on the CPU)\n");
      return 0;
    }
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    d2d = MeasureD2D();
    std::printf("%s: cudaMemcpy D2D %.1f GB/s (bytes copied per second, median of 10 x 256 MiB)\n",
                prop.name, d2d / 1e9);
  }
  for (int layers : o.layers) {
    if (RunLayers(o, layers, d2d) != 0) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace verifyd

int main(int argc, char** argv) { return verifyd::Run(argc, argv); }
