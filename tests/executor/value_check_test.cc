// The executor's side of SPEC §1 for data-plane calls whose inputs only the device can read
// (backend/external_tensors.h, ExternalValueCheck): the call is computed and its answer comes
// later. Until the answer is in, the tree layer it wrote is not counted as written; a commit
// waits for the answers of its tree's layers, takes the layers the check passed and is refused
// for one it refused; a tree verified again after a refusal commits; an empty path commits
// without waiting. The backend here is the CPU arithmetic with answers the test gives by hand.
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "executor/device_operations.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/request_validation.h"
#include "tests/executor/recording_metrics.h"
#include "tests/executor/service_calls.h"
#include "tests/service/shadow_model.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;
using testing::VerifyPart;

// An answer the test gives when it likes; Wait() blocks until then.
class HandAnswer : public ExternalValueCheck {
 public:
  std::optional<absl::Status> Poll() override {
    std::lock_guard<std::mutex> lock(mu_);
    return answer_;
  }
  absl::Status Wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    ++waits_;
    cv_.wait(lock, [&] { return answer_.has_value(); });
    return *answer_;
  }
  void Answer(absl::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    answer_ = std::move(status);
    cv_.notify_all();
  }
  int waits() {
    std::lock_guard<std::mutex> lock(mu_);
    return waits_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<absl::Status> answer_;
  int waits_ = 0;
};

// The CPU backend's external path, each successful call handing out the next HandAnswer.
class LateAnsweringBackend : public CpuBackend {
 public:
  LateAnsweringBackend() : CpuBackend(1) {}
  absl::Status ComputeVerifyExternal(const ExternalVerify& call,
                                     absl::Span<const VerifySlotList> lists) override {
    absl::Status computed = CpuBackend::ComputeVerifyExternal(call, lists);
    if (computed.ok() && call.value_check != nullptr) {
      last = std::make_shared<HandAnswer>();
      *call.value_check = last;
    }
    return computed;
  }
  std::shared_ptr<HandAnswer> last;
};

constexpr int kLayers = 2;
constexpr int kHeads = 2;

class ValueCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DeviceOptions device;
    device.store.num_layers = kLayers;
    device.capacity_slots = 256;
    device.store.field_names = RequestFieldNames();
    limits_ = testing::Limits(kLayers, kHeads);
    auto backend = std::make_unique<LateAnsweringBackend>();
    backend_ = backend.get();
    auto ops = DeviceOperations::Create(device, std::move(backend), &metrics_);
    ASSERT_TRUE(ops.ok()) << ops.status();
    ops_ = *std::move(ops);
    const v1::AppendRequest append = model_.MakeAppend(1, 23);
    ASSERT_TRUE(testing::AppendAsService(*ops_, append, limits_).ok());
    model_.AcceptAppend(append);
  }

  // One layer through the data plane's entry (no flags: the CPU backend runs it at once); the
  // outputs land in out_, checked against float64. Returns the call's answer object.
  std::shared_ptr<HandAnswer> VerifyLayer(int layer, const VerifyPart& part) {
    const v1::VerifyRequest request = model_.MakeVerify(layer, {part}, false);
    auto call = ValidateVerify(request, limits_);
    EXPECT_TRUE(call.ok()) << call.status();
    const int64_t rows = int64_t{call->total_q} * kHeads;
    out_.assign(static_cast<size_t>(rows) * kVDim, 0);
    call->out_destination = out_.data();
    backend_->last.reset();
    absl::StatusOr<VerifyResult> result = ops_->VerifyExternal(*call, ExternalOrder{});
    EXPECT_TRUE(result.ok()) << result.status();
    EXPECT_NE(result->value_check, nullptr) << "the late answer was not handed on";
    EXPECT_EQ(result->value_check, backend_->last);
    model_.AcceptVerify(request);
    v1::VerifyResponse response;
    response.mutable_out()->set_dtype(v1::DTYPE_BF16);
    for (int64_t d : {int64_t{call->total_q}, int64_t{kHeads}, int64_t{kVDim}}) {
      response.mutable_out()->add_shape(d);
    }
    response.mutable_out()->set_inline_data(out_.data(), out_.size() * sizeof(bf16_bits));
    for (int64_t n : result->committed_length) response.add_committed_length(n);
    EXPECT_EQ(model_.CheckVerify(request, response), "") << "layer " << layer;
    return backend_->last;
  }

  absl::StatusOr<CommitResult> Commit(std::vector<int32_t> path) {
    CommitCall call;
    call.sequence = 1;
    call.path.accepted_path = std::move(path);
    return ops_->Commit(call);
  }

  ValidationLimits limits_;
  testing::RecordingMetrics metrics_;
  testing::ShadowModel model_{kLayers, kHeads, ServiceOptions().softmax_scale,
                              std::random_device{}()};
  LateAnsweringBackend* backend_ = nullptr;
  std::unique_ptr<DeviceOperations> ops_;
  std::vector<bf16_bits> out_;
};

