// Fork through the whole request path (in-process server, Unix socket, raw stub): Verify over
// forks, forks of forks, a parent released before its forks, compaction while verifying, against
// the float64 reference of the shadow model for every output element; bad forks refused with
// nothing changed; 64 forks of one prefix take the memory of one prefix plus their suffixes.
// plans/0019-shared-prefixes.md.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "gtest/gtest.h"
#include "tests/service/rpc_helpers.h"
#include "tests/service/shadow_model.h"
#include "tests/service/test_server.h"
#include "tests/testing/test_seed.h"

namespace verifyd {
namespace {

using testing::RpcDriver;
using testing::ShadowModel;
using testing::VerifyPart;

class ForkServerTest : public ::testing::Test {
 protected:
  ForkServerTest()
      : options_(testing::SmallOptions("fork")),
        server_(options_),
        seed_(Seed()),
        model_(options_.layers, options_.heads, options_.softmax_scale, seed_),
        rpc_(server_.stub(), model_) {}

  // VERIFYD_TEST_SEED reproduces a run; otherwise a fresh one, printed.
  static uint32_t Seed() { return static_cast<uint32_t>(test::TestSeed()); }
  void SetUp() override {
    std::cout << "reproduce with VERIFYD_TEST_SEED=" << seed_ << "\n";
    ASSERT_TRUE(server_.status().ok()) << server_.status();
  }

  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(model_.rng()); }

  // A new random tree for `sequence`, riding the commit of its pending tree if any.
  VerifyPart NextPart(uint64_t sequence) {
    VerifyPart part;
    part.sequence = sequence;
    part.parents = model_.RandomParents(Uniform(1, 10));
    if (model_.has_tree(sequence)) {
      part.commit_previous = model_.RandomPath(model_.sequences().at(sequence).parents);
    }
    return part;
  }
  std::string StepAll(const std::vector<uint64_t>& sequences, bool lse) {
    std::vector<VerifyPart> parts;
    for (uint64_t s : sequences) parts.push_back(NextPart(s));
    return rpc_.Step(parts, lse);
  }
  // Commits (alone) every pending tree, so that sequences can be forked.
  void CommitAll() {
    std::vector<uint64_t> ids;
    for (const auto& [id, s] : model_.sequences()) ids.push_back(id);
    for (uint64_t id : ids) {
      if (!model_.has_tree(id)) continue;
      ASSERT_TRUE(rpc_.Commit(id, model_.RandomPath(model_.sequences().at(id).parents)).ok());
    }
  }
  // Polls the operation started last (or starts one) until DONE; returns its final status.
  v1::CompactionStatus CompactUntilDone() {
    v1::CompactionStatus status;
    CompactUntilDoneInto(status);
    return status;
  }
  void CompactUntilDoneInto(v1::CompactionStatus& status) {
    v1::CompactResponse started;
    {
      grpc::ClientContext context;
      ASSERT_TRUE(server_.stub().Compact(&context, v1::CompactRequest(), &started).ok());
    }
    ASSERT_TRUE(testing::WaitForCompaction(server_.stub(), started.operation_id(),
                                           std::chrono::seconds(30), &status)
                    .ok());
    ASSERT_NE(status.state(), v1::CompactionStatus::FAILED) << status.error();
    ASSERT_EQ(status.state(), v1::CompactionStatus::DONE);
  }

