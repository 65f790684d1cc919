// The data plane's bounds are the daemon's, not a client's (issue 33 N6): a client names itself
// (x-verifyd-client), so 150 channels under 150 ids took 1.3 GB of /dev/shm and 169 threads past a
// per-client bound of 64. --max-channels, --max-channel-bytes and --max-external-regions count
// every client together; past one, RESOURCE_EXHAUSTED names it and nothing is opened, and what is
// closed gives its room back.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "channel/ring.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/data_plane_support.h"

namespace verifyd {
namespace {

using testing::Harness;
using ::testing::HasSubstr;
using testing::Scratch;

std::unique_ptr<Client> ClientNamed(Harness& h, const std::string& id) {
  ClientOptions o;
  o.client_id = id;
  return *Client::FromChannel(h.server.channel(), o);
}

TEST(DataPlaneLimitsTest, ChannelsAreBoundedDaemonWideWhoeverAsks) {
  ServiceOptions options = testing::SmallOptions("dp-max-channels");
  options.max_channels = 3;
  Harness h(options);
  ASSERT_TRUE(h.server.status().ok());
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::unique_ptr<Channel>> channels;
  for (int i = 0; i < 3; ++i) {
    clients.push_back(ClientNamed(h, absl::StrCat("id-", i)));
    absl::StatusOr<std::unique_ptr<Channel>> c = clients.back()->OpenChannel(2);
    ASSERT_TRUE(c.ok()) << c.status();
    channels.push_back(*std::move(c));
  }
  clients.push_back(ClientNamed(h, "id-3"));
  const absl::StatusOr<std::unique_ptr<Channel>> refused = clients.back()->OpenChannel(2);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr("the daemon has 3 open channels, the most allowed (--max-channels = 3)"));
  EXPECT_EQ(h.Stats().channels(), 3u);
  ASSERT_TRUE(channels[1]->Close().ok());
  EXPECT_TRUE(clients.back()->OpenChannel(2).ok());
}

TEST(DataPlaneLimitsTest, RingBytesAreBoundedDaemonWide) {
  ServiceOptions options = testing::SmallOptions("dp-channel-bytes");
  const uint64_t big = channel::RingFileBytes(1024);
  options.max_channel_bytes = static_cast<int64_t>(big + big / 2);
  Harness h(options);
  ASSERT_TRUE(h.server.status().ok());
  std::unique_ptr<Client> a = ClientNamed(h, "a");
  std::unique_ptr<Client> b = ClientNamed(h, "b");
  absl::StatusOr<std::unique_ptr<Channel>> first = a->OpenChannel(1024);
  ASSERT_TRUE(first.ok()) << first.status();
  const absl::StatusOr<std::unique_ptr<Channel>> second = b->OpenChannel(1024);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("entries = 1024 takes a ring of ", big, " bytes")));
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("of --max-channel-bytes = ", options.max_channel_bytes)));
  // A small ring still fits beside it.
  EXPECT_TRUE(b->OpenChannel(2).ok());
  ASSERT_TRUE((*first)->Close().ok());
  EXPECT_TRUE(b->OpenChannel(1024).ok());
}

TEST(DataPlaneLimitsTest, ExternalRegionsAreBoundedDaemonWideWhoeverAsks) {
  ServiceOptions options = testing::SmallOptions("dp-max-regions");
  options.max_external_regions = 2;
  Harness h(options);
  ASSERT_TRUE(h.server.status().ok());
  Scratch memory(1 << 16);
  std::unique_ptr<Client> a = ClientNamed(h, "a");
  std::unique_ptr<Client> b = ClientNamed(h, "b");
  std::unique_ptr<Client> c = ClientNamed(h, "c");
  const uint64_t first = a->RegisterExternalMemory(memory.path(), 4096)->region();
  ASSERT_TRUE(b->RegisterExternalMemory(memory.path(), 4096).ok());
  const absl::StatusOr<v1::RegisterExternalMemoryResponse> refused =
      c->RegisterExternalMemory(memory.path(), 4096);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr("2 registered external regions, the most allowed "
                        "(--max-external-regions = 2)"));
  EXPECT_EQ(h.Stats().external_regions(), 2u);
  ASSERT_TRUE(a->ReleaseExternalMemory(first).ok());
  EXPECT_TRUE(c->RegisterExternalMemory(memory.path(), 4096).ok());
}

}  // namespace
}  // namespace verifyd
