#include "client/group_client.h"

#include <atomic>
#include <memory>
#include <thread>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/client/fake_verifyd.h"

namespace verifyd {
namespace {

using test::FakeVerifyd;

struct Group {
  std::vector<std::unique_ptr<FakeVerifyd>> servers;
  std::unique_ptr<GroupClient> client;
};

Group MakeGroup(int ranks) {
  Group g;
  std::vector<std::string> targets;
  for (int r = 0; r < ranks; ++r) {
    g.servers.push_back(std::make_unique<FakeVerifyd>(r, 1 << 20));
    targets.push_back(g.servers.back()->target());
  }
  ClientOptions options;
  options.retries = 0;
  auto client = GroupClient::Connect(targets, options);
  EXPECT_TRUE(client.ok()) << client.status();
  g.client = std::move(*client);
  return g;
}

TEST(GroupClientTest, VerifyReachesEveryRankAtOnceAndAnswersInRankOrder) {
  Group g = MakeGroup(4);
  // Each server's Verify waits until all four are inside: a sequential group call would time out.
  auto rendezvous = std::make_shared<test::Rendezvous>(4);
  for (auto& s : g.servers) s->verify_rendezvous = rendezvous;
  std::vector<v1::VerifyRequest> requests(4);
  for (int r = 0; r < 4; ++r) requests[r].set_layer(10 + r);
  auto results = g.client->Verify(requests);
  ASSERT_EQ(results.size(), 4u);
  ASSERT_TRUE(GroupClient::FirstError(results).ok()) << GroupClient::FirstError(results);
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(results[r]->committed_length_size(), 2);
    EXPECT_EQ(results[r]->committed_length(0), static_cast<uint64_t>(r)) << "answered by";
    EXPECT_EQ(results[r]->committed_length(1), static_cast<uint64_t>(10 + r)) << "request of";
  }
}

TEST(GroupClientTest, BroadcastCallsReachEveryRank) {
  Group g = MakeGroup(3);
  std::vector<uint16_t> kv(2 * 5 * 576, 0x4000);
  v1::AppendRequest append;
  append.set_sequence_id(9);
  append.mutable_kv()->set_dtype(v1::DTYPE_BF16);
  for (int64_t d : {2, 5, 576}) append.mutable_kv()->add_shape(d);
  append.mutable_kv()->set_inline_data(reinterpret_cast<const char*>(kv.data()), kv.size() * 2);
  auto appended = g.client->Append(append);
  ASSERT_TRUE(GroupClient::FirstError(appended).ok());
  for (auto& s : g.servers)
    EXPECT_EQ(s->AppendedKv(9, 1), std::vector<uint16_t>(kv.begin() + 5 * 576, kv.end()));

  auto stats = g.client->Stats();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(stats[r].ok());
    EXPECT_EQ(stats[r]->heads(), static_cast<uint32_t>(r + 1));
  }
  auto released = g.client->Release(9);
  for (auto& r : released) EXPECT_EQ(r->freed_slots(), 5u);
  auto health = g.client->Health();
  for (auto& h : health) EXPECT_EQ(*h, HealthStatus::kServing);
}

TEST(GroupClientTest, OneFailingRankIsReportedByRank) {
  Group g = MakeGroup(3);
  g.servers[1]->unavailable_left = 1;
  auto results = g.client->Stats();
  EXPECT_TRUE(results[0].ok());
  EXPECT_FALSE(results[1].ok());
  EXPECT_TRUE(results[2].ok());
  absl::Status first = GroupClient::FirstError(results);
  EXPECT_EQ(first.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StartsWith(first.message(), "rank 1: Stats: ")) << first;

  std::vector<v1::VerifyRequest> two(2);
  auto wrong_count = g.client->Verify(two);
  ASSERT_EQ(wrong_count.size(), 3u);
  EXPECT_NE(wrong_count[0].status().message().find("must equal the group size 3"),
            std::string::npos);
}

TEST(GroupClientTest, ConcurrentGroupCallsFromManyThreads) {
  Group g = MakeGroup(2);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) {
        if (GroupClient::FirstError(g.client->Stats()).ok()) ok.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 160);
  EXPECT_EQ(g.servers[0]->attempts.load(), 160);
  EXPECT_EQ(g.servers[1]->attempts.load(), 160);
}

}  // namespace
}  // namespace verifyd
