// Fault injection below the executor (issue 17): a backend whose storage and compute fail on
// command. Append after a device error keeps nothing of the call; a Verify whose riding commit
// was applied before the device failed says so (INTERNAL), leaves the store consistent (the
// commit applied, the new tree pending), a blind retry of the same call cannot commit twice, and
// the healed device answers the next Verify exactly as the float64 reference says.
#include <memory>

#include "backend/cpu/cpu_backend.h"
#include "executor/device_operations.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/request_validation.h"
#include "service/response_encoding.h"
#include "tests/executor/recording_metrics.h"
#include "tests/executor/service_calls.h"
#include "tests/kvstore/failing_storage.h"
#include "tests/service/shadow_model.h"
#include "verify/verify_reference.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;
using testing::VerifyPart;
using testing_kv::FailingStorage;

// The CPU arithmetic over a FailingStorage; ComputeVerify fails while `fail_compute` is set.
class FaultyBackend : public ComputeBackend {
 public:
  const char* name() const override { return "cpu"; }
  absl::StatusOr<std::unique_ptr<KvStorage>> CreateStorage(int layers, int64_t slots) override {
    auto storage = std::make_unique<FailingStorage>(layers, slots);
    storage_ = storage.get();
    return std::unique_ptr<KvStorage>(std::move(storage));
  }
  using ComputeBackend::ComputeVerify;
  absl::Status ComputeVerify(int layer, VerifyProblem problem,
                             absl::Span<const VerifySlotList>) override {
    if (fail_compute) return absl::InternalError("injected device error in compute");
    problem.kv = storage_->host().layer_data(layer);
    problem.num_slots = storage_->capacity_slots();
    return ComputeVerifyReference(problem, 1);
  }
  FailingStorage& storage() { return *storage_; }
  bool fail_compute = false;

 private:
  FailingStorage* storage_ = nullptr;
};

class FaultInjectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DeviceOptions device;
    device.store.num_layers = 2;
    device.capacity_slots = 256;
    // The requests' field names, as the service sets them: the messages below name "sequences[0]".
    device.store.field_names = RequestFieldNames();
    limits_ = testing::Limits(2, 2);
    auto backend = std::make_unique<FaultyBackend>();
    backend_ = backend.get();
    auto ops = DeviceOperations::Create(device, std::move(backend), &metrics_);
    ASSERT_TRUE(ops.ok()) << ops.status();
    ops_ = *std::move(ops);
  }

  absl::Status Append(const v1::AppendRequest& request) {
    return testing::AppendAsService(*ops_, request, limits_);
  }
  absl::Status Verify(const v1::VerifyRequest& request, v1::VerifyResponse* response) {
    return testing::VerifyAsService(*ops_, request, limits_, response);
  }
  // Verify on both layers (the commit rides on layer 0), each checked against float64.
  void Step(const VerifyPart& part) {
    for (int layer = 0; layer < 2; ++layer) {
      VerifyPart p = part;
      if (layer > 0) p.commit_previous.reset();
      const v1::VerifyRequest request = model_.MakeVerify(layer, {p}, true);
      v1::VerifyResponse response;
      ASSERT_TRUE(Verify(request, &response).ok());
      model_.AcceptVerify(request);
      ASSERT_EQ(model_.CheckVerify(request, response), "");
    }
  }

  ValidationLimits limits_;
  testing::RecordingMetrics metrics_;
  testing::ShadowModel model_{2, 2, ServiceOptions().softmax_scale, std::random_device{}()};
  FaultyBackend* backend_ = nullptr;
  std::unique_ptr<DeviceOperations> ops_;
};