  ServiceOptions options_;
  testing::TestServer server_;
  uint32_t seed_;
  ShadowModel model_;
  RpcDriver rpc_;
};

TEST_F(ForkServerTest, VerifyOverForksMatchesTheReferenceThroughReleaseAndCompaction) {
  // The parent's prefill is interleaved with another sequence's, so the shared prefix is
  // fragmented and compaction has shared runs to move.
  for (int chunk = 0; chunk < 5; ++chunk) {
    ASSERT_TRUE(rpc_.Append(model_.MakeAppend(1, Uniform(5, 12))).ok());
    ASSERT_TRUE(rpc_.Append(model_.MakeAppend(9, Uniform(2, 6))).ok());
  }
  ASSERT_TRUE(rpc_.Release(9).ok());  // holes for compaction to fill
  ASSERT_EQ(StepAll({1}, true), "");
  CommitAll();

  const int64_t n1 = model_.committed_length(1);
  const int64_t k2 = Uniform(1, static_cast<int>(n1));
  const v1::StatsResponse before = rpc_.Stats();
  v1::ForkResponse forked;
  ASSERT_TRUE(rpc_.Fork(1, 2, k2, &forked).ok());
  EXPECT_EQ(static_cast<int64_t>(forked.committed_length()), k2);
  ASSERT_TRUE(rpc_.Fork(1, 3, n1).ok());  // the whole parent
  // No slot was allocated: the forks hold the parent's slots.
  const v1::StatsResponse after = rpc_.Stats();
  EXPECT_EQ(after.used_tokens(), before.used_tokens());
  EXPECT_EQ(static_cast<int64_t>(after.shared_tokens()), n1);
  EXPECT_EQ(static_cast<int64_t>(after.shared_references()), 3 * k2 + 2 * (n1 - k2));
  EXPECT_EQ(after.fragmentation().tokens(), before.fragmentation().tokens());
  EXPECT_EQ(after.fragmentation().sequences(), 3u);

  // Parent and forks grow on their own; every output element against the reference.
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    ASSERT_EQ(StepAll({1, 2, 3}, step % 2 == 0), "");
  }
  CommitAll();
  // A fork of a fork, possibly reaching into the first fork's own suffix.
  const int64_t k4 = Uniform(1, static_cast<int>(model_.committed_length(2)));
  ASSERT_TRUE(rpc_.Fork(2, 4, k4).ok());
  for (int step = 0; step < 2; ++step) ASSERT_EQ(StepAll({1, 2, 3, 4}, true), "");

  // The parent goes first: its forks keep the prefix.
  CommitAll();
  ASSERT_TRUE(rpc_.Release(1).ok());
  ASSERT_EQ(StepAll({2, 3, 4}, true), "");

  // Compaction moves shared runs while Verify traffic continues.
  const v1::StatsResponse fragmented = rpc_.Stats();
  {
    v1::CompactResponse started;
    grpc::ClientContext context;
    ASSERT_TRUE(server_.stub().Compact(&context, v1::CompactRequest(), &started).ok());
  }
  for (int step = 0; step < 3; ++step) ASSERT_EQ(StepAll({2, 3, 4}, step == 1), "");
  // Operations after the traffic until one finds nothing to move (an operation "until converged"
  // stops at twice its first plan's bytes): then every accounted list is one run.
  v1::CompactionStatus done = CompactUntilDone();
  for (int more = 0; more < 8 && done.tokens_moved() > 0; ++more) done = CompactUntilDone();
  ASSERT_EQ(done.state(), v1::CompactionStatus::DONE);
  EXPECT_EQ(done.tokens_moved(), 0u);
  EXPECT_EQ(done.after().tokens_outside_first_run(), 0u);
  // At most one run each: a fork whose every commit was empty accounts no position at all.
  EXPECT_LE(done.after().runs(), done.after().sequences());
  for (int step = 0; step < 2; ++step) ASSERT_EQ(StepAll({2, 3, 4}, true), "");
  const v1::StatsResponse compacted = rpc_.Stats();
  EXPECT_EQ(compacted.used_tokens() - compacted.pending_tokens(),
            compacted.fragmentation().tokens());
  std::cout << "before compaction: runs " << fragmented.fragmentation().runs() << ", ratio "
            << fragmented.fragmentation().fragmented_ratio() << "; converged: runs "
            << done.after().runs() << ", ratio " << done.after().fragmented_ratio()
            << "; two steps later: runs " << compacted.fragmentation().runs() << "\n";

