// verifyd::Client against the in-process fake daemon over a real Unix socket.
#include "client/client.h"

#include <random>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/client/fake_verifyd.h"

namespace verifyd {
namespace {

using test::FakeVerifyd;

std::unique_ptr<Client> MustConnect(const FakeVerifyd& server, ClientOptions options = {}) {
  auto client = Client::Connect(server.target(), options);
  EXPECT_TRUE(client.ok()) << client.status();
  return std::move(*client);
}

TEST(ClientTest, ChunkedAppendArrivesWholeUnderTheLimit) {
  constexpr int64_t kLimit = 64 << 10;
  FakeVerifyd server(0, kLimit);
  ClientOptions options;
  options.max_message_bytes = kLimit;
  auto client = MustConnect(server, options);

  std::mt19937 rng(std::random_device{}());
  const int64_t layers = 3, tokens = 150 + rng() % 100;
  std::vector<uint16_t> kv(layers * tokens * 576);
  for (uint16_t& v : kv) v = static_cast<uint16_t>(rng());
  auto response = client->AppendKv(77, 1, layers, tokens, kv, AppendPosition::Create());
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_GT(server.append_messages.load(), 4);
  EXPECT_LE(server.largest_append_bytes.load(), kLimit);
  EXPECT_EQ(response->committed_length(), static_cast<uint64_t>(tokens));
  for (int64_t l = 0; l < layers; ++l) {
    const std::vector<uint16_t> want(kv.begin() + l * tokens * 576,
                                     kv.begin() + (l + 1) * tokens * 576);
    EXPECT_EQ(server.AppendedKv(77, 1 + l), want) << "layer " << 1 + l;
  }
}

TEST(ClientTest, IdempotentCallsRetryUnavailable) {
  FakeVerifyd server(0, 1 << 20);
  ClientOptions options;
  options.retries = 3;
  options.retry_backoff = absl::Milliseconds(5);
  auto client = MustConnect(server, options);

  server.unavailable_left = 2;
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->backend(), "fake");
  EXPECT_EQ(server.attempts.load(), 3);

  server.attempts = 0;
  server.unavailable_left = 10;
  auto exhausted = client->GetCompaction("op-1");
  EXPECT_EQ(exhausted.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(server.attempts.load(), 4);  // 1 + retries
  EXPECT_NE(exhausted.status().message().find("GetCompaction: injected"), std::string::npos)
      << exhausted.status();
}

TEST(ClientTest, MutatingCallsAreNeverRetried) {
  FakeVerifyd server(0, 1 << 20);
  ClientOptions options;
  options.retries = 5;
  options.retry_backoff = absl::Milliseconds(1);
  auto client = MustConnect(server, options);
  std::vector<uint16_t> kv(576, 0x3f80);
  const int32_t path[] = {0, 1};

  struct Case {
    const char* name;
    std::function<absl::Status()> call;
  } cases[] = {
      {"Verify", [&] { return client->Verify(v1::VerifyRequest()).status(); }},
      {"Append",
       [&] { return client->AppendKv(1, 0, 1, 1, kv, AppendPosition::Create()).status(); }},
      {"Commit", [&] { return client->Commit(1, path).status(); }},
      {"Release", [&] { return client->Release(1).status(); }},
      {"Compact", [&] { return client->Compact(100).status(); }},
  };
  for (const Case& c : cases) {
    server.attempts = 0;
    server.unavailable_left = 3;
    absl::Status status = c.call();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << c.name << ": " << status;
    EXPECT_EQ(server.attempts.load(), 1) << c.name;
    EXPECT_TRUE(absl::StartsWith(status.message(), std::string(c.name) + ": ")) << status;
  }
}

TEST(ClientTest, DefaultDeadlineAndPerCallOverride) {
  FakeVerifyd server(0, 1 << 20);
  ClientOptions options;
  options.default_deadline = absl::Milliseconds(150);
  auto client = MustConnect(server, options);
  ASSERT_TRUE(client->Stats().ok());  // connected, so the next timing is the deadline's alone

  server.delay_ms = 1000;
  absl::Time start = absl::Now();
  auto slow = client->Stats();
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(slow.status().code(), absl::StatusCode::kDeadlineExceeded) << slow.status();
  EXPECT_LT(took, absl::Milliseconds(800));
  EXPECT_GE(took, absl::Milliseconds(140));

  server.delay_ms = 300;
  auto patient = client->Stats(CallOptions{.deadline = absl::Seconds(5)});
  EXPECT_TRUE(patient.ok()) << patient.status();
}

TEST(ClientTest, ErrorsKeepTheDaemonsCodeAndMessage) {
  FakeVerifyd server(0, 1 << 20);
  auto client = MustConnect(server);
  auto released = client->Release(424242);
  EXPECT_EQ(released.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(released.status().message(), "Release: sequence_id = 424242 is not live");
}

TEST(ClientTest, HealthFollowsTheServer) {
  FakeVerifyd server(0, 1 << 20);
  auto client = MustConnect(server);
  server.SetServing(false);
  auto down = client->Health();
  ASSERT_TRUE(down.ok()) << down.status();
  EXPECT_EQ(*down, HealthStatus::kNotServing);
  server.SetServing(true);
  EXPECT_EQ(*client->Health(), HealthStatus::kServing);
}

TEST(ClientTest, CompactSendsTheAdminTokenAndWaitsForDone) {
  FakeVerifyd server(0, 1 << 20);
  server.compaction_polls_until_done = 4;
  ClientOptions options;
  options.admin_token = "s3cret";
  auto client = MustConnect(server, options);
  auto op = client->Compact(4000);
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(server.last_admin_token, "s3cret");
  std::vector<uint64_t> progress;
  auto done = client->WaitCompaction(
      op->operation_id(), absl::Milliseconds(1),
      [&](const v1::CompactionStatus& s) { progress.push_back(s.bytes_moved()); });
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::CompactionStatus::DONE);
  EXPECT_EQ(progress, (std::vector<uint64_t>{1000, 2000, 3000, 4000}));
}

TEST(ClientTest, RejectsBadOptions) {
  EXPECT_EQ(Client::Connect("").status().code(), absl::StatusCode::kInvalidArgument);
  ClientOptions bad;
  bad.retries = -1;
  EXPECT_NE(Client::Connect("unix:///nowhere", bad).status().message().find("retries = -1"),
            std::string::npos);
  bad = {};
  bad.max_message_bytes = 10;
  EXPECT_FALSE(Client::Connect("unix:///nowhere", bad).ok());
}

TEST(ClientTest, UnreachableDaemonIsUnavailableWithinTheDeadline) {
  ClientOptions options;
  options.default_deadline = absl::Seconds(2);
  options.retry_backoff = absl::Milliseconds(10);
  auto client = Client::Connect("unix:///tmp/verifyd-client-test-no-such.sock", options);
  ASSERT_TRUE(client.ok());
  absl::Time start = absl::Now();
  auto health = (*client)->Health();
  EXPECT_EQ(health.status().code(), absl::StatusCode::kUnavailable) << health.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

}  // namespace
}  // namespace verifyd
