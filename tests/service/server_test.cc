// The whole request path in process, over a temporary Unix socket with the raw generated stub:
// append (chunked, per layer range), verify on every layer with riding and lone commits, release,
// compaction while verifying, stats, health. Every output is checked against a float64 reference.
#include <chrono>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/rpc_helpers.h"
#include "tests/service/shadow_model.h"
#include "tests/service/test_server.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using testing::RpcDriver;
using testing::ShadowModel;
using testing::VerifyPart;

class ServerTest : public ::testing::Test {
 protected:
  ServerTest()
      : options_(testing::SmallOptions("server")),
        server_(options_),
        model_(options_.layers, options_.heads, options_.softmax_scale, 20261129),
        rpc_(server_.stub(), model_) {}

  void SetUp() override { ASSERT_TRUE(server_.status().ok()) << server_.status(); }

  // A part for `sequence`: a new random tree, and the commit of its pending tree if any.
  VerifyPart NextPart(uint64_t sequence, int max_nodes, bool ride_commit) {
    VerifyPart part;
    part.sequence = sequence;
    part.parents =
        model_.RandomParents(std::uniform_int_distribution<int>(1, max_nodes)(model_.rng()));
    if (ride_commit && model_.has_tree(sequence)) {
      part.commit_previous = model_.RandomPath(model_.sequences().at(sequence).parents);
    }
    return part;
  }

  ServiceOptions options_;
  testing::TestServer server_;
  ShadowModel model_;
  RpcDriver rpc_;
};

TEST_F(ServerTest, AppendVerifyCommitReleaseStats) {
  // Sequence 1: a prefill in two chunks.
  v1::AppendResponse appended;
  ASSERT_TRUE(rpc_.Append(model_.MakeAppend(1, 25), &appended).ok());
  EXPECT_EQ(appended.committed_length(), 25u);
  ASSERT_TRUE(rpc_.Append(model_.MakeAppend(1, 15), &appended).ok());
  EXPECT_EQ(appended.committed_length(), 40u);
  ASSERT_EQ(appended.layer_fill_size(), 3);
  // Sequence 2: layers [0, 2) first, then layer 2; the committed length is the minimum.
  ASSERT_TRUE(rpc_.Append(model_.MakeAppend(2, 33, 0, 2), &appended).ok());
  EXPECT_EQ(appended.committed_length(), 0u);
  EXPECT_EQ(appended.layer_fill(0), 33u);
  EXPECT_EQ(appended.layer_fill(2), 0u);
  ASSERT_TRUE(rpc_.Append(model_.MakeAppend(2, 33, 2, 1), &appended).ok());
  EXPECT_EQ(appended.committed_length(), 33u);
  ASSERT_TRUE(rpc_.Append(model_.MakeAppend(3, 10), &appended).ok());

  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(step);
    // Sequence 3 commits alone before the step; 1 and 2 ride their commits on layer 0.
    if (model_.has_tree(3)) {
      const std::vector<int32_t> path = model_.RandomPath(model_.sequences().at(3).parents);
      v1::CommitResponse committed;
      ASSERT_TRUE(rpc_.Commit(3, path, &committed).ok());
      EXPECT_EQ(static_cast<int64_t>(committed.committed_length()), model_.committed_length(3));
    }
    const std::vector<VerifyPart> parts = {NextPart(1, 12, true), NextPart(2, 20, true),
                                           NextPart(3, 6, false)};
    ASSERT_EQ(rpc_.Step(parts, /*return_lse=*/step % 2 == 0), "");
  }

  // A request's softmax_scale overrides the daemon's; the same layer may be verified again.
  v1::VerifyRequest rescaled =
      model_.MakeVerify(1, {VerifyPart{1, model_.sequences().at(1).parents, std::nullopt}}, true);
  rescaled.set_softmax_scale(0.02f);
  std::string mismatch;
  ASSERT_TRUE(rpc_.Verify(rescaled, &mismatch).ok());
  EXPECT_EQ(mismatch, "");

  // Commit everything alone; then the store holds exactly the committed tokens.
  for (uint64_t seq : {1, 2, 3}) {
    ASSERT_TRUE(rpc_.Commit(seq, model_.RandomPath(model_.sequences().at(seq).parents)).ok());
  }
  int64_t committed = 0;
  for (uint64_t seq : {1, 2, 3}) committed += model_.committed_length(seq);
  v1::StatsResponse stats = rpc_.Stats();
  // SmallOptions asks for auto: cuda where a GPU is visible in a CUDA build.
  EXPECT_THAT(stats.backend(), ::testing::AnyOf("cpu", "cuda"));
  EXPECT_EQ(stats.layers(), 3u);
  EXPECT_EQ(stats.heads(), 4u);
  EXPECT_EQ(stats.max_tree_nodes(), 64u);
  EXPECT_EQ(stats.capacity_tokens(), 4096u);
  EXPECT_EQ(static_cast<int64_t>(stats.used_tokens()), committed);
  EXPECT_EQ(stats.pending_tokens(), 0u);
  EXPECT_EQ(stats.free_tokens(), 4096u - stats.used_tokens());
  EXPECT_EQ(stats.fragmentation().sequences(), 3u);
  EXPECT_EQ(static_cast<int64_t>(stats.fragmentation().tokens()), committed);
  EXPECT_FLOAT_EQ(stats.softmax_scale(), options_.softmax_scale);

  v1::ReleaseResponse released;
  const int64_t length2 = model_.committed_length(2);
  ASSERT_TRUE(rpc_.Release(2, &released).ok());
  EXPECT_EQ(static_cast<int64_t>(released.freed_slots()), length2);
  EXPECT_EQ(rpc_.Stats().fragmentation().sequences(), 2u);
  EXPECT_EQ(rpc_.Release(2).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServerTest, CompactionWhileVerifyingChangesNoResult) {
  // Interleaved appends fragment both sequences; a released one leaves holes.
  ASSERT_TRUE(rpc_.Append(model_.MakeAppend(9, 30)).ok());
  for (int round = 0; round < 6; ++round) {
    ASSERT_TRUE(rpc_.Append(model_.MakeAppend(4, 3 + round)).ok());
    ASSERT_TRUE(rpc_.Append(model_.MakeAppend(5, 4)).ok());
  }
  ASSERT_TRUE(rpc_.Release(9).ok());
  ASSERT_EQ(rpc_.Step({NextPart(4, 8, true), NextPart(5, 8, true)}, true), "");
  const v1::StatsResponse before = rpc_.Stats();
  ASSERT_GT(before.fragmentation().fragmented_ratio(), 0.0);

  v1::CompactRequest compact;  // budget 0: until converged
  v1::CompactResponse started;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(server_.stub().Compact(&context, compact, &started).ok());
  }
  ASSERT_FALSE(started.operation_id().empty());
  // Verify traffic continues while the executor compacts between requests.
  for (int step = 0; step < 3; ++step) {
    ASSERT_EQ(rpc_.Step({NextPart(4, 8, true), NextPart(5, 8, true)}, step == 1), "");
  }
  v1::CompactionStatus status;
  ASSERT_TRUE(testing::WaitForCompaction(server_.stub(), started.operation_id(),
                                         std::chrono::seconds(20), &status)
                  .ok());
  ASSERT_NE(status.state(), v1::CompactionStatus::FAILED) << status.error();
  ASSERT_EQ(status.state(), v1::CompactionStatus::DONE);
  EXPECT_EQ(status.operation_id(), started.operation_id());
  EXPECT_GT(status.bytes_moved(), 0u);
  EXPECT_EQ(status.bytes_moved(), status.tokens_moved() * 3 * kKvRowBytes);
  EXPECT_GE(status.bytes_planned(), status.tokens_moved() > 0 ? 1u : 0u);
  EXPECT_GT(status.before().fragmented_ratio(), 0.0);
  EXPECT_LT(status.after().fragmented_ratio(), status.before().fragmented_ratio());
  EXPECT_GT(status.seconds(), 0.0);
  EXPECT_NEAR(status.bytes_per_second(), status.bytes_moved() / status.seconds(),
              1e-6 * status.bytes_per_second());

  // Every KV row survived the moves: the next steps still match the reference.
  for (int step = 0; step < 2; ++step) {
    ASSERT_EQ(rpc_.Step({NextPart(4, 8, true), NextPart(5, 8, true)}, true), "");
  }

  grpc::ClientContext context;
  v1::GetCompactionRequest unknown;
  unknown.set_operation_id("compact-999");
  v1::CompactionStatus ignored;
  const grpc::Status missing = server_.stub().GetCompaction(&context, unknown, &ignored);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(missing.error_message().find("operation_id = 'compact-999'"), std::string::npos);
}

