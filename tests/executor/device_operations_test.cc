// DeviceOperations with a backend double: graph events reach the metrics, a failure after
// PrepareVerify is INTERNAL and says the commits were applied, a backend that reads slot lists gets
// the store's lists (and no concatenated copy), and released or expired sequences are forgotten.
#include "executor/device_operations.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "verify/mla_dims.h"
#include "prometheus/text_serializer.h"
#include "backend/cpu/cpu_backend.h"
#include "service/request_validation.h"
#include "tests/service/shadow_model.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;

// The CPU arithmetic, reporting a capture on the first call and a replay on every call. With
// host_lists = false it asks for slot lists only (as the CUDA backend does) and concatenates them
// itself for the CPU arithmetic.
class GraphReportingBackend : public ComputeBackend {
 public:
  explicit GraphReportingBackend(bool host_lists) : host_lists_(host_lists) {}
  const char* name() const override { return "cpu"; }
  absl::StatusOr<std::unique_ptr<KvStorage>> CreateStorage(int layers, int64_t slots) override {
    return cpu_.CreateStorage(layers, slots);
  }
  bool needs_host_slot_lists() const override { return host_lists_; }
  using ComputeBackend::ComputeVerify;
  absl::Status ComputeVerify(int layer, VerifyProblem problem,
                             absl::Span<const VerifySlotList> lists) override {
    if (fail) return absl::DataLossError("device fell off the bus");
    if (calls_++ == 0) observer_(GraphEvent::kCapture);
    observer_(GraphEvent::kReplay);
    last_lists.clear();
    for (const VerifySlotList& l : lists) {
      last_lists.push_back({l.sequence, l.generation,
                            std::vector<int32_t>(l.prefix_slots.begin(), l.prefix_slots.end()),
                            std::vector<int32_t>(l.tree_slots.begin(), l.tree_slots.end())});
    }
    got_host_arrays = problem.slots != nullptr && problem.slot_indptr != nullptr;
    std::vector<int32_t> indptr(1, 0), slots;
    if (!host_lists_) {
      for (const VerifySlotList& l : lists) {
        slots.insert(slots.end(), l.prefix_slots.begin(), l.prefix_slots.end());
        slots.insert(slots.end(), l.tree_slots.begin(), l.tree_slots.end());
        indptr.push_back(static_cast<int32_t>(slots.size()));
      }
      problem.slots = slots.data();
      problem.slot_indptr = indptr.data();
    }
    return cpu_.ComputeVerify(layer, problem);
  }
  void ForgetSequence(SequenceId sequence) override { forgotten.push_back(sequence); }
  void SetGraphObserver(std::function<void(GraphEvent)> observer) override {
    observer_ = std::move(observer);
  }
  bool fail = false;
  struct CopiedList {
    SequenceId sequence;
    uint64_t generation;
    std::vector<int32_t> prefix, tree;
  };
  std::vector<CopiedList> last_lists;
  bool got_host_arrays = false;
  std::vector<SequenceId> forgotten;

 private:
  bool host_lists_;
  CpuBackend cpu_{1};
  std::function<void(GraphEvent)> observer_;
  int calls_ = 0;
};

class DeviceOperationsTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    options_.layers = 2;
    options_.heads = 2;
    options_.kv_capacity_tokens = 256;
    auto backend = std::make_unique<GraphReportingBackend>(/*host_lists=*/GetParam());
    backend_ = backend.get();
    auto ops = DeviceOperations::Create(options_, std::move(backend), &metrics_);
    ASSERT_TRUE(ops.ok()) << ops.status();
    ops_ = *std::move(ops);
    const v1::AppendRequest append = model_.MakeAppend(7, 9);
    auto call = ValidateAppend(append, LimitsFromOptions(options_));
    ASSERT_TRUE(call.ok()) << call.status();
    v1::AppendResponse response;
    ASSERT_TRUE(ops_->Append(*call, &response).ok());
    model_.AcceptAppend(append);
  }

  absl::Status Verify(const v1::VerifyRequest& request, v1::VerifyResponse* response) {
    auto call = ValidateVerify(request, LimitsFromOptions(options_));
    if (!call.ok()) return call.status();
    return ops_->Verify(*call, response);
  }

  std::string MetricsText() {
    return prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
  }

  ServiceOptions options_;
  ServiceMetrics metrics_;
  testing::ShadowModel model_{2, 2, options_.softmax_scale, 11};
  GraphReportingBackend* backend_ = nullptr;
  std::unique_ptr<DeviceOperations> ops_;
};

