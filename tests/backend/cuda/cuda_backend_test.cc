// CudaBackend::ComputeVerify against the float64 oracle over random batches (contiguous and
// scattered slots), graph replay vs eager execution byte for byte, and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/backend/cuda/cuda_test_util.h"
#include "tests/testing/problem_builder.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using test::HostProblem;
using test::MakeRandomProblem;
using test::RandomSpecs;
using test::TreeShape;

constexpr double kTolerance = 1e-2;
constexpr int kLayers = 2;

// Puts the problem's whole KV pool into `layer` of the backend's storage (slot i = row i).
void UploadPool(test::BackendWithStorage& b, int layer, const HostProblem& host) {
  ASSERT_TRUE(b.storage->WriteRows(layer, test::Iota(host.num_slots), host.kv.data()).ok());
}

using CudaBackendTest = test::SeededCudaTest;

TEST_F(CudaBackendTest, RandomBatchesMatchTheFloat64Oracle) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  struct Case {
    int batch, max_prefix, max_nodes, heads;
  };
  const Case cases[] = {{1, 0, 16, 8},    {1, 3000, 257, 8}, {3, 2000, 64, 4}, {8, 1200, 16, 16},
                        {5, 300, 300, 2}, {1, 8000, 9, 64},  {32, 400, 8, 8},  {2, 2000, 1024, 1}};
  for (const Case& c : cases) {
    for (bool scattered : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "batch=" << c.batch << " heads=" << c.heads << " scattered=" << scattered);
      HostProblem host = MakeRandomProblem(RandomSpecs(rng_, c.batch, c.max_prefix, c.max_nodes),
                                           c.heads, rng_(), scattered, /*extra_slots=*/37);
      const test::ReferenceF64 reference = test::ComputeReferenceF64(host.problem());
      for (bool graphs : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "graphs=" << graphs);
        // A fresh backend per problem: its pool is exactly the problem's.
        auto made = test::MakeBackend(graphs, kLayers, host.num_slots);
        ASSERT_TRUE(made.ok()) << made.status();
        const int layer = static_cast<int>(rng_() % kLayers);
        UploadPool(*made, layer, host);
        // With graphs: warm-up, another bucket's warm-up, capture, pure replay.
        for (bool with_lse : {true, false, true, true}) {
          host.Poison();
          VerifyProblem p = host.problem();
          if (!with_lse) p.lse = nullptr;
          const absl::Status s = made->backend->ComputeVerify(layer, p);
          ASSERT_TRUE(s.ok()) << s;
          const test::Accuracy acc = test::Compare(reference, host.out, host.lse);
          EXPECT_LE(acc.out, kTolerance);
          if (with_lse) {
            EXPECT_LE(acc.lse, kTolerance);
          } else {
            for (float v : host.lse) ASSERT_TRUE(std::isnan(v)) << "lse written though not asked";
          }
        }
        const GraphCounters& g = made->backend->graph_counters();
        EXPECT_EQ(g.warmups, graphs ? 2 : 0);
        EXPECT_EQ(g.captures, graphs ? 1 : 0);
        EXPECT_EQ(g.replays, graphs ? 2 : 0);
        EXPECT_EQ(g.fallbacks, 0);
      }
    }
  }
}

