// ListSequences through the whole request path (in-process server, Unix socket), with the C++
// client: each field against what the calls did, a page capped by --max-message-bytes with
// `truncated` set and every id reached by paging, and a listing that renews no lease (the
// "release what leaked" runbook must not keep leaks alive). Issue 17.
#include <algorithm>
#include <chrono>
#include <thread>

#include "client/client.h"
#include "gtest/gtest.h"
#include "service/request_validation.h"
#include "tests/service/rpc_helpers.h"
#include "tests/service/shadow_model.h"
#include "tests/service/test_server.h"
#include "tests/testing/test_seed.h"

namespace verifyd {
namespace {

using testing::RpcDriver;
using testing::ShadowModel;
using testing::VerifyPart;

class ListSequencesTest : public ::testing::Test {
 protected:
  static ServiceOptions Options() {
    ServiceOptions o = testing::SmallOptions("list");
    o.max_message_bytes = 64 << 10;  // the smallest the daemon takes: 1023 entries a page
    o.lease_seconds = 120;
    return o;
  }
  explicit ListSequencesTest(ServiceOptions options = Options())
      : options_(options),
        server_(options_),
        model_(options_.layers, options_.heads, options_.softmax_scale,
               static_cast<uint32_t>(test::TestSeed())),
        rpc_(server_.stub(), model_) {}

  void SetUp() override {
    ASSERT_TRUE(server_.status().ok()) << server_.status();
    ClientOptions client_options;
    client_options.max_message_bytes = options_.max_message_bytes;
    auto client = Client::FromChannel(server_.channel(), client_options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  static const v1::SequenceInfo* Find(const v1::ListSequencesResponse& list, uint64_t id) {
    for (const v1::SequenceInfo& info : list.sequences()) {
      if (info.sequence_id() == id) return &info;
    }
    return nullptr;
  }

  ServiceOptions options_;
  testing::TestServer server_;
  ShadowModel model_;
  RpcDriver rpc_;
  std::unique_ptr<Client> client_;
};

TEST_F(ListSequencesTest, EachFieldIsWhatTheCallsDid) {
  // 16 tokens x 3 layers of 1152 bytes fit one 64 KiB message.
  ASSERT_TRUE(rpc_.Append(model_.MakeAppend(40, 16)).ok());
  ASSERT_TRUE(rpc_.Append(model_.MakeAppend(8, 12)).ok());
  // 8's layer 0 runs 5 tokens ahead: its committed length stays the minimum, 12.
  ASSERT_TRUE(rpc_.Append(model_.MakeAppend(8, 5, 0, 1)).ok());
  ASSERT_TRUE(rpc_.Fork(40, 41, 10).ok());
  // 41 verifies a tree of 6 nodes that stays pending.
  ASSERT_EQ(rpc_.Step({VerifyPart{41, model_.RandomParents(6), std::nullopt}}, false), "");

  auto list = client_->ListSequences();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_FALSE(list->truncated());
  EXPECT_EQ(list->total_sequences(), 3u);
  ASSERT_EQ(list->sequences_size(), 3);
  EXPECT_EQ(list->sequences(0).sequence_id(), 8u);
  EXPECT_EQ(list->sequences(1).sequence_id(), 40u);
  EXPECT_EQ(list->sequences(2).sequence_id(), 41u);
  const v1::SequenceInfo& s8 = list->sequences(0);
  EXPECT_EQ(s8.committed_length(), 12u);
  EXPECT_EQ(s8.pending_tree_nodes(), 0u);
  EXPECT_EQ(s8.shared_tokens(), 0u);
  const v1::SequenceInfo& s40 = list->sequences(1);
  EXPECT_EQ(s40.committed_length(), 16u);
  EXPECT_EQ(s40.shared_tokens(), 10u);
  const v1::SequenceInfo& s41 = list->sequences(2);
  EXPECT_EQ(s41.committed_length(), 10u);
  EXPECT_EQ(s41.pending_tree_nodes(), 6u);
  EXPECT_EQ(s41.shared_tokens(), 10u);
  for (const v1::SequenceInfo& info : list->sequences()) {
    SCOPED_TRACE(info.sequence_id());
    EXPECT_GE(info.idle_seconds(), 0.0);
    EXPECT_LT(info.idle_seconds(), 30.0);
    EXPECT_NEAR(info.idle_seconds() + info.lease_remaining_seconds(), options_.lease_seconds, 1e-3);
  }
  // Paging by hand: after 8, at most one.
  auto page = client_->ListSequences(8, 1);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->sequences_size(), 1);
  EXPECT_EQ(page->sequences(0).sequence_id(), 40u);
  EXPECT_TRUE(page->truncated());
  // Releasing 40 leaves 41's prefix its own.
  ASSERT_TRUE(rpc_.Release(40).ok());
  list = client_->ListSequences();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_NE(Find(*list, 41), nullptr);
  EXPECT_EQ(Find(*list, 41)->shared_tokens(), 0u);
  EXPECT_EQ(Find(*list, 40), nullptr);
}

// 1100 sequences under a 64 KiB message bound: a page asking for 5000 gets the most that fit
// (MaxListedSequences), marked truncated, within the bound; ListAllSequences pages through all.
TEST_F(ListSequencesTest, APageFitsTheMessageBoundAndPagingReachesEveryId) {
  std::mt19937_64 rng(test::TestSeed());
  std::vector<uint64_t> ids;
  while (ids.size() < 1100) {
    const uint64_t id = rng();
    if (std::find(ids.begin(), ids.end(), id) != ids.end()) continue;
    ids.push_back(id);
    ASSERT_TRUE(rpc_.Append(model_.MakeAppend(id, 1)).ok());
  }
  std::sort(ids.begin(), ids.end());
  const int64_t cap =
      MaxListedSequences(ValidationLimits{.max_message_bytes = options_.max_message_bytes});
  ASSERT_EQ(cap, 1023);
  auto page = client_->ListSequences(std::nullopt, 5000);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->sequences_size(), cap);
  EXPECT_TRUE(page->truncated());
  EXPECT_EQ(page->total_sequences(), 1100u);
  EXPECT_LE(static_cast<int64_t>(page->ByteSizeLong()), options_.max_message_bytes);
  EXPECT_EQ(page->sequences(0).sequence_id(), ids[0]);
  EXPECT_EQ(page->sequences(cap - 1).sequence_id(), ids[cap - 1]);

