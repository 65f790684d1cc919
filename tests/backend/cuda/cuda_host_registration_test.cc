// CudaBackend with host memory registered by RegisterHostMemory (what the daemon does with its
// shared-memory regions): q / out / lse inside a registered range go straight between it and the
// device. The same random problems through the staged path and through a registered region give
// identical bytes (and both match the float64 oracle), graphs on and off; only the tensors'
// bytes in the region are written; registration's life cycle, and registration on another thread
// while Verify runs.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/backend/cuda/cuda_test_util.h"
#include "tests/testing/problem_builder.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using test::HostProblem;
using test::MakeRandomProblem;
using test::SharedMapping;
using test::TreeShape;

constexpr double kTolerance = 1e-2;
constexpr int kLayers = 2;

size_t Align64(size_t bytes) { return (bytes + 63) & ~size_t{63}; }

// Where one call's tensors sit in a region (the client library's layout: q | out | lse, each
// 64-byte aligned, here after a random guard so the offsets vary).
struct RegionLayout {
  size_t q = 0, out = 0, lse = 0, end = 0;
};
RegionLayout LayOut(const HostProblem& host, size_t guard) {
  RegionLayout l;
  l.q = guard;
  l.out = Align64(l.q + host.q.size() * sizeof(bf16_bits)) + guard;
  l.lse = Align64(l.out + host.out.size() * sizeof(bf16_bits)) + guard;
  l.end = Align64(l.lse + host.lse.size() * sizeof(float)) + guard;
  return l;
}

struct Outputs {
  std::vector<bf16_bits> out;
  std::vector<float> lse;
};

// Which tensors of a call live in the region (the rest in the host problem's own vectors).
struct Placement {
  bool q, out, lse;
};

class CudaHostRegistrationTest : public test::SeededCudaTest {
 protected:
  // Runs `host` with the tensors `where` says in `region` at `layout` (poisoned outputs there
  // first), returns the outputs wherever they were written.
  Outputs RunPlaced(CudaBackend& backend, int layer, HostProblem& host, uint8_t* region,
                    const RegionLayout& layout, Placement where, bool with_lse) {
    host.Poison();
    VerifyProblem p = host.problem();
    if (where.q) {
      std::memcpy(region + layout.q, host.q.data(), host.q.size() * sizeof(bf16_bits));
      p.q = reinterpret_cast<const bf16_bits*>(region + layout.q);
    }
    if (where.out) {
      std::memset(region + layout.out, 0xFF, host.out.size() * sizeof(bf16_bits));
      p.out = reinterpret_cast<bf16_bits*>(region + layout.out);
    }
    if (where.lse) {
      std::memset(region + layout.lse, 0xFF, host.lse.size() * sizeof(float));
      p.lse = reinterpret_cast<float*>(region + layout.lse);
    }
    if (!with_lse) p.lse = nullptr;
    const absl::Status s = backend.ComputeVerify(layer, p);
    EXPECT_TRUE(s.ok()) << s;
    Outputs o{host.out, host.lse};
    if (where.out) std::memcpy(o.out.data(), region + layout.out, o.out.size() * 2);
    if (where.lse) std::memcpy(o.lse.data(), region + layout.lse, o.lse.size() * 4);
    return o;
  }

  // A staged call with other q values: afterwards the device's q buffer holds bytes that differ
  // from host.q, so a direct call that failed to copy its q would not match the staged result.
  void RunDecoy(CudaBackend& backend, int layer, HostProblem& host) {
    const std::vector<bf16_bits> other_q = test::RandomValues(rng_, host.q.size(), 2.f);
    host.Poison();
    VerifyProblem p = host.problem();
    p.q = other_q.data();
    const absl::Status s = backend.ComputeVerify(layer, p);
    EXPECT_TRUE(s.ok()) << s;
  }
};

void ExpectSameBytes(const Outputs& a, const Outputs& b, bool with_lse) {
  ASSERT_EQ(a.out, b.out);
  if (with_lse) {
    ASSERT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)));
  }
}

