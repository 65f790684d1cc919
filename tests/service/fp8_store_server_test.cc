// --kv_dtype=fp8 through the daemon's socket with the client library (plans/0030-fp8-store.md):
// Stats report the dtype, bytes per token and a pool 1152 / 656 times the tokens; bf16 rows the
// daemon quantizes and the client helper's rows (inline and from shared memory) give the same
// Verify output bit for bit, within 1e-2 of float64 on the dequantized KV and unchanged by
// compaction; bad fp8 rows are refused naming the element with nothing kept; a bf16 daemon
// refuses fp8 rows.
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "client/client.h"
#include "client/fp8_rows.h"
#include "client/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/test_server.h"
#include "tests/testing/fp8_f64.h"
#include "tests/testing/problem_builder.h"
#include "tests/testing/test_seed.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"
#include "verify/tree_mask.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<testing::TestServer> Start(KvDtype dtype, const std::string& tag,
                                           double memory_fraction = 0) {
  ServiceOptions o = testing::SmallOptions(tag);
  // The cpu backend on every machine (on a GPU one auto means cuda): these tests compare Verify
  // outputs bit for bit across ways of sending the rows, which the reference arithmetic makes
  // exact; the cuda backend's fp8 pool has its own tests (tests/backend/cuda/cuda_fp8_*).
  o.backend = BackendKind::kCpu;
  o.kv_dtype = dtype;
  o.kv_memory_fraction = memory_fraction;
  auto server = std::make_unique<testing::TestServer>(o);
  EXPECT_EQ(server->status(), absl::OkStatus());
  return server;
}

std::unique_ptr<Client> Connect(testing::TestServer& server) {
  auto client = Client::FromChannel(server.channel());
  EXPECT_TRUE(client.ok()) << client.status();
  return std::move(*client);
}

std::vector<uint16_t> RandomBf16(std::mt19937_64& rng, size_t n, float amplitude) {
  std::uniform_real_distribution<float> u(-amplitude, amplitude);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = FloatToBf16(u(rng));
  return v;
}

TEST(Fp8StoreServer, StatsReportTheDtypeAndTheCapacityPerGiB) {
  auto bf16 = Start(KvDtype::kBf16, "fp8stats-bf16", 0.001);
  auto fp8 = Start(KvDtype::kFp8, "fp8stats-fp8", 0.001);
  const v1::StatsResponse a = *Connect(*bf16)->Stats();
  const v1::StatsResponse b = *Connect(*fp8)->Stats();
  EXPECT_EQ(a.kv_dtype(), "bf16");
  EXPECT_EQ(b.kv_dtype(), "fp8");
  EXPECT_EQ(a.kv_bytes_per_token(), 1152u);
  EXPECT_EQ(b.kv_bytes_per_token(), 656u);
  EXPECT_EQ(a.kv_pool_bytes(), a.capacity_tokens() * a.layers() * 1152);
  EXPECT_EQ(b.kv_pool_bytes(), b.capacity_tokens() * b.layers() * 656);
  const double per_gib_a = a.capacity_tokens() / (a.kv_pool_bytes() / 1073741824.0);
  const double per_gib_b = b.capacity_tokens() / (b.kv_pool_bytes() / 1073741824.0);
  // The same memory fraction: 1152 / 656 = 1.756x the tokens (integer slots aside).
  const double ratio = static_cast<double>(b.capacity_tokens()) / a.capacity_tokens();
  std::printf(
      "capacity: bf16 %llu tokens (%.0f per GiB of pool), fp8 %llu tokens (%.0f per GiB); "
      "fp8 / bf16 = %.4f\n",
      static_cast<unsigned long long>(a.capacity_tokens()), per_gib_a,
      static_cast<unsigned long long>(b.capacity_tokens()), per_gib_b, ratio);
  EXPECT_NEAR(ratio, 1152.0 / 656.0, 1e-3);
  EXPECT_NEAR(per_gib_b / per_gib_a, 1152.0 / 656.0, 1e-9);
}

