// DeviceOperations with a backend double: graph events reach the metrics, a failure after
// PrepareVerify is INTERNAL and says the commits were applied, a backend that reads slot lists gets
// the store's lists (and no concatenated copy), and released or expired sequences are forgotten.
// Requests are made and results checked by the service's shadow model, through the service's
// decoding and encoding; the executor itself sees plain calls and returns plain results.
#include "executor/device_operations.h"

#include "backend/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/request_validation.h"
#include "service/response_encoding.h"
#include "tests/executor/recording_metrics.h"
#include "tests/executor/service_calls.h"
#include "tests/service/shadow_model.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;
using testing::Limits;

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

// A device of `layers` layers and `capacity` slots, with a lease of `lease`.
DeviceOptions SmallDevice(int layers, int64_t capacity, absl::Duration lease = absl::Seconds(300)) {
  DeviceOptions options;
  options.store.num_layers = layers;
  options.store.lease = lease;
  options.capacity_slots = capacity;
  return options;
}

constexpr float kScale = 0.07216878364870322f;

class DeviceOperationsTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    auto backend = std::make_unique<GraphReportingBackend>(/*host_lists=*/GetParam());
    backend_ = backend.get();
    auto ops = DeviceOperations::Create(SmallDevice(2, 256), std::move(backend), &metrics_);
    ASSERT_TRUE(ops.ok()) << ops.status();
    ops_ = *std::move(ops);
    const v1::AppendRequest append = model_.MakeAppend(7, 9);
    ASSERT_TRUE(testing::AppendAsService(*ops_, append, limits_).ok());
    model_.AcceptAppend(append);
  }

  absl::Status Verify(const v1::VerifyRequest& request, v1::VerifyResponse* response) {
    return testing::VerifyAsService(*ops_, request, limits_, response);
  }

  const ValidationLimits limits_ = Limits(2, 2);
  testing::RecordingMetrics metrics_;
  testing::ShadowModel model_{2, 2, kScale, 11};
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
  EXPECT_EQ(metrics_.graph_captures, 1);
  EXPECT_EQ(metrics_.graph_replays, 2);
  EXPECT_EQ(metrics_.graph_fallbacks, 0);
  // And what each Verify reported: one batch of one sequence of 3 nodes per layer.
  EXPECT_EQ(metrics_.verify_batches, 2);
  EXPECT_EQ(metrics_.batch_sequences, 2);
  EXPECT_EQ(metrics_.tree_nodes, 6);
  EXPECT_EQ(metrics_.kernels(KernelKind::kVerify), 2);
  EXPECT_EQ(metrics_.kernels(KernelKind::kAppend), 1);
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
  auto call = ValidateAppend(append, limits_);
  ASSERT_TRUE(call.ok()) << call.status();
  const absl::StatusOr<AppendResult> appended = ops_->Append(*call);
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->committed_length, 5);
  EXPECT_EQ(appended->layer_fill, (std::vector<int64_t>{5, 5}));
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
  const absl::StatusOr<ReleaseResult> released = ops_->Release(*call);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->freed_slots, 9) << "the 9 appended tokens";
  EXPECT_EQ(backend_->forgotten, std::vector<SequenceId>{7});
  // A failed release forgets nothing.
  EXPECT_FALSE(ops_->Release(*call).ok());
  EXPECT_EQ(backend_->forgotten, std::vector<SequenceId>{7});
}

TEST(DeviceOperationsLeases, ExpiredSequencesAreForgotten) {
  testing::RecordingMetrics metrics;
  auto backend = std::make_unique<GraphReportingBackend>(false);
  GraphReportingBackend* seen = backend.get();
  // A lease so short that both are expired by the time ExpireLeases looks.
  auto ops = DeviceOperations::Create(SmallDevice(1, 64, absl::Nanoseconds(1)), std::move(backend),
                                      &metrics);
  ASSERT_TRUE(ops.ok()) << ops.status();
  testing::ShadowModel model{1, 1, kScale, 3};
  for (uint64_t id : {4, 9}) {
    // Named: the call points into the request's bytes (ASan found a temporary here).
    const v1::AppendRequest request = model.MakeAppend(id, 3);
    auto call = ValidateAppend(request, Limits(1, 1));
    ASSERT_TRUE(call.ok()) << call.status();
    ASSERT_TRUE((*ops)->Append(*call).ok());
  }
  absl::SleepFor(absl::Milliseconds(2));
  EXPECT_EQ((*ops)->ExpireLeases(), 2);
  EXPECT_EQ(seen->forgotten, (std::vector<SequenceId>{4, 9}));
  EXPECT_EQ(metrics.lease_expiries, 2);
}

// The store gets the capacity and the lease it is given, and Stats reports the store as it is.
TEST(DeviceOperationsStats, TheStoreIsBuiltFromTheOptions) {
  testing::RecordingMetrics metrics;
  DeviceOptions options = SmallDevice(3, 97);
  options.store.max_tree_nodes = 40;
  auto ops = DeviceOperations::Create(options, std::make_unique<CpuBackend>(1), &metrics);
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ((*ops)->store().allocator().capacity(), 97);
  testing::ShadowModel model{3, 1, kScale, 5};
  const v1::AppendRequest request = model.MakeAppend(2, 11);  // the call points into it
  auto call = ValidateAppend(request, Limits(3, 1));
  ASSERT_TRUE(call.ok()) << call.status();
  ASSERT_TRUE((*ops)->Append(*call).ok());
  const DeviceStats stats = (*ops)->Stats();
  EXPECT_EQ(stats.backend, "cpu");
  EXPECT_EQ(stats.layers, 3);
  EXPECT_EQ(stats.max_tree_nodes, 40);
  EXPECT_EQ(stats.store.capacity_slots, 97);
  EXPECT_EQ(stats.store.used_slots, 11);
  EXPECT_EQ(stats.store.free_slots, 86);
  EXPECT_EQ(metrics.last_store().used_slots, 11) << "Stats publishes the gauges";
}

INSTANTIATE_TEST_SUITE_P(HostListsOrNot, DeviceOperationsTest, ::testing::Bool());

}  // namespace
}  // namespace verifyd
