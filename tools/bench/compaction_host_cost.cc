// Host cost of KvStore::PlanCompaction and ExecuteCompaction apart from the copy (not a test;
// figures go to plans/0011-run-compaction.md). A one-layer store is fragmented so that one plan
// holds runs of exactly T slots, then planned and executed over a storage whose CopyRuns checks
// the contract (SlotCopyCheck::CheckRuns, as every storage does) but moves no bytes: what is
// timed is the store's bookkeeping (checks, slot tables, allocator) plus the contract check, the
// host work a device copy overlaps with. The copy itself is measured on the GPU by
// tools/bench/compaction_bench.cc. Printed per run and per slot for several T; then
// compaction_bench's layout converged plan by plan (Converge).
// Usage: compaction_host_cost [capacity=131072] [converge_capacity=262144] [repeats=5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "kvstore/kv_storage.h"
#include "kvstore/kv_store.h"
#include "tests/kvstore/kv_test_util.h"
#include "verify/mla_dims.h"
#include "verify/slot_copy_check.h"

namespace verifyd {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// HostKvStorage whose run copy stops after the contract check.
class ContractCheckOnlyStorage : public HostKvStorage {
 public:
  ContractCheckOnlyStorage(int layers, int64_t capacity)
      : HostKvStorage(layers, capacity), check_(capacity) {}
  absl::Status CopyRuns(absl::Span<const SlotRunCopy> runs) override {
    return check_.CheckRuns(runs);
  }

 private:
  SlotCopyCheck check_;
};

struct Sample {
  int64_t runs = 0, slots = 0;
  double plan_s = 0, execute_s = 0;
};

// Sequences appended round-robin in chunks of T tokens, every other released: the first plan
// moves each survivor's second chunk into the hole after its first, one run of T per sequence.
Sample Measure(int64_t capacity, int run_slots) {
  KvStoreOptions options;
  options.num_layers = 1;
  KvStore store(options, std::make_unique<ContractCheckOnlyStorage>(1, capacity));
  const int rounds = 4;
  const int64_t sequences = capacity * 3 / 4 / (rounds * run_slots);
  const std::vector<bf16_bits> kv = testing_kv::HashedRows(7, run_slots);
  for (int round = 0; round < rounds; ++round) {
    for (int64_t seq = 1; seq <= sequences; ++seq) {
      if (!store.Append(seq, 0, 1, run_slots, kv.data()).ok()) std::abort();
    }
  }
  for (int64_t seq = 2; seq <= sequences; seq += 2) {
    if (!store.Release(seq).ok()) std::abort();
  }
  Sample s;
  auto start = Clock::now();
  const CompactionPlan plan = store.PlanCompaction(int64_t{1} << 50);
  s.plan_s = Since(start);
  s.runs = static_cast<int64_t>(plan.runs.size());
  s.slots = plan.slots();
  start = Clock::now();
  if (!store.ExecuteCompaction(plan).ok()) std::abort();
  s.execute_s = Since(start);
  return s;
}

// compaction_bench's layout (sequences of `rounds` runs of 32 tokens appended round-robin into
// 3/4 of the pool, every other one released), compacted plan after plan until converged, each
// plan executed whole: the host time of every plan, execute and Stats() on the way (the share of a
// compaction that no copy overlaps when it runs between chunks or operations).
void Converge(int64_t capacity, int rounds) {
  KvStoreOptions options;
  options.num_layers = 1;
  KvStore store(options, std::make_unique<ContractCheckOnlyStorage>(1, capacity));
  const int tokens = 32;
  const int64_t sequences = capacity * 3 / 4 / (int64_t{rounds} * tokens);
  const std::vector<bf16_bits> kv = testing_kv::HashedRows(7, tokens);
  for (int round = 0; round < rounds; ++round) {
    for (int64_t seq = 1; seq <= sequences; ++seq) {
      if (!store.Append(seq, 0, 1, tokens, kv.data()).ok()) std::abort();
    }
  }
  for (int64_t seq = 2; seq <= sequences; seq += 2) {
    if (!store.Release(seq).ok()) std::abort();
  }
  std::printf("\nconverging %lld sequences of %d runs x %d slots (capacity %lld):\n",
              static_cast<long long>(sequences / 2), rounds, tokens,
              static_cast<long long>(capacity));
  std::printf("%6s %8s %8s %10s %12s %10s %12s\n", "plan", "runs", "slots", "plan ms", "execute ms",
              "stats ms", "outside");
  double plan_total = 0, execute_total = 0;
  for (int k = 1; k <= 100; ++k) {
    auto start = Clock::now();
    const CompactionPlan plan = store.PlanCompaction(int64_t{1} << 50);
    const double plan_s = Since(start);
    if (plan.runs.empty()) break;
    start = Clock::now();
    if (!store.ExecuteCompaction(plan).ok()) std::abort();
    const double execute_s = Since(start);
    start = Clock::now();
    const StoreStats stats = store.Stats();
    const double stats_s = Since(start);
    plan_total += plan_s;
    execute_total += execute_s;
    std::printf("%6d %8zu %8lld %10.3f %12.3f %10.4f %12lld\n", k, plan.runs.size(),
                static_cast<long long>(plan.slots()), plan_s * 1e3, execute_s * 1e3, stats_s * 1e3,
                static_cast<long long>(stats.fragmentation.tokens_outside_first_run));
  }
  std::printf("total: plan %.3f ms, execute %.3f ms\n", plan_total * 1e3, execute_total * 1e3);
}

}  // namespace
}  // namespace verifyd

int main(int argc, char** argv) {
  const int64_t capacity = argc > 1 ? std::max(1024L, std::atol(argv[1])) : 131072;
  const int reps = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
  std::printf("%6s %8s %8s %10s %12s %18s %18s %14s\n", "T", "runs", "slots", "plan ms",
              "execute ms", "execute ns/slot", "execute ns/run", "plan ns/slot");
  for (int t : {1, 4, 32, 256}) {
    std::vector<verifyd::Sample> samples;
    for (int rep = 0; rep < reps; ++rep) samples.push_back(verifyd::Measure(capacity, t));
    // The fastest of the repeats: the least disturbed by other processes on a shared machine.
    const verifyd::Sample s =
        *std::min_element(samples.begin(), samples.end(),
                          [](const auto& a, const auto& b) { return a.execute_s < b.execute_s; });
    std::printf("%6d %8lld %8lld %10.3f %12.3f %18.1f %18.1f %14.1f\n", t,
                static_cast<long long>(s.runs), static_cast<long long>(s.slots), s.plan_s * 1e3,
                s.execute_s * 1e3, s.execute_s * 1e9 / s.slots, s.execute_s * 1e9 / s.runs,
                s.plan_s * 1e9 / s.slots);
  }
  verifyd::Converge(argc > 2 ? std::max(1024L, std::atol(argv[2])) : 262144, 8);
  return 0;
}