class Fp8StoreServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = Start(KvDtype::kFp8, "fp8e2e");
    client_ = Connect(*server_);
    const v1::StatsResponse stats = *client_->Stats();
    layers_ = static_cast<int>(stats.layers());
    heads_ = static_cast<int>(stats.heads());
    scale_ = stats.softmax_scale();
  }

  // One Verify of `layer` for `seq` with the given tree; returns out's bf16 bits.
  std::vector<uint16_t> Verify(uint64_t seq, int layer, const std::vector<int32_t>& parents,
                               const std::vector<uint16_t>& q, const std::vector<uint16_t>& tree) {
    v1::VerifyRequest request;
    request.set_layer(static_cast<uint32_t>(layer));
    v1::VerifySequence* s = request.add_sequences();
    s->set_sequence_id(seq);
    for (int32_t p : parents) s->add_parents(p);
    const int64_t nodes = static_cast<int64_t>(parents.size());
    const int64_t q_shape[] = {nodes, heads_, kKvDim};
    const int64_t kv_shape[] = {nodes, kKvDim};
    *request.mutable_q() = *tensor::MakeBf16(q_shape, q);
    *request.mutable_tree_kv() = *tensor::MakeBf16(kv_shape, tree);
    absl::StatusOr<v1::VerifyResponse> response = client_->Verify(request);
    EXPECT_TRUE(response.ok()) << response.status();
    if (!response.ok()) return {};
    const std::string& bytes = response->out().inline_data();
    std::vector<uint16_t> out(bytes.size() / 2);
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }

  std::unique_ptr<testing::TestServer> server_;
  std::unique_ptr<Client> client_;
  int layers_ = 0, heads_ = 0;
  float scale_ = 0;
};

TEST_F(Fp8StoreServerTest, DaemonQuantizationEqualsTheHelperAndMatchesFloat64) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE(::testing::Message() << "VERIFYD_TEST_SEED=" << seed);
  std::mt19937_64 rng(seed);
  constexpr int kPrefix = 300;
  const std::vector<uint16_t> kv = RandomBf16(rng, size_t{3} * kPrefix * kKvDim, 4.f);
  const std::vector<uint8_t> fp8 = *QuantizeKvRowsFp8(kv);
  // 1: bf16, quantized by the daemon; 2: the helper's rows inline; 3: the same from shared memory.
  ASSERT_TRUE(client_->AppendKv(1, 0, layers_, kPrefix, kv, AppendPosition::Create()).ok());
  ASSERT_TRUE(client_->AppendKvFp8(2, 0, layers_, kPrefix, fp8, AppendPosition::Create()).ok());
  absl::StatusOr<SharedMemoryRegion> region = client_->CreateSharedMemory(fp8.size());
  ASSERT_TRUE(region.ok()) << region.status();
  std::memcpy(region->bytes().data(), fp8.data(), fp8.size());
  v1::AppendRequest shared;
  shared.set_sequence_id(3);
  shared.set_create(true);
  shared.mutable_kv()->set_dtype(v1::DTYPE_FP8_MLA);
  for (int64_t d : {int64_t{layers_}, int64_t{kPrefix}, int64_t{kFp8KvRowBytes}}) {
    shared.mutable_kv()->add_shape(d);
  }
  *shared.mutable_kv()->mutable_shared_memory() = *region->Ref(0, fp8.size());
  ASSERT_TRUE(client_->Append(shared).ok());

  const std::vector<int32_t> parents = {-1, 0, 0, 1, 3, 2, -1, 6};
  const int nodes = static_cast<int>(parents.size());
  const std::vector<uint16_t> q =
      RandomBf16(rng, static_cast<size_t>(nodes) * heads_ * kKvDim, 0.5f);
  const std::vector<uint16_t> tree = RandomBf16(rng, static_cast<size_t>(nodes) * kKvDim, 4.f);
  for (int layer = 0; layer < layers_; ++layer) {
    SCOPED_TRACE(::testing::Message() << "layer " << layer);
    const std::vector<uint16_t> out1 = Verify(1, layer, parents, q, tree);
    EXPECT_EQ(Verify(2, layer, parents, q, tree), out1) << "helper's rows differ from the daemon's";
    EXPECT_EQ(Verify(3, layer, parents, q, tree), out1) << "shared memory differs from inline";

    // The float64 oracle on the dequantized rows: the prefix, then the tree (stored quantized).
    std::vector<uint8_t> pool(
        fp8.begin() + static_cast<size_t>(layer) * kPrefix * kFp8RowBytes,
        fp8.begin() + static_cast<size_t>(layer + 1) * kPrefix * kFp8RowBytes);
    const std::vector<uint8_t> tree_fp8 = *QuantizeKvRowsFp8(tree);
    pool.insert(pool.end(), tree_fp8.begin(), tree_fp8.end());
    const std::vector<uint64_t> mask = test::NaiveAncestorMask(parents);
    std::vector<int32_t> slots(kPrefix + nodes);
    std::iota(slots.begin(), slots.end(), 0);
    const int32_t qo[] = {0, nodes}, prefix[] = {kPrefix}, slot_indptr[] = {0, kPrefix + nodes};
    const int32_t mask_indptr[] = {0, static_cast<int32_t>(mask.size())};
    VerifyProblem p;
    p.kv_fp8 = pool.data();
    p.num_slots = kPrefix + nodes;
    p.q = q.data();
    p.num_heads = heads_;
    p.scale = scale_;
    p.batch = 1;
    p.total_q = nodes;
    p.qo_indptr = qo;
    p.prefix_len = prefix;
    p.slot_indptr = slot_indptr;
    p.slots = slots.data();
    p.mask_indptr = mask_indptr;
    p.mask_bits = mask.data();
    std::vector<double> ref, lse;
    test::ComputeVerifyF64(p, &ref, &lse);
    EXPECT_LE(test::RelativeError(out1, ref), 1e-2);
    for (size_t r = 0; r < lse.size(); ++r) {
      EXPECT_LE(test::RelativeError(absl::MakeConstSpan(out1.data() + r * kVDim, kVDim),
                                    absl::MakeConstSpan(ref.data() + r * kVDim, kVDim)),
                1e-2)
          << "row-head " << r;
    }
  }
}