TEST_P(DeviceOperationsTest, GraphEventsReachTheMetrics) {
  for (int layer = 0; layer < 2; ++layer) {
    const v1::VerifyRequest request =
        model_.MakeVerify(layer, {testing::VerifyPart{7, {-1, 0, 0}, std::nullopt}}, true);
    v1::VerifyResponse response;
    ASSERT_TRUE(Verify(request, &response).ok());
    model_.AcceptVerify(request);
    EXPECT_EQ(model_.CheckVerify(request, response), "");
  }
  const std::string text = MetricsText();
  EXPECT_THAT(text, HasSubstr("verifyd_cuda_graph_captures_total 1\n"));
  EXPECT_THAT(text, HasSubstr("verifyd_cuda_graph_replays_total 2\n"));
  EXPECT_THAT(text, HasSubstr("verifyd_cuda_graph_fallbacks_total 0\n"));
}

TEST_P(DeviceOperationsTest, FailureAfterPrepareIsInternalAndSaysCommitsApplied) {
  const v1::VerifyRequest first =
      model_.MakeVerify(0, {testing::VerifyPart{7, {-1, 0}, std::nullopt}}, false);
  v1::VerifyResponse response;
  ASSERT_TRUE(Verify(first, &response).ok());
  backend_->fail = true;
  const absl::Status failed = Verify(first, &response);
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(failed.message()),
              HasSubstr("after PrepareVerify applied its commits, at compute"));
  EXPECT_THAT(std::string(failed.message()), HasSubstr("device fell off the bus"));
}

// The backend sees each sequence's lists exactly as the store holds them, with the generation;
// the concatenated arrays only when it asks for them. Outputs are right either way.
TEST_P(DeviceOperationsTest, SlotListsAreTheStoresAndConcatenatedOnlyOnRequest) {
  const v1::AppendRequest append = model_.MakeAppend(8, 5);
  auto call = ValidateAppend(append, LimitsFromOptions(options_));
  ASSERT_TRUE(call.ok()) << call.status();
  v1::AppendResponse append_response;
  ASSERT_TRUE(ops_->Append(*call, &append_response).ok());
  model_.AcceptAppend(append);
  for (int layer = 0; layer < 2; ++layer) {
    const v1::VerifyRequest request =
        model_.MakeVerify(layer,
                          {testing::VerifyPart{8, {-1, 0}, std::nullopt},
                           testing::VerifyPart{7, {-1, 0, 1, -1}, std::nullopt}},
                          true);
    v1::VerifyResponse response;
    ASSERT_TRUE(Verify(request, &response).ok());
    model_.AcceptVerify(request);
    EXPECT_EQ(model_.CheckVerify(request, response), "");
    EXPECT_EQ(backend_->got_host_arrays, GetParam());
    ASSERT_EQ(backend_->last_lists.size(), 2u);
    const SequenceId order[2] = {8, 7};
    for (int b = 0; b < 2; ++b) {
      const GraphReportingBackend::CopiedList& got = backend_->last_lists[b];
      const VerifyView view = *ops_->store().GetVerifyView(order[b]);
      EXPECT_EQ(got.sequence, order[b]);
      EXPECT_EQ(got.generation, view.slot_generation);
      EXPECT_NE(got.generation, 0u);
      EXPECT_EQ(got.prefix,
                std::vector<int32_t>(view.prefix_slots.begin(), view.prefix_slots.end()));
      EXPECT_EQ(got.tree, std::vector<int32_t>(view.tree_slots.begin(), view.tree_slots.end()));
      EXPECT_EQ(got.prefix.size(), b == 0 ? 5u : 9u);
    }
  }
}

TEST_P(DeviceOperationsTest, ReleasedAndExpiredSequencesAreForgotten) {
  v1::ReleaseRequest release;
  release.set_sequence_id(7);
  auto call = ValidateRelease(release);
  ASSERT_TRUE(call.ok()) << call.status();
  v1::ReleaseResponse response;
  ASSERT_TRUE(ops_->Release(*call, &response).ok());
  EXPECT_EQ(backend_->forgotten, std::vector<SequenceId>{7});
  // A failed release forgets nothing.
  EXPECT_FALSE(ops_->Release(*call, &response).ok());
  EXPECT_EQ(backend_->forgotten, std::vector<SequenceId>{7});
}