TEST(ServerLifecycleTest, HealthReportsReadinessAndDrain) {
  ServiceOptions options = testing::SmallOptions("health");
  VerifydServer server(options);
  ASSERT_TRUE(server.Start().ok());
  auto channel = testing::MakeChannel(options.listen);
  bool ok = false;
  using Health = grpc::health::v1::HealthCheckResponse;
  EXPECT_EQ(testing::CheckHealth(channel, "", &ok), Health::NOT_SERVING);
  EXPECT_TRUE(ok);
  EXPECT_EQ(testing::CheckHealth(channel, "verifyd.v1.Verifyd", &ok), Health::NOT_SERVING);
  // Before the device exists, calls are refused as retryable.
  {
    auto stub = v1::Verifyd::NewStub(channel);
    grpc::ClientContext context;
    v1::StatsResponse stats;
    EXPECT_EQ(stub->Stats(&context, v1::StatsRequest(), &stats).error_code(),
              grpc::StatusCode::UNAVAILABLE);
  }
  ASSERT_TRUE(server.BecomeReady().ok());
  EXPECT_EQ(testing::CheckHealth(channel, "", &ok), Health::SERVING);
  EXPECT_EQ(testing::CheckHealth(channel, "verifyd.v1.Verifyd", &ok), Health::SERVING);
  server.Shutdown();
  testing::CheckHealth(channel, "", &ok);
  EXPECT_FALSE(ok) << "the socket must be closed after Shutdown";
}

TEST(ServerLifecycleTest, VerifyIsValidatedBeforeTheDeviceExists) {
  {
    ServiceOptions options = testing::SmallOptions("modes");
    VerifydServer server(options);
    ASSERT_TRUE(server.Start().ok());
    auto stub = v1::Verifyd::NewStub(testing::MakeChannel(options.listen));
    grpc::ClientContext context;
    v1::VerifyResponse response;
    EXPECT_EQ(stub->Verify(&context, v1::VerifyRequest(), &response).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT)
        << "validation answers before the device exists";
    server.Shutdown();
  }
}

TEST(ServerLifecycleTest, AFailedStartLeavesNothingRunning) {
  // A port that cannot be bound fails the whole start; the polled handler's queue, made before
  // the server, must be shut down with it (gRPC aborts on a live queue destroyed).
  {
    ServiceOptions options = testing::SmallOptions("badport");
    options.tcp = "192.0.2.1:0";  // TEST-NET-1: never a local address
    auto server = std::make_unique<VerifydServer>(options);
    const absl::Status started = server->Start();
    EXPECT_EQ(started.code(), absl::StatusCode::kUnavailable) << started;
    EXPECT_THAT(std::string(started.message()), ::testing::HasSubstr("could not listen"));
    server.reset();
  }
}

}  // namespace
}  // namespace verifyd
