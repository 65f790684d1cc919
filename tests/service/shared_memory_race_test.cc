// Issue 33 N8: SPEC §1's value bound was checked when the request was validated, on bytes in
// shared memory the client may rewrite until the executor has read them. A client that wrote a
// NaN into its region after validation, while its call waited in the queue, got an Append OK with
// the NaN stored (every later Verify of the sequence NaN), or a Verify OK with NaN outputs. Now
// the executor checks the copy it makes and computes from: here the executor is held, the call
// queued behind it, the region rewritten, and then the call is refused naming the element, with
// nothing of it kept (not even a riding commit).
#include <cstring>
#include <future>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/shared_memory_region.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/data_plane_support.h"
#include "tests/service/rpc_helpers.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using testing::Harness;
using ::testing::HasSubstr;
using testing::PollUntil;

constexpr uint16_t kNan = 0x7fc0;

// Holds the device's executor until Release: calls submitted meanwhile wait in its queue.
class ExecutorHold {
 public:
  explicit ExecutorHold(Device* device) {
    EXPECT_TRUE(device->Submit([this](DeviceOperations&) { released_.get_future().wait(); }).ok());
    PollUntil([&] { return device->queued() == 0; }, std::chrono::seconds(10));
  }
  ~ExecutorHold() { Release(); }
  void Release() {
    if (!released) released_.set_value();
    released = true;
  }

 private:
  std::promise<void> released_;
  bool released = false;
};

// Runs `call` on a thread of its own once the executor is held, waits until it is queued, lets
// `rewrite` change the region, releases the executor and returns the call's status.
template <typename Call>
absl::Status QueuedThenRewritten(Harness& h, Call call, const std::function<void()>& rewrite) {
  Device* device = h.server.server().device();
  ExecutorHold hold(device);
  std::future<absl::Status> answered = std::async(std::launch::async, call);
  PollUntil([&] { return device->queued() >= 1; }, std::chrono::seconds(10));
  EXPECT_GE(device->queued(), 1) << "the call never reached the queue";
  rewrite();
  hold.Release();
  return answered.get();
}

TEST(SharedMemoryRaceTest, AnAppendRewrittenAfterValidationIsRefusedOnWhatItWouldStore) {
  SCOPED_TRACE(absl::StrCat("seed ", Harness::Seed()));
  Harness h(testing::SmallOptions("race-append"));
  ASSERT_TRUE(h.server.status().ok());
  const int tokens = 9;
  const v1::AppendRequest inline_append = h.model.MakeAppend(4, tokens);
  const std::string& kv = inline_append.kv().inline_data();
  // Through a shared-memory region and through registered external memory: both are the
  // client's to rewrite.
  absl::StatusOr<SharedMemoryRegion> region = h.client->CreateSharedMemory(kv.size());
  ASSERT_TRUE(region.ok()) << region.status();
  testing::Scratch external(kv.size() + 4096);
  const uint64_t external_region =
      h.client->RegisterExternalMemory(external.path(), external.bytes())->region();
  for (bool shm : {true, false}) {
    SCOPED_TRACE(shm ? "shared memory" : "external memory");
    uint8_t* bytes = shm ? region->bytes().data() : external.data();
    std::memcpy(bytes, kv.data(), kv.size());
    v1::AppendRequest request = inline_append;
    if (shm) {
      v1::SharedMemoryRef* ref = request.mutable_kv()->mutable_shared_memory();
      ref->set_region(region->region());
      ref->set_offset(0);
      ref->set_length(kv.size());
    } else {
      request.mutable_kv()->mutable_external_memory()->set_region(external_region);
      request.mutable_kv()->mutable_external_memory()->set_offset(0);
    }
    const size_t element = h.model.rng()() % (kv.size() / 2);
    const v1::StatsResponse before = h.Stats();
    const absl::Status status = QueuedThenRewritten(
        h, [&] { return h.client->Append(request).status(); },
        [&] { std::memcpy(bytes + 2 * element, &kNan, 2); });
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    const int64_t layer = static_cast<int64_t>(element) / (tokens * kKvDim);
    const int64_t token = static_cast<int64_t>(element) / kKvDim % tokens;
    EXPECT_THAT(status.message(),
                HasSubstr(absl::StrCat("kv[", layer, ", ", token, ", ", element % kKvDim,
                                       "] = nan is not finite")));
    const v1::StatsResponse after = h.Stats();
    EXPECT_EQ(after.fragmentation().sequences(), before.fragmentation().sequences());
    EXPECT_EQ(after.used_tokens(), before.used_tokens());
  }
  // Nothing of either was kept: sequence 4 never existed, and the same rows appended inline work.
  ASSERT_TRUE(h.client->Append(inline_append).ok());
  h.model.AcceptAppend(inline_append);
  testing::RpcDriver driver(h.server.stub(), h.model);
  std::string mismatch;
  ASSERT_TRUE(
      driver.Verify(h.model.MakeVerify(0, {{4, {-1, 0}, std::nullopt}}, true), &mismatch).ok());
  EXPECT_EQ(mismatch, "");
}