  auto all = client_->ListAllSequences();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_FALSE(all->truncated());
  ASSERT_EQ(all->sequences_size(), 1100);
  for (int i = 0; i < 1100; ++i) {
    ASSERT_EQ(all->sequences(i).sequence_id(), ids[i]) << i;
    EXPECT_EQ(all->sequences(i).committed_length(), 1u);
  }
}

class ListSequencesLeaseTest : public ListSequencesTest {
 protected:
  static ServiceOptions ShortLease() {
    ServiceOptions o = Options();
    o.lease_seconds = 0.6;
    return o;
  }
  ListSequencesLeaseTest() : ListSequencesTest(ShortLease()) {}
};

// Listing is read-only: a sequence nobody else names expires although it is listed all along.
TEST_F(ListSequencesLeaseTest, ListingRenewsNoLease) {
  ASSERT_TRUE(rpc_.Append(model_.MakeAppend(3, 4)).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool seen_idle = false;
  for (;;) {
    auto list = client_->ListSequences();
    ASSERT_TRUE(list.ok()) << list.status();
    if (list->sequences_size() == 0) break;
    seen_idle = seen_idle || list->sequences(0).idle_seconds() > 0.3;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "listing kept the lease alive";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(seen_idle) << "idle_seconds never grew";
  EXPECT_EQ(rpc_.Stats().fragmentation().sequences(), 0u);
}

}  // namespace
}  // namespace verifyd