// The backend forced onto the portable kernel (the one sm_80 and sm_120 run; a Hopper host
// otherwise runs the sm_90a one): random batches against float64, graphs on and off, both slot
// layouts.
TEST_F(CudaBackendTest, PortableKernelMatchesTheFloat64Oracle) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  for (bool scattered : {false, true}) {
    HostProblem host = MakeRandomProblem(RandomSpecs(rng_, 4, 3000, 257), 8, rng_(), scattered,
                                         /*extra_slots=*/37);
    const test::ReferenceF64 reference = test::ComputeReferenceF64(host.problem());
    for (bool graphs : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "graphs=" << graphs << " scattered=" << scattered);
      CudaBackendOptions options;
      options.cuda_graphs = graphs;
      options.flash_path = FlashPath::kPortable;
      auto made = test::MakeBackend(options, kLayers, host.num_slots);
      ASSERT_TRUE(made.ok()) << made.status();
      const int layer = static_cast<int>(rng_() % kLayers);
      UploadPool(*made, layer, host);
      for (int call = 0; call < 3; ++call) {  // graphs: warm-up, capture, replay
        host.Poison();
        const absl::Status s = made->backend->ComputeVerify(layer, host.problem());
        ASSERT_TRUE(s.ok()) << s;
        const test::Accuracy acc = test::Compare(reference, host.out, host.lse);
        EXPECT_LE(acc.out, kTolerance);
        EXPECT_LE(acc.lse, kTolerance);
      }
    }
  }
}

// The same sequence of calls on a graphs-on and a graphs-off backend: identical bytes, and the
// graph path exercised in all of its ways (warm-up, instantiate, replay as is, update).
TEST_F(CudaBackendTest, GraphReplayAndEagerGiveIdenticalBytes) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  std::vector<HostProblem> problems;
  // Shapes chosen to hit every path: repeats of one shape (replay), other prefix lengths of the
  // same bucket (update), other batch sizes (new buckets), and both layers.
  const int prefixes[] = {3000, 3000, 3100, 9000, 3000, 64};
  for (int prefix : prefixes) {
    problems.push_back(
        MakeRandomProblem({{prefix, 12, TreeShape::kRandom}, {prefix / 3, 5, TreeShape::kForest}},
                          16, rng_(), /*scattered=*/true, 11));
  }
  problems.push_back(MakeRandomProblem({{777, 40, TreeShape::kChain}}, 16, rng_(), true, 11));
  int64_t max_slots = 0;
  for (const HostProblem& p : problems) max_slots = std::max(max_slots, p.num_slots);

  auto on = test::MakeBackend(true, kLayers, max_slots);
  auto off = test::MakeBackend(false, kLayers, max_slots);
  ASSERT_TRUE(on.ok()) << on.status();
  ASSERT_TRUE(off.ok()) << off.status();
  int64_t captured = 0, replayed = 0, fell_back = 0, off_events = 0;
  on->backend->SetGraphObserver([&](ComputeBackend::GraphEvent event) {
    captured += event == ComputeBackend::GraphEvent::kCapture;
    replayed += event == ComputeBackend::GraphEvent::kReplay;
    fell_back += event == ComputeBackend::GraphEvent::kFallback;
  });
  off->backend->SetGraphObserver([&](ComputeBackend::GraphEvent) { ++off_events; });
  int calls = 0;
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < problems.size(); ++i) {
      HostProblem& host = problems[i];
      const int layer = static_cast<int>((i + round) % kLayers);
      // Each problem brings its own pool contents: write them to both backends' layer.
      UploadPool(*on, layer, host);
      UploadPool(*off, layer, host);
      for (int repeat = 0; repeat < 2; ++repeat) {
        host.Poison();
        ASSERT_TRUE(on->backend->ComputeVerify(layer, host.problem()).ok());
        const std::vector<bf16_bits> graph_out = host.out;
        const std::vector<float> graph_lse = host.lse;
        host.Poison();
        ASSERT_TRUE(off->backend->ComputeVerify(layer, host.problem()).ok());
        ASSERT_EQ(graph_out, host.out) << "problem " << i << " round " << round;
        ASSERT_EQ(0, std::memcmp(graph_lse.data(), host.lse.data(), host.lse.size() * 4));
        ++calls;
        if (round == 2 && repeat == 1) {
          // A request's own scale: only a kernel parameter changes, which a graph update takes.
          const int64_t updates_before = on->backend->graph_counters().updates;
          VerifyProblem scaled = host.problem();
          scaled.scale *= 0.75f;
          host.Poison();
          ASSERT_TRUE(on->backend->ComputeVerify(layer, scaled).ok());
          const std::vector<bf16_bits> scaled_graph_out = host.out;
          host.Poison();
          ASSERT_TRUE(off->backend->ComputeVerify(layer, scaled).ok());
          ASSERT_EQ(scaled_graph_out, host.out);
          EXPECT_EQ(on->backend->graph_counters().updates, updates_before + 1);
          ++calls;
        }
        if (round == 0 && repeat == 0) {
          const test::Accuracy acc = test::CompareToF64(host.problem(), host.out, host.lse);
          EXPECT_LE(acc.out, kTolerance);
          EXPECT_LE(acc.lse, kTolerance);
        }
      }
    }
  }
  const GraphCounters& g = on->backend->graph_counters();
  // Every call ran as a graph except each bucket's first (the eager warm-up).
  EXPECT_EQ(g.replays + g.warmups, calls);
  EXPECT_EQ(g.fallbacks, 0);
  EXPECT_GE(g.warmups, 2);
  EXPECT_GE(g.captures, 2);
  // Other prefix lengths change the plan's item counts and the slot upload's band here (these
  // problems have no store behind them: every call uploads whole lists), so updates happen.
  EXPECT_GE(g.updates, 2);
  // Round 2 repeats round 0's buckets, so each of its second calls is a pure replay at least.
  EXPECT_GE(g.replays - g.captures - g.updates, static_cast<int64_t>(problems.size()))
      << "repeats of an unchanged call must replay without capture";
  EXPECT_EQ(on->backend->eager_runs(), g.warmups);
  EXPECT_EQ(off->backend->eager_runs(), calls);
  EXPECT_EQ(off->backend->graph_counters().replays, 0);
  EXPECT_EQ(captured, g.captures + g.updates);
  EXPECT_EQ(replayed, g.replays);
  EXPECT_EQ(fell_back, 0);
  EXPECT_EQ(off_events, 0) << "graphs off: nothing to report";
  RecordProperty("warmups", static_cast<int>(g.warmups));
  RecordProperty("captures", static_cast<int>(g.captures));
  RecordProperty("updates", static_cast<int>(g.updates));
  RecordProperty("update_refusals", static_cast<int>(g.update_refusals));
}