TEST_F(Fp8StoreServerTest, CompactionMovesFp8RowsWithoutChangingVerify) {
  std::mt19937_64 rng(test::TestSeed());
  // Interleaved chunks fragment both sequences; releasing one leaves holes to compact into.
  for (int chunk = 0; chunk < 4; ++chunk) {
    for (uint64_t seq : {11, 12}) {
      const std::vector<uint16_t> kv =
          RandomBf16(rng, static_cast<size_t>(layers_) * 40 * kKvDim, 2.f);
      ASSERT_TRUE(client_
                      ->AppendKv(seq, 0, layers_, 40, kv,
                                 chunk == 0 ? AppendPosition::Create()
                                            : AppendPosition::Fill(uint64_t{40} * chunk))
                      .ok());
    }
  }
  ASSERT_TRUE(client_->Release(12).ok());
  const std::vector<int32_t> parents = {-1, 0, 1};
  const std::vector<uint16_t> q = RandomBf16(rng, size_t{3} * heads_ * kKvDim, 0.5f);
  const std::vector<uint16_t> tree = RandomBf16(rng, size_t{3} * kKvDim, 2.f);
  std::vector<std::vector<uint16_t>> before;
  for (int l = 0; l < layers_; ++l) before.push_back(Verify(11, l, parents, q, tree));
  ASSERT_TRUE(client_->Commit(11, {}).ok());  // reject the tree: the prefix alone is compacted
  ASSERT_GT(client_->Stats()->fragmentation().tokens_outside_first_run(), 0u);
  uint64_t moved = 0;
  // budget 0 stops at twice its first plan (traffic cannot keep it going): compact again.
  for (int round = 0; round < 8 && client_->Stats()->fragmentation().tokens_outside_first_run() > 0;
       ++round) {
    absl::StatusOr<v1::CompactResponse> compact = client_->Compact(0);
    ASSERT_TRUE(compact.ok()) << compact.status();
    absl::StatusOr<v1::CompactionStatus> done = client_->WaitCompaction(compact->operation_id());
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->state(), v1::CompactionStatus::DONE);
    EXPECT_EQ(done->bytes_moved() % (uint64_t{656} * layers_), 0u) << "moved partial rows";
    moved += done->bytes_moved();
  }
  EXPECT_GT(moved, 0u);
  EXPECT_EQ(client_->Stats()->fragmentation().tokens_outside_first_run(), 0u);
  for (int l = 0; l < layers_; ++l) EXPECT_EQ(Verify(11, l, parents, q, tree), before[l]);
}