TEST_F(FaultInjectionTest, AppendAfterADeviceErrorKeepsNothing) {
  v1::AppendRequest first = model_.MakeAppend(3, 11);
  first.set_create(true);
  ASSERT_TRUE(Append(first).ok());
  model_.AcceptAppend(first);
  const StoreStats before = ops_->store().Stats();
  for (int failing_layer = 0; failing_layer < 2; ++failing_layer) {
    // A new sequence and a chunk of an existing one, failing on each layer's write.
    v1::AppendRequest fresh = model_.MakeAppend(4, 6);
    fresh.set_create(true);
    backend_->storage().FailWritesAfter(failing_layer);
    EXPECT_THAT(Append(fresh).message(), HasSubstr("injected device error"));
    EXPECT_FALSE(ops_->store().Contains(4));
    v1::AppendRequest more = model_.MakeAppend(3, 5);
    more.set_expected_fill(11);
    backend_->storage().FailWritesAfter(failing_layer);
    EXPECT_EQ(Append(more).code(), absl::StatusCode::kInternal);
    backend_->storage().Heal();
    EXPECT_EQ(*ops_->store().LayerFill(3), (std::vector<int64_t>{11, 11}));
    const StoreStats after = ops_->store().Stats();
    EXPECT_EQ(after.used_slots, before.used_slots);
    EXPECT_EQ(after.free_slots, before.free_slots);
    EXPECT_EQ(after.fragmentation.runs, before.fragmentation.runs);
  }
  // The same chunk, retried on the healed device, lands where it said and verifies right.
  v1::AppendRequest more = model_.MakeAppend(3, 5);
  more.set_expected_fill(11);
  ASSERT_TRUE(Append(more).ok());
  model_.AcceptAppend(more);
  Step(VerifyPart{3, {-1, 0, 0}, std::nullopt});
}

TEST_F(FaultInjectionTest, VerifyErrorAfterARidingCommitLeavesTheCommitAppliedAndNoDoubleCommit) {
  v1::AppendRequest first = model_.MakeAppend(7, 13);
  first.set_create(true);
  ASSERT_TRUE(Append(first).ok());
  model_.AcceptAppend(first);
  const std::vector<int32_t> tree = {-1, 0, 1, 0};
  Step(VerifyPart{7, tree, std::nullopt});

  // The next step commits nodes 0, 1 and sends a new tree; the device fails in the compute.
  const std::vector<int32_t> path = {0, 1};
  const std::vector<int32_t> next_tree = {-1, 0};
  const v1::VerifyRequest riding = model_.MakeVerify(0, {VerifyPart{7, next_tree, path}}, false);
  backend_->fail_compute = true;
  v1::VerifyResponse response;
  const absl::Status failed = Verify(riding, &response);
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(failed.message()), HasSubstr("applied its commits, at compute"));
  // The store is consistent: the commit applied, the new tree pending.
  EXPECT_EQ(*ops_->store().CommittedLength(7), 15);
  const VerifyView view = *ops_->store().GetVerifyView(7);
  EXPECT_EQ(view.tree_slots.size(), next_tree.size());
  model_.AcceptCommit(7, path);

  // A blind retry of the same call must not commit a second time (the new tree is not verified
  // on every layer): refused, nothing changed.
  backend_->fail_compute = false;
  const absl::Status retried = Verify(riding, &response);
  EXPECT_EQ(retried.code(), absl::StatusCode::kFailedPrecondition) << retried;
  EXPECT_EQ(*ops_->store().CommittedLength(7), 15);
  // The scheduler, told the commit happened, verifies the new tree without it: exact answers.
  Step(VerifyPart{7, next_tree, std::nullopt});
}

TEST_F(FaultInjectionTest, TreeKvWriteErrorAfterARidingCommitIsInternalAndRecoverable) {
  v1::AppendRequest first = model_.MakeAppend(9, 8);
  first.set_create(true);
  ASSERT_TRUE(Append(first).ok());
  model_.AcceptAppend(first);
  Step(VerifyPart{9, {-1, 0, 0}, std::nullopt});
  const std::vector<int32_t> path = {0, 2};
  const std::vector<int32_t> next_tree = {-1, -1, 1};
  const v1::VerifyRequest riding = model_.MakeVerify(0, {VerifyPart{9, next_tree, path}}, false);
  backend_->storage().FailWritesAfter(0);
  v1::VerifyResponse response;
  const absl::Status failed = Verify(riding, &response);
  backend_->storage().Heal();
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(failed.message()), HasSubstr("sequences[0] tree KV"));
  EXPECT_EQ(*ops_->store().CommittedLength(9), 10);
  model_.AcceptCommit(9, path);
  Step(VerifyPart{9, next_tree, std::nullopt});
  // And the tree commits: the chain 1 -> 2 becomes positions 10, 11 of every layer.
  const absl::StatusOr<CommitResult> committed = ops_->Commit(CommitCall{9, CommitPath{{1, 2}}});
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(committed->committed_length, 12);
  model_.AcceptCommit(9, {1, 2});
  Step(VerifyPart{9, {-1}, std::nullopt});
}

}  // namespace
}  // namespace verifyd