  // Release the rest in random order, verifying the survivors each time; nothing leaks.
  std::vector<uint64_t> left = {2, 3, 4};
  std::shuffle(left.begin(), left.end(), model_.rng());
  while (!left.empty()) {
    ASSERT_TRUE(rpc_.Release(left.back()).ok());
    left.pop_back();
    if (!left.empty()) ASSERT_EQ(StepAll(left, true), "");
  }
  const v1::StatsResponse empty = rpc_.Stats();
  EXPECT_EQ(empty.used_tokens(), 0u);
  EXPECT_EQ(empty.free_tokens(), empty.capacity_tokens());
  EXPECT_EQ(empty.shared_tokens(), 0u);
  EXPECT_EQ(empty.shared_references(), 0u);
}

TEST_F(ForkServerTest, BadForksAreRefusedNamingTheFieldAndChangeNothing) {
  ASSERT_TRUE(rpc_.Append(model_.MakeAppend(1, 20)).ok());
  ASSERT_TRUE(rpc_.Append(model_.MakeAppend(2, 7)).ok());
  // Sequence 2 gets a pending tree (verified on layer 0 only).
  {
    std::string mismatch;
    ASSERT_TRUE(rpc_.Verify(model_.MakeVerify(0, {NextPart(2)}, false), &mismatch).ok());
    ASSERT_EQ(mismatch, "");
  }
  struct Case {
    uint64_t source, fork, length;
    grpc::StatusCode code;
    const char* message;
  } cases[] = {
      {77, 5, 3, grpc::StatusCode::NOT_FOUND, "source_sequence_id = 77 is not a live sequence"},
      {2, 5, 3, grpc::StatusCode::FAILED_PRECONDITION, "source_sequence_id = 2 has a pending tree"},
      {1, 5, 21, grpc::StatusCode::OUT_OF_RANGE,
       "length = 21 must be <= the committed length 20 of source_sequence_id = 1"},
      {1, 2, 3, grpc::StatusCode::ALREADY_EXISTS, "new_sequence_id = 2 is already a live"},
      {1, 5, 0, grpc::StatusCode::INVALID_ARGUMENT, "length = 0 must be in [1, 2147483647]"},
      {1, 1, 3, grpc::StatusCode::INVALID_ARGUMENT,
       "new_sequence_id = 1 must differ from source_sequence_id"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    const std::string stats_before = rpc_.Stats().SerializeAsString();
    v1::ForkRequest request;
    request.set_source_sequence_id(c.source);
    request.set_new_sequence_id(c.fork);
    request.set_length(c.length);
    v1::ForkResponse response;
    grpc::ClientContext context;
    const grpc::Status status = server_.stub().Fork(&context, request, &response);
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    EXPECT_NE(status.error_message().find(c.message), std::string::npos) << status.error_message();
    EXPECT_EQ(rpc_.Stats().SerializeAsString(), stats_before);
  }
  // No sequence 5 was created, and 1 and 2 answer as before: 2's tree on its other layers, then
  // a step of both.
  EXPECT_EQ(rpc_.Release(5).error_code(), grpc::StatusCode::NOT_FOUND);
  for (int layer = 1; layer < options_.layers; ++layer) {
    const VerifyPart same{2, model_.sequences().at(2).parents, std::nullopt};
    std::string mismatch;
    ASSERT_TRUE(rpc_.Verify(model_.MakeVerify(layer, {same}, true), &mismatch).ok());
    ASSERT_EQ(mismatch, "");
  }
  ASSERT_EQ(StepAll({1, 2}, true), "");
}

TEST_F(ForkServerTest, SixtyFourForksOfOnePrefixTakeOnePrefixPlusTheSuffixes) {
  constexpr int kPrefix = 1500, kForks = 64, kSuffix = 8;
  for (int done = 0; done < kPrefix; done += 500) {
    ASSERT_TRUE(rpc_.Append(model_.MakeAppend(1, 500)).ok());
  }
  const v1::StatsResponse before = rpc_.Stats();
  for (uint64_t f = 0; f < kForks; ++f) {
    ASSERT_TRUE(rpc_.Fork(1, 100 + f, kPrefix).ok());
    ASSERT_TRUE(rpc_.Append(model_.MakeAppend(100 + f, kSuffix)).ok());
  }
  const v1::StatsResponse after = rpc_.Stats();
  std::cout << "one prefix of " << kPrefix << ": used " << before.used_tokens() << ", shared "
            << before.shared_tokens() << "\n"
            << kForks << " forks + " << kSuffix << "-token suffixes: used " << after.used_tokens()
            << " (without sharing " << (kForks + 1) * kPrefix + kForks * kSuffix << "), shared "
            << after.shared_tokens() << ", references " << after.shared_references()
            << ", committed tokens " << after.fragmentation().tokens() << ", runs "
            << after.fragmentation().runs() << "\n";
  EXPECT_EQ(before.used_tokens(), static_cast<uint64_t>(kPrefix));
  EXPECT_EQ(after.used_tokens(), static_cast<uint64_t>(kPrefix + kForks * kSuffix));
  EXPECT_EQ(after.shared_tokens(), static_cast<uint64_t>(kPrefix));
  EXPECT_EQ(after.shared_references(), static_cast<uint64_t>((kForks + 1) * kPrefix));
  EXPECT_EQ(after.fragmentation().tokens(), after.used_tokens());
  EXPECT_EQ(after.fragmentation().sequences(), static_cast<uint64_t>(kForks + 1));
  // Each suffix is one run right after the previous one: nothing to compact.
  EXPECT_EQ(after.fragmentation().runs(), static_cast<uint64_t>(kForks + 1));
  EXPECT_EQ(after.fragmentation().tokens_outside_first_run(), 0u);
  // The forks answer as sequences of their own (a few, against the float64 reference).
  ASSERT_EQ(StepAll({100, 100 + kForks / 2, 100 + kForks - 1}, true), "");
}

// Issue 33 N2 through the daemon: its flags bound the live sequences and the slot tables' entries;
// a Fork past either is RESOURCE_EXHAUSTED naming the flag, and changes nothing.
TEST(ForkBoundsTest, ForksPastTheDaemonsBoundsAreRefusedNamingTheFlag) {
  ServiceOptions options = testing::SmallOptions("fork-bounds");
  options.max_sequences = 4;
  options.max_slot_table_entries = 100;
  testing::TestServer server(options);
  ASSERT_TRUE(server.status().ok()) << server.status();
  ShadowModel model(options.layers, options.heads, options.softmax_scale,
                    static_cast<uint32_t>(test::TestSeed()));
  RpcDriver rpc(server.stub(), model);
  ASSERT_TRUE(rpc.Append(model.MakeAppend(1, 30)).ok());
  ASSERT_TRUE(rpc.Fork(1, 2, 30).ok());
  ASSERT_TRUE(rpc.Fork(1, 3, 30).ok());
  {
    const std::string stats_before = rpc.Stats().SerializeAsString();
    const grpc::Status status = rpc.Fork(1, 4, 30);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    EXPECT_NE(status.error_message().find("new_sequence_id = 4: 30 more slot-table entries would "
                                          "make 120, past --max-slot-table-entries = 100"),
              std::string::npos)
        << status.error_message();
    EXPECT_EQ(rpc.Stats().SerializeAsString(), stats_before);
  }
  ASSERT_TRUE(rpc.Fork(1, 4, 10).ok());
  const std::string stats_before = rpc.Stats().SerializeAsString();
  const grpc::Status fifth = rpc.Fork(1, 5, 1);
  EXPECT_EQ(fifth.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << fifth.error_message();
  EXPECT_NE(fifth.error_message().find(
                "new_sequence_id = 5 would be live sequence 5, past --max-sequences = 4"),
            std::string::npos)
      << fifth.error_message();
  EXPECT_EQ(rpc.Stats().SerializeAsString(), stats_before);
  // Released forks give their room back.
  ASSERT_TRUE(rpc.Release(2).ok());
  EXPECT_TRUE(rpc.Fork(1, 5, 30).ok());
}

}  // namespace
}  // namespace verifyd