TEST_F(Fp8StoreServerTest, BadFp8RowsAreRefusedNamingTheElementAndNothingIsKept) {
  std::mt19937_64 rng(test::TestSeed());
  const std::vector<uint16_t> kv = RandomBf16(rng, static_cast<size_t>(layers_) * 4 * kKvDim, 1.f);
  const std::vector<uint8_t> good = *QuantizeKvRowsFp8(kv);
  struct Bad {
    size_t byte;
    std::vector<uint8_t> value;
    const char* message;
  };
  const float nan = std::nanf(""), zero = 0.f;
  const uint16_t inf_bf16 = 0x7F80;
  auto bytes_of = [](const void* p, size_t n) {
    return std::vector<uint8_t>(static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  };
  const std::vector<Bad> cases = {
      {size_t{6} * 656 + 130, {0xFF}, "kv[1, 2] byte 130 (group 1 element 2) = 0xff"},
      {size_t{1} * 656 + 512 + 4, bytes_of(&nan, 4), "kv[0, 1] group 1 scale"},
      {size_t{3} * 656 + 512 + 12, bytes_of(&zero, 4), "kv[0, 3] group 3 scale"},
      {size_t{5} * 656 + 528 + 2 * 63, bytes_of(&inf_bf16, 2), "kv[1, 1] rope element 63"},
  };
  const v1::StatsResponse before = *client_->Stats();
  for (const Bad& c : cases) {
    std::vector<uint8_t> bad = good;
    std::memcpy(bad.data() + c.byte, c.value.data(), c.value.size());
    const absl::StatusOr<v1::AppendResponse> r =
        client_->AppendKvFp8(21, 0, layers_, 4, bad, AppendPosition::Create());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(c.message));
    EXPECT_THAT(r.status().message(), HasSubstr("nothing was kept"));
  }
  // The wrong row width, and bf16 beyond SPEC §1's bound (quantized only once it is checked).
  v1::AppendRequest wrong;
  wrong.set_sequence_id(21);
  wrong.mutable_kv()->set_dtype(v1::DTYPE_FP8_MLA);
  for (int64_t d : {1, 1, 655}) wrong.mutable_kv()->add_shape(d);
  wrong.mutable_kv()->set_inline_data(std::string(655, '\0'));
  EXPECT_THAT(client_->Append(wrong).status().message(),
              HasSubstr("kv.shape[2] = 655 must equal the fp8 row's bytes"));
  std::vector<uint16_t> big = kv;
  big[kKvDim + 7] = FloatToBf16(1e6f);
  EXPECT_THAT(
      client_->AppendKv(21, 0, layers_, 4, big, AppendPosition::Create()).status().message(),
      HasSubstr("kv[0, 1, 7] = 999424 is outside"));
  const v1::StatsResponse after = *client_->Stats();
  EXPECT_EQ(after.used_tokens(), before.used_tokens());
  EXPECT_EQ(after.fragmentation().sequences(), before.fragmentation().sequences());
  ASSERT_TRUE(client_->AppendKvFp8(21, 0, layers_, 4, good, AppendPosition::Create()).ok());
}

TEST(Fp8StoreServer, ABf16DaemonRefusesFp8Rows) {
  auto server = Start(KvDtype::kBf16, "fp8refuse");
  auto client = Connect(*server);
  const std::vector<uint8_t> rows(size_t{3} * 656, 0x10);
  const absl::StatusOr<v1::AppendResponse> r =
      client->AppendKvFp8(1, 0, 3, 1, rows, AppendPosition::Create());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("kv.dtype = DTYPE_FP8_MLA"));
  EXPECT_THAT(r.status().message(), HasSubstr("--kv_dtype=bf16"));
  EXPECT_EQ(client->Stats()->used_tokens(), 0u);
}

}  // namespace
}  // namespace verifyd