TEST_F(CudaBackendTest, BadInputIsRefusedAndTheBackendKeepsServing) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  HostProblem host = MakeRandomProblem({{500, 20, TreeShape::kRandom}, {90, 7, TreeShape::kStar}},
                                       8, rng_(), /*scattered=*/true, 5);
  {
    CudaBackendOptions options;
    auto no_storage = CudaBackend::Create(options);
    ASSERT_TRUE(no_storage.ok()) << no_storage.status();
    EXPECT_EQ((*no_storage)->ComputeVerify(0, host.problem()).code(),
              absl::StatusCode::kFailedPrecondition);
  }
  auto made = test::MakeBackend(true, kLayers, host.num_slots);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->backend->CreateStorage(1, 10).status().code(),
            absl::StatusCode::kFailedPrecondition);
  UploadPool(*made, 1, host);
  absl::Status s = made->backend->ComputeVerify(kLayers, host.problem());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layer = 2"), std::string::npos) << s;

  const int32_t saved = host.slots[3];
  host.slots[3] = static_cast<int32_t>(host.num_slots);  // one past the pool
  s = made->backend->ComputeVerify(1, host.problem());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("slots[3]"), std::string::npos) << s;
  host.slots[3] = saved;

  host.Poison();
  ASSERT_TRUE(made->backend->ComputeVerify(1, host.problem()).ok());
  const test::Accuracy acc = test::CompareToF64(host.problem(), host.out, host.lse);
  EXPECT_LE(acc.out, kTolerance);
  EXPECT_LE(acc.lse, kTolerance);
}

}  // namespace
}  // namespace verifyd