TEST_F(CudaHostRegistrationTest, RegisteredRegionGivesTheStagedPathsBytes) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  struct Case {
    int batch, prefix, nodes, heads;
  };
  // S1-like, a batch of several, a large tree, many heads.
  const Case cases[] = {{1, 6000, 16, 8}, {5, 900, 12, 4}, {1, 1500, 257, 2}, {2, 700, 9, 64}};
  // All direct; q only; outputs only; out direct with lse staged; lse direct with out staged.
  const Placement placements[] = {{true, true, true},
                                  {true, false, false},
                                  {false, true, true},
                                  {false, true, false},
                                  {true, false, true}};
  for (const Case& c : cases) {
    std::vector<test::SequenceSpec> specs;
    for (int b = 0; b < c.batch; ++b) {
      specs.push_back({c.prefix - static_cast<int>(rng_() % (c.prefix / 2)),
                       1 + static_cast<int>(rng_() % c.nodes), static_cast<TreeShape>(rng_() % 4)});
    }
    HostProblem host = MakeRandomProblem(specs, c.heads, rng_(), /*scattered=*/true, 23);
    const test::ReferenceF64 reference = test::ComputeReferenceF64(host.problem());
    const RegionLayout layout = LayOut(host, 64 * (1 + rng_() % 8));
    std::vector<Outputs> graph_results;  // graphs on, in call order: compared to graphs off
    for (bool graphs : {true, false}) {
      SCOPED_TRACE(::testing::Message()
                   << "batch=" << c.batch << " heads=" << c.heads << " graphs=" << graphs);
      auto made = test::MakeBackend(graphs, kLayers, host.num_slots);
      ASSERT_TRUE(made.ok()) << made.status();
      CudaBackend& backend = *made->backend;
      const int layer = static_cast<int>(rng_() % kLayers);
      ASSERT_TRUE(made->storage->WriteRows(layer, test::Iota(host.num_slots), host.kv.data()).ok());
      SharedMapping region(layout.end);
      ASSERT_NE(region.data(), nullptr);
      // Random bytes everywhere: whatever a call writes outside its tensors shows.
      std::mt19937_64 fill(rng_());
      for (size_t i = 0; i < region.bytes(); ++i) region.data()[i] = static_cast<uint8_t>(fill());
      ASSERT_TRUE(backend.RegisterHostMemory(region.data(), region.bytes()).ok());
      EXPECT_EQ(backend.registered_host_ranges(), 1u);

      int calls = 0, call_index = 0;
      DirectCopyCounters expected;
      for (const Placement& where : placements) {
        for (bool with_lse : {true, false}) {
          // Warm-up, capture, replay of the direct bucket (graphs on); same calls graphs off.
          for (int repeat = 0; repeat < 3; ++repeat) {
            const Outputs staged = RunPlaced(backend, layer, host, region.data(), layout,
                                             {false, false, false}, with_lse);
            RunDecoy(backend, layer, host);
            const Outputs direct =
                RunPlaced(backend, layer, host, region.data(), layout, where, with_lse);
            calls += 3;
            expected.q += where.q;
            expected.out += where.out;
            expected.lse += where.lse && with_lse;
            ExpectSameBytes(staged, direct, with_lse);
            if (repeat == 0) {
              const test::Accuracy acc = test::Compare(reference, direct.out, direct.lse);
              EXPECT_LE(acc.out, kTolerance);
              if (with_lse) EXPECT_LE(acc.lse, kTolerance);
            }
            if (!with_lse && where.lse) {
              // Not asked: the region's lse bytes keep the poison.
              for (float v : direct.lse) ASSERT_TRUE(std::isnan(v)) << "lse written, not asked";
            }
            if (graphs) {
              graph_results.push_back(direct);
            } else {
              ExpectSameBytes(graph_results[call_index], direct, with_lse);
            }
            ++call_index;
          }
        }
      }
      const DirectCopyCounters& d = backend.direct_copies();
      EXPECT_EQ(d.q, expected.q);
      EXPECT_EQ(d.out, expected.out);
      EXPECT_EQ(d.lse, expected.lse);
      const GraphCounters& g = backend.graph_counters();
      EXPECT_EQ(g.fallbacks, 0);
      if (graphs) {
        EXPECT_EQ(g.replays + g.warmups, calls);
        // Every direct bucket replays as is on its third call: the graph holds no region address.
        EXPECT_GE(g.replays - g.captures - g.updates, static_cast<int64_t>(std::size(placements)))
            << "captures " << g.captures << " updates " << g.updates;
      } else {
        EXPECT_EQ(g.replays, 0);
      }
      backend.UnregisterHostMemory(region.data());
      EXPECT_EQ(backend.registered_host_ranges(), 0u);
    }
  }
}