TEST(DeviceOperationsLeases, ExpiredSequencesAreForgotten) {
  ServiceOptions options;
  options.layers = 1;
  options.heads = 1;
  options.kv_capacity_tokens = 64;
  options.lease_seconds = 1e-9;  // expired by the time ExpireLeases looks
  ServiceMetrics metrics;
  auto backend = std::make_unique<GraphReportingBackend>(false);
  GraphReportingBackend* seen = backend.get();
  auto ops = DeviceOperations::Create(options, std::move(backend), &metrics);
  ASSERT_TRUE(ops.ok()) << ops.status();
  testing::ShadowModel model{1, 1, options.softmax_scale, 3};
  for (uint64_t id : {4, 9}) {
    auto call = ValidateAppend(model.MakeAppend(id, 3), LimitsFromOptions(options));
    ASSERT_TRUE(call.ok()) << call.status();
    v1::AppendResponse response;
    ASSERT_TRUE((*ops)->Append(*call, &response).ok());
  }
  absl::SleepFor(absl::Milliseconds(2));
  EXPECT_EQ((*ops)->ExpireLeases(), 2);
  EXPECT_EQ(seen->forgotten, (std::vector<SequenceId>{4, 9}));
}

// A CPU backend that reports a chosen amount of memory (or cannot tell).
class MemoryReportingBackend : public CpuBackend {
 public:
  explicit MemoryReportingBackend(absl::StatusOr<int64_t> memory)
      : CpuBackend(1), memory_(std::move(memory)) {}
  absl::StatusOr<int64_t> AvailableMemoryBytes() const override { return memory_; }

 private:
  absl::StatusOr<int64_t> memory_;
};

TEST(PoolCapacity, FromTokensOrFromAFractionOfTheBackendsMemory) {
  ServiceOptions options;
  options.layers = 61;
  options.kv_capacity_tokens = 777;
  const int64_t slot_bytes = 61 * kKvRowBytes;  // 70272 B
  const MemoryReportingBackend h200(int64_t{141} << 30);
  EXPECT_EQ(*PoolCapacitySlots(options, h200), 777) << "fraction 0: the token flag";
  options.kv_memory_fraction = 0.9;
  EXPECT_EQ(*PoolCapacitySlots(options, h200),
            static_cast<int64_t>(0.9 * static_cast<double>(int64_t{141} << 30) / slot_bytes));
  // A tiny fraction of a small memory holds no slot: the flag and the sizes are named.
  const MemoryReportingBackend small(100000);
  options.kv_memory_fraction = 0.5;
  const absl::Status none = PoolCapacitySlots(options, small).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(none.message()),
              HasSubstr("--kv-memory-fraction = 0.5 of 100000 bytes holds no slot of 61 layers"));
  // Slots are int32: a pool of more slots than that is cut to 2^31 - 1.
  options.layers = 1;
  const MemoryReportingBackend huge(int64_t{1} << 50);
  EXPECT_EQ(*PoolCapacitySlots(options, huge), (int64_t{1} << 31) - 1);
  // A backend that cannot tell refuses the flag rather than guessing.
  const MemoryReportingBackend unknown(absl::UnimplementedError("cannot tell"));
  EXPECT_EQ(PoolCapacitySlots(options, unknown).status().code(), absl::StatusCode::kUnimplemented);
}

// The real CPU backend sizes the store from the host's physical memory.
TEST(PoolCapacity, TheStoreGetsTheResolvedCapacity) {
  ServiceOptions options;
  options.layers = 2;
  options.heads = 1;
  options.kv_memory_fraction = 1e-6;
  ServiceMetrics metrics;
  CpuBackend reference(1);
  const absl::StatusOr<int64_t> memory = reference.AvailableMemoryBytes();
  ASSERT_TRUE(memory.ok()) << memory.status();
  const int64_t expected =
      static_cast<int64_t>(1e-6 * static_cast<double>(*memory) / (2 * kKvRowBytes));
  ASSERT_GE(expected, 1);
  auto ops = DeviceOperations::Create(options, std::make_unique<CpuBackend>(1), &metrics);
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ((*ops)->store().allocator().capacity(), expected);
}

INSTANTIATE_TEST_SUITE_P(HostListsOrNot, DeviceOperationsTest, ::testing::Bool());

}  // namespace
}  // namespace verifyd