TEST(SharedMemoryRaceTest, AVerifyRewrittenAfterValidationIsRefusedAndItsCommitNotApplied) {
  SCOPED_TRACE(absl::StrCat("seed ", Harness::Seed()));
  Harness h(testing::SmallOptions("race-verify"));
  ASSERT_TRUE(h.server.status().ok());
  h.AppendSequence(1, 30);
  testing::RpcDriver driver(h.server.stub(), h.model);
  // A tree verified on every layer, so that the next Verify can ride its commit.
  const std::vector<int32_t> first = h.model.RandomParents(5);
  for (int layer = 0; layer < 3; ++layer) {
    std::string mismatch;
    ASSERT_TRUE(
        driver.Verify(h.model.MakeVerify(layer, {{1, first, std::nullopt}}, false), &mismatch)
            .ok());
    ASSERT_EQ(mismatch, "");
  }
  const std::vector<int32_t> path = h.model.RandomPath(first);
  for (bool in_q : {true, false}) {
    SCOPED_TRACE(in_q ? "q" : "tree_kv");
    const v1::VerifyRequest verify =
        h.model.MakeVerify(0, {{1, h.model.RandomParents(4), path}}, false);
    const std::string& data = in_q ? verify.q().inline_data() : verify.tree_kv().inline_data();
    absl::StatusOr<SharedMemoryRegion> region = h.client->CreateSharedMemory(data.size());
    ASSERT_TRUE(region.ok()) << region.status();
    std::memcpy(region->bytes().data(), data.data(), data.size());
    v1::VerifyRequest request = verify;
    v1::Tensor* tensor = in_q ? request.mutable_q() : request.mutable_tree_kv();
    tensor->clear_inline_data();
    tensor->mutable_shared_memory()->set_region(region->region());
    tensor->mutable_shared_memory()->set_offset(0);
    tensor->mutable_shared_memory()->set_length(data.size());
    const size_t element = h.model.rng()() % (data.size() / 2);
    const v1::StatsResponse before = h.Stats();
    const absl::Status status = QueuedThenRewritten(
        h, [&] { return h.client->Verify(request).status(); },
        [&] { std::memcpy(region->bytes().data() + 2 * element, &kNan, 2); });
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr(in_q ? "q[" : "tree_kv["));
    EXPECT_THAT(status.message(), HasSubstr("= nan is not finite"));
    const v1::StatsResponse after = h.Stats();
    EXPECT_EQ(after.pending_tokens(), before.pending_tokens()) << "the commit was applied";
    EXPECT_EQ(after.fragmentation().tokens(), before.fragmentation().tokens());
  }
  // The tree and its commit are as they were: the same Verify inline is right.
  const v1::VerifyRequest again =
      h.model.MakeVerify(0, {{1, h.model.RandomParents(3), path}}, true);
  std::string mismatch;
  ASSERT_TRUE(driver.Verify(again, &mismatch).ok());
  EXPECT_EQ(mismatch, "");
}

}  // namespace
}  // namespace verifyd