// Bytes of the region outside the call's tensors are never written, by either copy direction.
TEST_F(CudaHostRegistrationTest, NothingOutsideTheTensorsIsWritten) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  HostProblem host = MakeRandomProblem(
      {{3000, 16, TreeShape::kRandom}, {40, 5, TreeShape::kForest}}, 8, rng_(), true, 9);
  const RegionLayout layout = LayOut(host, 4096 + 64 * (rng_() % 8));
  for (bool graphs : {true, false}) {
    auto made = test::MakeBackend(graphs, 1, host.num_slots);
    ASSERT_TRUE(made.ok()) << made.status();
    ASSERT_TRUE(made->storage->WriteRows(0, test::Iota(host.num_slots), host.kv.data()).ok());
    SharedMapping region(layout.end);
    ASSERT_NE(region.data(), nullptr);
    for (size_t i = 0; i < region.bytes(); ++i) region.data()[i] = static_cast<uint8_t>(rng_());
    ASSERT_TRUE(made->backend->RegisterHostMemory(region.data(), region.bytes()).ok());
    std::vector<uint8_t> before(region.data(), region.data() + region.bytes());
    for (int call = 0; call < 3; ++call) {
      RunPlaced(*made->backend, 0, host, region.data(), layout, {true, true, true}, true);
    }
    EXPECT_EQ(made->backend->direct_copies().out, 3);
    const size_t q_bytes = host.q.size() * 2, out_bytes = host.out.size() * 2;
    const size_t lse_bytes = host.lse.size() * 4;
    for (size_t i = 0; i < region.bytes(); ++i) {
      const bool tensor = (i >= layout.q && i < layout.q + q_bytes) ||
                          (i >= layout.out && i < layout.out + out_bytes) ||
                          (i >= layout.lse && i < layout.lse + lse_bytes);
      if (!tensor) ASSERT_EQ(region.data()[i], before[i]) << "byte " << i << " graphs " << graphs;
    }
    made->backend->UnregisterHostMemory(region.data());
  }
}