TEST_F(ValueCheckTest, ARefusedLayerIsNotCommittedUntilVerifiedAgain) {
  const VerifyPart part{1, {-1, 0, 0}, std::nullopt};
  std::shared_ptr<HandAnswer> layer0 = VerifyLayer(0, part);
  std::shared_ptr<HandAnswer> layer1 = VerifyLayer(1, part);
  layer0->Answer(absl::OkStatus());
  layer1->Answer(absl::InvalidArgumentError("tree_kv[1, 7] = inf is not finite"));
  absl::StatusOr<CommitResult> refused = Commit({0, 1});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("1"));
  EXPECT_EQ(ops_->store().CommittedLength(1).value(), 23) << "the refused commit kept something";

  // Verified again with an answer of OK: the same commit goes through.
  VerifyLayer(1, part)->Answer(absl::OkStatus());
  absl::StatusOr<CommitResult> committed = Commit({0, 1});
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(committed->committed_length, 25);
}

TEST_F(ValueCheckTest, ACommitWaitsForTheAnswerAndAnEmptyPathDoesNot) {
  const VerifyPart part{1, {-1, 0}, std::nullopt};
  VerifyLayer(0, part)->Answer(absl::OkStatus());
  std::shared_ptr<HandAnswer> late = VerifyLayer(1, part);
  std::thread answerer([&] {
    // Bounded, so that a commit that does not wait fails the test instead of hanging it.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (late->waits() == 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    late->Answer(absl::OkStatus());
  });
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<CommitResult> committed = Commit({0});
  answerer.join();
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(45))
      << "the commit did not wait for the device's answer";
  EXPECT_EQ(committed->committed_length, 24);
  model_.AcceptCommit(1, {0});

  // A tree whose answer never comes: rejecting it (empty path) keeps nothing and does not wait.
  VerifyLayer(0, {1, {-1}, std::nullopt});
  std::shared_ptr<HandAnswer> never = VerifyLayer(1, {1, {-1}, std::nullopt});
  absl::StatusOr<CommitResult> rejected = Commit({});
  ASSERT_TRUE(rejected.ok()) << rejected.status();
  EXPECT_EQ(rejected->committed_length, 24);
  EXPECT_EQ(never->waits(), 0);
  // The next tree's layers are not taken for the old tree's unanswered ones.
  VerifyLayer(0, {1, {-1, 0}, std::nullopt})->Answer(absl::OkStatus());
  absl::StatusOr<CommitResult> half = Commit({0});
  EXPECT_EQ(half.status().code(), absl::StatusCode::kFailedPrecondition) << half.status();
}

TEST_F(ValueCheckTest, ARidingCommitSettlesToo) {
  const VerifyPart part{1, {-1, 0}, std::nullopt};
  VerifyLayer(0, part)->Answer(absl::OkStatus());
  VerifyLayer(1, part)->Answer(absl::InvalidArgumentError("q[0, 1, 5] = nan is not finite"));
  // The next step's first layer carries the commit: refused, as a Commit would be.
  const v1::VerifyRequest request =
      model_.MakeVerify(0, {{1, {-1}, std::vector<int32_t>{0, 1}}}, false);
  auto call = ValidateVerify(request, limits_);
  ASSERT_TRUE(call.ok()) << call.status();
  std::vector<bf16_bits> out(static_cast<size_t>(kHeads) * kVDim);
  call->out_destination = out.data();
  absl::StatusOr<VerifyResult> result = ops_->VerifyExternal(*call, ExternalOrder{});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
  EXPECT_EQ(ops_->store().CommittedLength(1).value(), 23);
}

}  // namespace
}  // namespace verifyd
