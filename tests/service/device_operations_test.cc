// DeviceOperations with a backend double: graph events reach the metrics, and a failure after
// PrepareVerify is INTERNAL and says the commits were applied.
#include "service/device_operations.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "service/cpu_backend.h"
#include "service/request_validation.h"
#include "tests/service/shadow_model.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;

// The CPU arithmetic, reporting a capture on the first call and a replay on every call.
class GraphReportingBackend : public ComputeBackend {
 public:
  const char* name() const override { return "cpu"; }
  absl::StatusOr<std::unique_ptr<KvStorage>> CreateStorage(int layers, int64_t slots) override {
    return cpu_.CreateStorage(layers, slots);
  }
  absl::Status ComputeVerify(int layer, VerifyProblem problem) override {
    if (fail) return absl::DataLossError("device fell off the bus");
    if (calls_++ == 0) observer_(GraphEvent::kCapture);
    observer_(GraphEvent::kReplay);
    return cpu_.ComputeVerify(layer, problem);
  }
  void SetGraphObserver(std::function<void(GraphEvent)> observer) override {
    observer_ = std::move(observer);
  }
  bool fail = false;

 private:
  CpuBackend cpu_{1};
  std::function<void(GraphEvent)> observer_;
  int calls_ = 0;
};

class DeviceOperationsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.layers = 2;
    options_.heads = 2;
    options_.kv_capacity_tokens = 256;
    auto backend = std::make_unique<GraphReportingBackend>();
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

TEST_F(DeviceOperationsTest, GraphEventsReachTheMetrics) {
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

TEST_F(DeviceOperationsTest, FailureAfterPrepareIsInternalAndSaysCommitsApplied) {
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

}  // namespace
}  // namespace verifyd