TEST_F(CudaHostRegistrationTest, RegisterUnregisterLifeCycle) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  HostProblem host =
      MakeRandomProblem({{2000, 16, TreeShape::kRandom}}, 8, rng_(), /*scattered=*/true, 3);
  const test::ReferenceF64 reference = test::ComputeReferenceF64(host.problem());
  auto made = test::MakeBackend(true, 1, host.num_slots);
  ASSERT_TRUE(made.ok()) << made.status();
  CudaBackend& backend = *made->backend;
  ASSERT_TRUE(made->storage->WriteRows(0, test::Iota(host.num_slots), host.kv.data()).ok());
  EXPECT_TRUE(backend.can_register_host_memory());
  EXPECT_EQ(backend.RegisterHostMemory(nullptr, 4096).code(), absl::StatusCode::kInvalidArgument);

  const RegionLayout layout = LayOut(host, 64);
  auto run_and_check = [&](uint8_t* region, const char* what) {
    SCOPED_TRACE(what);
    RunDecoy(backend, 0, host);
    const Outputs o = RunPlaced(backend, 0, host, region, layout, {true, true, true}, true);
    const test::Accuracy acc = test::Compare(reference, o.out, o.lse);
    EXPECT_LE(acc.out, kTolerance);
    EXPECT_LE(acc.lse, kTolerance);
  };
  auto direct_calls = [&] { return backend.direct_copies().out; };

  {
    SharedMapping a(layout.end);
    ASSERT_NE(a.data(), nullptr);
    // Unregistered: the staged path.
    run_and_check(a.data(), "unregistered");
    EXPECT_EQ(direct_calls(), 0);
    ASSERT_TRUE(backend.RegisterHostMemory(a.data(), a.bytes()).ok());
    run_and_check(a.data(), "registered");
    EXPECT_EQ(direct_calls(), 1);
    // Twice is refused (by the driver or the range set); the first registration stands.
    EXPECT_FALSE(backend.RegisterHostMemory(a.data(), a.bytes()).ok());
    EXPECT_EQ(backend.registered_host_ranges(), 1u);
    run_and_check(a.data(), "after a refused second registration");
    EXPECT_EQ(direct_calls(), 2);
    backend.UnregisterHostMemory(a.data() + 64);  // not a registered start: ignored
    EXPECT_EQ(backend.registered_host_ranges(), 1u);
    backend.UnregisterHostMemory(a.data());
    EXPECT_EQ(backend.registered_host_ranges(), 0u);
    run_and_check(a.data(), "unregistered again");
    EXPECT_EQ(direct_calls(), 2);
    backend.UnregisterHostMemory(a.data());  // twice: ignored
    // Registered again (a region remapped at the same address after its predecessor went).
    ASSERT_TRUE(backend.RegisterHostMemory(a.data(), a.bytes()).ok());
    run_and_check(a.data(), "re-registered");
    EXPECT_EQ(direct_calls(), 3);
    backend.UnregisterHostMemory(a.data());
  }
  {
    // Only the first half registered: an out that crosses the end of the range is staged, the
    // q inside it still goes directly.
    SharedMapping b(2 * layout.end);
    ASSERT_NE(b.data(), nullptr);
    ASSERT_TRUE(backend.RegisterHostMemory(b.data(), layout.out + 64).ok());
    const int64_t q_before = backend.direct_copies().q;
    run_and_check(b.data(), "out across the end of the range");
    EXPECT_EQ(direct_calls(), 3);
    EXPECT_EQ(backend.direct_copies().q, q_before + 1);
    backend.UnregisterHostMemory(b.data());
  }
  EXPECT_EQ(backend.graph_counters().fallbacks, 0);
}

// Regions come and go on gRPC threads while the executor computes: another thread registers and
// unregisters mappings of its own throughout a run of Verify calls on a registered region.
TEST_F(CudaHostRegistrationTest, RegistrationOnAnotherThreadWhileVerifyRuns) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  HostProblem host =
      MakeRandomProblem({{4000, 16, TreeShape::kRandom}}, 8, rng_(), /*scattered=*/false, 0);
  const test::ReferenceF64 reference = test::ComputeReferenceF64(host.problem());
  auto made = test::MakeBackend(true, 1, host.num_slots);
  ASSERT_TRUE(made.ok()) << made.status();
  CudaBackend& backend = *made->backend;
  ASSERT_TRUE(made->storage->WriteRows(0, test::Iota(host.num_slots), host.kv.data()).ok());
  const RegionLayout layout = LayOut(host, 128);
  SharedMapping region(layout.end);
  ASSERT_NE(region.data(), nullptr);
  ASSERT_TRUE(backend.RegisterHostMemory(region.data(), region.bytes()).ok());

  std::atomic<bool> stop{false};
  std::atomic<int> cycles{0}, failures{0};
  std::thread churn([&] {
    while (!stop.load()) {
      SharedMapping other(size_t{1} << 20);
      if (other.data() == nullptr ||
          !backend.RegisterHostMemory(other.data(), other.bytes()).ok()) {
        ++failures;
        continue;
      }
      backend.UnregisterHostMemory(other.data());
      ++cycles;
    }
  });
  Outputs first;
  for (int call = 0; call < 40; ++call) {
    const Outputs o = RunPlaced(backend, 0, host, region.data(), layout, {true, true, true}, true);
    if (call == 0) {
      first = o;
      const test::Accuracy acc = test::Compare(reference, o.out, o.lse);
      EXPECT_LE(acc.out, kTolerance);
      EXPECT_LE(acc.lse, kTolerance);
    } else {
      ExpectSameBytes(first, o, true);
    }
  }
  stop = true;
  churn.join();
  EXPECT_EQ(backend.direct_copies().out, 40);
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(cycles.load(), 0);
  EXPECT_EQ(backend.registered_host_ranges(), 1u);
  backend.UnregisterHostMemory(region.data());
}

}  // namespace
}  // namespace verifyd
