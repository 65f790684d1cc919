// Attention over an fp8 store on the cpu backend (SPEC §1 "KV storage dtype"): the backend's pool
// is written with bf16 rows (it quantizes them) and Verify's output is held to the float64 oracle
// computed on the dequantized KV (tests/testing/fp8_f64.h's exact values), <= 1e-2 per (row, head)
// and over the whole output, on the flash test matrix's shapes the cpu tests already run (its two
// 65536-token prefixes and its 1024-node chain left to the GPU tests: the float64 oracle would take
// minutes on CI's two cores; heads_128 with a 64-token prefix, as verify_reference_test runs it).
// The difference from a bf16 store on the same inputs is printed, not bound (plans/0030).
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "backend/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "kvstore/kv_storage.h"
#include "tests/testing/flash_cases.h"
#include "tests/testing/problem_builder.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using test::HostProblem;

// out of `problem` computed by a cpu backend whose one-layer pool of `dtype` holds hp.kv.
std::vector<bf16_bits> Compute(HostProblem& hp, KvDtype dtype, std::vector<uint8_t>* pool) {
  CpuBackend backend(0);
  std::unique_ptr<KvStorage> storage = *backend.CreateStorage(1, hp.num_slots, dtype);
  std::vector<int32_t> all(hp.num_slots);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(storage->WriteRows(0, all, hp.kv.data()), absl::OkStatus());
  if (pool != nullptr) {
    pool->resize(static_cast<size_t>(hp.num_slots) * storage->row_bytes());
    EXPECT_EQ(storage->ReadEncodedRows(0, all, pool->data()), absl::OkStatus());
  }
  hp.Poison();
  EXPECT_EQ(backend.ComputeVerify(0, hp.problem()), absl::OkStatus());
  return hp.out;
}

TEST(CpuFp8Store, AttentionOverTheDequantizedKvMatchesFloat64) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE(testing::Message() << "VERIFYD_TEST_SEED=" << seed);
  for (const test::Case& c : test::OracleCasesUpToPrefix(1000)) {
    SCOPED_TRACE(c.name);
    const absl::Time start = absl::Now();
    HostProblem hp =
        test::MakeRandomProblem(c.seqs, c.heads, seed ^ std::hash<std::string>{}(c.name),
                                /*scattered=*/true, /*extra_slots=*/7);
    std::vector<uint8_t> pool;
    const std::vector<bf16_bits> fp8_out = Compute(hp, KvDtype::kFp8, &pool);
    ASSERT_EQ(pool.size(), static_cast<size_t>(hp.num_slots) * kFp8RowBytes);
    const std::vector<bf16_bits> bf16_out = Compute(hp, KvDtype::kBf16, nullptr);

    VerifyProblem dequantized = hp.problem();
    dequantized.kv = nullptr;
    dequantized.kv_fp8 = pool.data();
    std::vector<double> ref, lse;
    test::ComputeVerifyF64(dequantized, &ref, &lse);
    const double error = test::RelativeError(fp8_out, ref);
    EXPECT_LE(error, 1e-2);
    int bad_rows = 0;
    for (size_t r = 0; r < lse.size(); ++r) {
      const double row_error =
          test::RelativeError(absl::MakeConstSpan(fp8_out.data() + r * kVDim, kVDim),
                              absl::MakeConstSpan(ref.data() + r * kVDim, kVDim));
      if (!(row_error <= 1e-2) && ++bad_rows <= 5) {
        ADD_FAILURE() << "row-head " << r << ": relative error " << row_error;
      }
    }
    EXPECT_EQ(bad_rows, 0);
    // Reported, not bound: what storing fp8 instead of bf16 changes in the output.
    std::vector<double> bf16_as_double(bf16_out.begin(), bf16_out.end());
    for (size_t i = 0; i < bf16_out.size(); ++i) bf16_as_double[i] = Bf16ToFloat(bf16_out[i]);
    const double vs_bf16 = test::RelativeError(fp8_out, bf16_as_double);
    std::printf("%-28s fp8 vs float64 on dequantized KV %.2e; fp8 vs bf16 store %.2e (%.1f s)\n",
                c.name.c_str(), error, vs_bf16, absl::ToDoubleSeconds(absl::Now() - start));
    ::testing::Test::RecordProperty(c.name + "_fp8_vs_bf16", std::to_string(vs_bf16));
    EXPECT_GT(vs_bf16, 0) << "an fp8 store gave the bf16 store's output bit for bit";
  }
}

// A backend that stores bf16 only (one that does not override CreateStorage with a dtype; the cpu
// and cuda backends both store fp8) refuses an fp8 pool with the message the daemon prints at
// start.
class Bf16OnlyBackend : public ComputeBackend {
 public:
  const char* name() const override { return "bf16only"; }
  absl::StatusOr<std::unique_ptr<KvStorage>> CreateStorage(int layers, int64_t slots) override {
    return std::unique_ptr<KvStorage>(std::make_unique<HostKvStorage>(layers, slots));
  }
  using ComputeBackend::ComputeVerify;
  using ComputeBackend::CreateStorage;
  absl::Status ComputeVerify(int, VerifyProblem, absl::Span<const VerifySlotList>) override {
    return absl::OkStatus();
  }
};

TEST(CpuFp8Store, ABf16OnlyBackendRefusesAnFp8Pool) {
  Bf16OnlyBackend backend;
  ComputeBackend& base = backend;
  EXPECT_TRUE(base.CreateStorage(1, 8, KvDtype::kBf16).ok());
  const absl::Status refused = base.CreateStorage(1, 8, KvDtype::kFp8).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("--kv_dtype=fp8: the bf16only backend stores bf16 rows only"),
            std::string::npos)
      << refused;
  CpuBackend cpu(1);
  absl::StatusOr<std::unique_ptr<KvStorage>> fp8 = cpu.CreateStorage(1, 8, KvDtype::kFp8);
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_EQ((*fp8)->dtype(), KvDtype::kFp8);
  EXPECT_EQ((*fp8)->row_bytes(), 656);
}

}  // namespace
}  // namespace verifyd
